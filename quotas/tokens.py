"""Personal API tokens: issue (shown once), authenticate by hash, revoke."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from quotas.models import ApiToken

TOKEN_PREFIX = "tsk_"
MAX_TOKENS_PER_USER = 50
# Recording every use would turn each API read into a write; once a minute is enough to spot stale tokens.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class TokenLimitReached(Exception):
    pass


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def api_token_create(*, user: AbstractBaseUser, name: str) -> tuple[ApiToken, str]:
    """Issue a token; returns the row and the token itself, which is never stored and never shown again."""
    if ApiToken.objects.filter(user=user, revoked_at__isnull=True).count() >= MAX_TOKENS_PER_USER:
        raise TokenLimitReached(
            f"A user may hold at most {MAX_TOKENS_PER_USER} live tokens; revoke one first."
        )
    token = f"{TOKEN_PREFIX}{secrets.token_urlsafe(32)}"
    row = ApiToken.objects.create(user=user, name=name, prefix=token[:12], token_hash=token_hash(token))
    return row, token


def api_token_revoke(*, token: ApiToken) -> ApiToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


def api_token_authenticate(*, token: str) -> ApiToken | None:
    """The live token row for this secret (with its user), or None."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    row = (
        ApiToken.objects.select_related("user")
        .filter(token_hash=token_hash(token), revoked_at__isnull=True)
        .first()
    )
    if row is None or not row.user.is_active:
        return None
    now = timezone.now()
    if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
        row.last_used_at = now
    return row
