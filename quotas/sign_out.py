"""Signing a user out everywhere: every session they hold and every personal token, at once. Asked for by the user
(the account page, the API), and done on every change of their password, whoever changes it: a token or a
session someone else took keeps no access past a new password."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import import_module

from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from quotas.models import ApiToken

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SignedOut:
    sessions_ended: int
    tokens_revoked: int


def _sessions_end(user: AbstractBaseUser) -> int:
    """End the user's sessions. They are found by reading the live ones (sessions are not indexed by user), which
    the database engines allow (the portal's is `db`); `delete` through the engine's store also drops a cached
    copy (`cached_db`)."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    if not hasattr(store, "get_model_class"):  # cache or signed cookies: nothing to list
        log.warning(
            "sessions of user %s not ended: %s cannot list sessions", user.pk, settings.SESSION_ENGINE
        )
        return 0
    rows = store.get_model_class().objects.filter(expire_date__gt=timezone.now())
    reader, user_id = store(), str(user.pk)
    keys = [
        key
        for key, data in rows.values_list("session_key", "session_data").iterator()
        if str(reader.decode(data).get(SESSION_KEY)) == user_id
    ]
    for key in keys:
        store(session_key=key).delete()
    return len(keys)


def user_sign_out_everywhere(*, user: AbstractBaseUser, why: str) -> SignedOut:
    """End every session of `user` and revoke every live personal token; logged (who, why, how many)."""
    tokens = ApiToken.objects.filter(user=user, revoked_at__isnull=True).update(revoked_at=timezone.now())
    # A user who never signed in has no session to look for (user creation sets a password too).
    sessions = _sessions_end(user) if user.last_login is not None else 0
    if sessions or tokens or user.last_login is not None:  # not the password a new account is created with
        log.info(
            "signed out everywhere: user %s (id %s), %s; %d sessions ended, %d tokens revoked",
            user.get_username(),
            user.pk,
            why,
            sessions,
            tokens,
        )
    return SignedOut(sessions_ended=sessions, tokens_revoked=tokens)


class SignOutOnPasswordChange:
    """In AUTH_PASSWORD_VALIDATORS for its `password_changed` hook, which Django calls on every saved change of a
    password (the portal's form, the admin's reset, `manage.py changepassword`, any `set_password` then `save`):
    the user is signed out everywhere. It refuses no password. The portal's form then keeps its own browser
    signed in (Django's `update_session_auth_hash`)."""

    def validate(self, password: str, user: AbstractBaseUser | None = None) -> None:
        return None

    def password_changed(self, password: str, user: AbstractBaseUser | None = None) -> None:
        if user is not None and user.pk is not None:
            user_sign_out_everywhere(user=user, why="password changed")

    def get_help_text(self) -> str:
        return "A new password ends every other session and revokes every personal API token."
