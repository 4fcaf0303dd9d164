"""The API's own refusal: a message with the field and the limit it is about (portal.api_support renders it)."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, status


class ApiError(exceptions.APIException):
    """An error with a field and a limit, raised by views for refusals that are not a service's."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "invalid",
        field: str | None = None,
        limit: Any = None,
        status_code: int = status.HTTP_400_BAD_REQUEST,
    ):
        super().__init__(detail=message, code=code)
        self.status_code = status_code
        self.field = field
        self.limit = limit
        self.error_code = code
