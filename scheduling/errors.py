"""The refusal every service raises: a message naming the field at fault, for API errors and forms."""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """A refused write. `field` names the input at fault, for API errors and forms; `limit` is the bound it broke,
    when there is one."""

    def __init__(self, message: str, *, field: str | None = None, code: str = "invalid", limit: Any = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.code = code
        self.limit = limit
