"""Logging filters of the portal's processes (wired in settings.LOGGING)."""

from __future__ import annotations

import logging


class RefusalWithoutTraceback(logging.Filter):
    """A refusal the portal meant (403 for PermissionDenied, 400 for a bad request) is logged by Django as a warning
    with the exception's traceback. That traceback is no fault and buries real ones: keep the line, drop the trace.
    A 5xx keeps its traceback. Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and status < 500:
            record.exc_info = None
            record.exc_text = None
        return True
