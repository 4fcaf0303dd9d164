"""`Authorization: Bearer <token>` for scripts and the CLI; browsers keep using the session."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from quotas.tokens import api_token_authenticate


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Give the token as 'Authorization: Bearer <token>'.")
        try:
            token = header[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("The token is not valid text.") from None
        row = api_token_authenticate(token=token)
        if row is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked token.")
        return row.user, row

    def authenticate_header(self, request: Any) -> str:
        # Makes DRF answer 401 (not 403) to unauthenticated requests.
        return self.keyword


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "quotas.api.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "A personal API token (tsk_...)."}
