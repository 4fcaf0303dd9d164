"""Personal API tokens: issue (shown once), authenticate by hash, revoke."""

from __future__ import annotations

import functools
import hashlib
import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection
from django.utils import timezone

from portal.database import model_from_row
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


@functools.cache
def _token_query() -> tuple[str, list, list]:
    token_fields = list(ApiToken._meta.concrete_fields)
    user_model = get_user_model()
    user_fields = list(user_model._meta.concrete_fields)
    columns = [f"t.{f.column}" for f in token_fields] + [f"u.{f.column}" for f in user_fields]
    sql = (
        f"SELECT {', '.join(columns)} FROM {ApiToken._meta.db_table} AS t "
        f"JOIN {user_model._meta.db_table} AS u ON u.{user_model._meta.pk.column} = t.user_id "
        "WHERE t.token_hash = %s AND t.revoked_at IS NULL"
    )
    return sql, token_fields, user_fields


def _live_token_with_user(digest: str) -> ApiToken | None:
    """The unrevoked token row with this hash, its user loaded. Every API call does this, so it is one
    hand-written query (the ORM's select_related costs several times the database's work here)."""
    sql, token_fields, user_fields = _token_query()
    with connection.cursor() as cursor:
        cursor.execute(sql, [digest])
        values = cursor.fetchone()
    if values is None:
        return None
    row = model_from_row(ApiToken, token_fields, values[: len(token_fields)])
    row.user = model_from_row(get_user_model(), user_fields, values[len(token_fields) :])
    return row


def api_token_authenticate(*, token: str) -> ApiToken | None:
    """The live token row for this secret (with its user), or None."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    row = _live_token_with_user(token_hash(token))
    if row is None or not row.user.is_active:
        return None
    now = timezone.now()
    if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
        row.last_used_at = now
    return row
