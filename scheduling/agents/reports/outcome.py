"""The answer to one report (`Outcome`), and the text every report's writes pass through (`db_text`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """The answer to one report: accepted or not, and why (sent back in the ack). `retry`: not refused, the portal
    failed to handle it (a database error): the agent keeps the report and sends it again shortly. `stale`: refused
    as expected, about a placement the portal has moved on from (an agent back after its jobs were fenced and
    requeued): the agent drops it, and it is no error of the node's."""

    ok: bool
    error: str | None = None
    changed: bool = False
    retry: bool = False
    stale: bool = False


def db_text(value: Any) -> str:
    """A string PostgreSQL takes into text and JSON: NUL (which it refuses, and which a job's output may well
    hold) shown as U+2400, lone surrogates (which pass JSON decoding) replaced."""
    return str(value).replace("\0", "\u2400").encode("utf-8", "replace").decode("utf-8")
