"""One log line format for every Tessera process: the portal (daphne or gunicorn), the Celery worker and beat, and
the node agent. Standard library only: the agent imports no Django, and the portal's LOGGING names these classes.

Text (the default): `2026-12-01T19:21:28.130Z INFO tessera.agent [node=a100-01]: message`, the context in brackets
only where there is some. `LOG_FORMAT=json`: one JSON object per line with `ts` (ISO-8601, UTC), `level`,
`logger`, `message`, the context fields that apply (`request_id`, `job_id`, `node`) and `exc` for a traceback.

The context comes from the record (`log.info(..., extra={"job_id": job.pk})`) or, for the request id, from a
context variable the portal's middleware sets (`ContextFilter`, on the handlers).
"""

from __future__ import annotations

import contextvars
import json
import logging
from datetime import UTC, datetime

CONTEXT_FIELDS = ("request_id", "job_id", "node")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(context)s: %(message)s"

# The id of the HTTP request being handled, in this thread or task (portal.logs.RequestIdMiddleware sets it).
request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tessera_request_id", default=None
)


def iso_utc(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record_context(record: logging.LogRecord) -> dict[str, object]:
    return {
        field: value
        for field in CONTEXT_FIELDS
        if (value := getattr(record, field, None)) is not None and value != ""
    }


class ContextFilter(logging.Filter):
    """Puts the current request id on every record (unless the record names its own), and optionally a fixed
    node name (the agent's). Never drops a record."""

    def __init__(self, name: str = "", node: str | None = None) -> None:
        super().__init__(name)
        self.node = node

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id_var.get()
        if self.node and getattr(record, "node", None) is None:
            record.node = self.node
        return True


class TextFormatter(logging.Formatter):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(fmt=TEXT_FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - stdlib
        return iso_utc(record.created)

    def format(self, record: logging.LogRecord) -> str:
        context = record_context(record)
        record.context = f" [{' '.join(f'{k}={v}' for k, v in context.items())}]" if context else ""
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line (a traceback is a field, never more lines)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **record_context(record),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def formatter_for(log_format: str) -> logging.Formatter:
    """The formatter for LOG_FORMAT (`text` or `json`; anything else is text)."""
    return JsonFormatter() if log_format.strip().lower() == "json" else TextFormatter()


def configure(
    *, level: str | int, log_format: str, handlers: list[logging.Handler], node: str | None = None
) -> None:
    """Give the root logger these handlers, each with the format and the context filter (the agent's setup)."""
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    context = ContextFilter(node=node)
    for handler in handlers:
        handler.setFormatter(formatter_for(log_format))
        handler.addFilter(context)
        root.addHandler(handler)
    root.setLevel(level)
