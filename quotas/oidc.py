"""Sign-in through the site's OpenID Connect provider (Keycloak, Okta, Entra ID...), with mozilla-django-oidc: the
browser's authorization code flow with PKCE, and the CLI's device flow, whose tokens the portal exchanges for a
personal API token. Claims map as LDAP's attributes do (quotas/directory.py): the username, names and e-mail, the
groups (teams, staff) and the Unix account. docs/operations.md, "Sign-in", has the settings."""

from __future__ import annotations

import logging
import time
from typing import Any

import requests
from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from quotas.choices import DirectorySource
from quotas.directory import DirectoryUser, directory_sign_in, group_names

log = logging.getLogger(__name__)

CLOCK_SKEW_S = 60  # an ID token's times are the provider's clock: this much disagreement is tolerated


def oidc_enabled() -> bool:
    return bool(settings.OIDC_RP_CLIENT_ID)


def cli_sso_enabled() -> bool:
    """Whether `tessera login --sso` can sign in here: a provider, and a client of it for the CLI."""
    return oidc_enabled() and bool(settings.TESSERA_OIDC_CLI_CLIENT_ID)


def _audiences(payload: dict[str, Any]) -> set[str]:
    aud = payload.get("aud")
    return {aud} if isinstance(aud, str) else {a for a in aud or [] if isinstance(a, str)}


class DirectoryOIDCBackend(OIDCAuthenticationBackend):
    """Users from the provider's claims: found by their subject (`sub`) once they have signed in, else by the
    username claim; made on their first sign-in; their teams, staff flag and Unix account brought to the claims at
    every sign-in."""

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        if not oidc_enabled():
            return None
        return super().authenticate(request, **kwargs)

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        """The ID token's signature (the provider's keys) and nonce, and what mozilla-django-oidc leaves to us: it
        was issued by the provider, for this client (or `audience`: the CLI's), and has not expired."""
        audience = kwargs.pop("audience", settings.OIDC_RP_CLIENT_ID)
        payload = super().verify_token(token, **kwargs)
        issuer = settings.TESSERA_OIDC_ISSUER
        if issuer and payload.get("iss") != issuer:
            raise SuspiciousOperation(f"ID token issued by {payload.get('iss')!r}, not {issuer!r}")
        if audience not in _audiences(payload):
            raise SuspiciousOperation(f"ID token for {sorted(_audiences(payload))}, not {audience!r}")
        expires = payload.get("exp")
        if not isinstance(expires, int | float) or expires + CLOCK_SKEW_S < time.time():
            raise SuspiciousOperation("ID token expired")
        return payload

    def _username(self, claims: dict[str, Any]) -> str:
        value = claims.get(settings.TESSERA_OIDC_USERNAME_CLAIM)
        return value.strip().lower()[:150] if isinstance(value, str) else ""

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return bool(claims.get("sub")) and bool(self._username(claims))

    def filter_users_by_claims(self, claims: dict[str, Any]) -> Any:
        users = self.UserModel.objects.filter(
            directory_account__source=DirectorySource.OIDC, directory_account__subject=str(claims["sub"])
        )
        if users.exists():
            return users
        # The first sign-in of this subject: the account of the same name, unless another subject (or the LDAP
        # directory) already holds it; a username the provider lets people choose cannot take someone's account.
        return self.UserModel.objects.filter(
            username__iexact=self._username(claims), directory_account__isnull=True
        )

    def create_user(self, claims: dict[str, Any]) -> Any:
        username = self._username(claims)
        if self.UserModel.objects.filter(username__iexact=username).exists():
            raise SuspiciousOperation(
                f"the username {username!r} belongs to an account another sign-in holds"
            )
        user = self.UserModel(username=username)
        user.set_unusable_password()
        return self.update_user(user, claims)

    def update_user(self, user: Any, claims: dict[str, Any]) -> Any:
        user.first_name = str(claims.get("given_name") or "")[:150]
        user.last_name = str(claims.get("family_name") or "")[:150]
        user.email = str(claims.get("email") or "")[:254]
        user.save()
        groups = claims.get(settings.TESSERA_OIDC_GROUPS_CLAIM) or []
        unix_claim = settings.TESSERA_OIDC_UNIX_ACCOUNT_CLAIM
        directory_sign_in(
            user=user,
            directory=DirectoryUser(
                source=DirectorySource.OIDC,
                subject=str(claims["sub"]),
                groups=group_names(groups if isinstance(groups, list) else []),
                unix_account=str(claims.get(unix_claim) or "") if unix_claim else "",
            ),
        )
        return user

    def user_from_device_tokens(self, *, id_token: str, access_token: str) -> Any:
        """The user whom the CLI's device flow signed in, or None (refused). The tokens must be the CLI client's:
        its ID token checked as issued to it (Keycloak, Okta and Entra ID give one), or, from a provider that gives
        none, its access token checked by introspection; the claims are read with the access token."""
        cli_client = settings.TESSERA_OIDC_CLI_CLIENT_ID
        try:
            if id_token:
                payload = self.verify_token(id_token, audience=cli_client, nonce=None)
            else:
                payload = self._introspected(access_token, client_id=cli_client)
            claims = self.get_userinfo(access_token, id_token, payload)
        except Exception as exc:  # noqa: BLE001 - a token that does not verify, whatever the reason, is refused
            log.warning("CLI sign-in refused: %s", exc)
            return None
        if "sub" in payload and str(claims.get("sub")) != str(payload["sub"]):
            log.warning("CLI sign-in refused: the access token is not the ID token's subject's")
            return None
        try:
            return self.get_or_create_user(access_token, id_token, payload)
        except SuspiciousOperation as exc:
            log.warning("CLI sign-in refused: %s", exc)
            return None

    def _introspected(self, access_token: str, *, client_id: str) -> dict[str, Any]:
        """RFC 7662: the provider says the access token is live and was issued to `client_id` (the portal asks
        with its own client's credentials)."""
        endpoint = settings.TESSERA_OIDC_INTROSPECTION_ENDPOINT
        if not endpoint:
            raise SuspiciousOperation(
                "the provider gave no ID token, and no introspection endpoint is configured to check the access token"
            )
        answer = requests.post(
            endpoint,
            data={"token": access_token, "token_type_hint": "access_token"},
            auth=(settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET),
            timeout=settings.OIDC_TIMEOUT,
        )
        answer.raise_for_status()
        token = answer.json()
        if token.get("active") is not True:
            raise SuspiciousOperation("the access token is not active")
        if token.get("client_id") != client_id:
            raise SuspiciousOperation(
                f"the access token was issued to {token.get('client_id')!r}, not {client_id!r}"
            )
        return {}

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        # get_or_create_user asks again for what user_from_device_tokens has just read: one request, not two.
        cached = getattr(self, "_userinfo", None)
        if cached is not None and cached[0] == access_token:
            return cached[1]
        claims = super().get_userinfo(access_token, id_token, payload)
        self._userinfo = (access_token, claims)
        return claims


class _OnlyWithAProvider:
    """A view of the sign-on flow: 404 where no provider is configured."""

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not oidc_enabled():
            raise Http404("No single sign-on provider is configured.")
        return super().dispatch(request, *args, **kwargs)


class SignInStart(_OnlyWithAProvider, OIDCAuthenticationRequestView):
    """/oidc/sign-in/: off to the provider."""


class SignInCallback(_OnlyWithAProvider, OIDCAuthenticationCallbackView):
    """/oidc/callback/: back from the provider, signed in (or to the sign-in page, which says it failed)."""
