"""Refusals of quota writes: a message naming the field at fault and the bound it broke.

Like `scheduling.errors.ServiceError`, but here because `quotas` sits below `scheduling` and may not import it;
the API's error handler (`portal.api_support`) answers both in the same format.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied


class QuotaRefused(Exception):
    """A refused quota change. `field` names the input at fault; `limit` the bound it broke, when there is one."""

    status_code = 400

    def __init__(self, message: str, *, field: str | None = None, code: str = "invalid", limit: Any = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.code = code
        self.limit = limit


class QuotaForbidden(QuotaRefused, PermissionDenied):
    """The actor may not make this change (a team admin of another team, a team admin raising a guarantee).
    A PermissionDenied, so a page raising it answers 403."""

    status_code = 403

    def __init__(self, message: str, *, field: str | None = None, limit: Any = None):
        super().__init__(message, field=field, code="forbidden", limit=limit)


class QuotaConflict(QuotaRefused):
    """The quota changed since the change was based on it (an undo of an edit that was edited again since)."""

    status_code = 409

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message, field=field, code="conflict")
