"""The agent's answers to the portal's log requests: checked without the database, stored where the portal asked
(never where the answer claims), for a job placed on the node."""

from __future__ import annotations

import base64
import binascii
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from agent import protocol
from scheduling.agents import joblogs
from scheduling.agents.reports.job_status import placed_here
from scheduling.inventory.models import Node
from scheduling.jobs.models import Job, LogDrain
from scheduling.realtime import events, groups


def log_chunk_check(
    *, job_id: int, attempt: int, stream: str, offset: int, payload: dict[str, Any]
) -> tuple[int, int, bytes] | None:
    """The agent's answer to our logs_request for (job_id, attempt, stream) at `offset`, checked without the
    database: (next offset, size on the agent's side, bytes), or None for an error answer, an answer about another
    placement, bytes that are not base64 or not as many as its offsets say, or a chunk larger than asked for."""
    if stream not in joblogs.STREAMS or "error" in payload:
        return None
    claimed = (str(payload.get("job_id")), str(payload.get("attempt")), str(payload.get("stream")))
    if claimed != (str(job_id), str(attempt), stream):
        return None
    try:
        next_offset, size = int(payload.get("next_offset", offset)), int(payload.get("size", 0))
    except (TypeError, ValueError):
        return None
    # The bytes travel as base64, so they arrive exactly as the job wrote them: exactly as many as the offsets
    # say, and never more than one chunk.
    encoded = payload.get("data_b64", "")
    if not isinstance(encoded, str):
        return None
    try:
        chunk = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    if (
        not offset <= next_offset <= offset + protocol.MAX_LOG_CHUNK_BYTES
        or len(chunk) != next_offset - offset
    ):
        return None
    return next_offset, size, chunk


def job_logs_store(
    *, node_id: int, job_id: int, attempt: int, stream: str, offset: int, payload: dict[str, Any]
) -> tuple[int, int] | None:
    """Store the agent's answer to our logs_request for (job_id, attempt, stream) at `offset` (both what the
    portal asked for, never what the answer claims). Returns (next offset, size) on the agent's side, or None
    when the chunk is refused: an error answer, an answer about another placement, a job not placed on this node,
    or a chunk larger than asked for."""
    checked = log_chunk_check(job_id=job_id, attempt=attempt, stream=stream, offset=offset, payload=payload)
    if checked is None:
        return None
    next_offset, size, chunk = checked
    with transaction.atomic():
        node = Node.objects.get(pk=node_id)
        job = Job.objects.filter(pk=job_id).first()
        if job is None or job.attempt != attempt or not placed_here(job, node):
            return None
        base = _attempt_base(job_id, stream, attempt)
        size_stored = joblogs.log_append(job_id=job_id, stream=stream, data=chunk, offset=base + offset)
        if chunk:
            events.publish_after_commit(
                groups.job(job_id), {"type": "logs.appended", "stream": stream, "size": size_stored}
            )
    return next_offset, size


def log_drain_expect(*, node_id: int, job_id: int, attempt: int) -> None:
    """The placement ended on this node: its logs are pulled to their end, across reconnects and restarts."""
    if Job.objects.filter(pk=job_id).exists():
        LogDrain.objects.bulk_create(
            [LogDrain(node_id=node_id, job_id=job_id, attempt=attempt)], ignore_conflicts=True
        )


def log_drain_done(*, node_id: int, job_id: int, attempt: int) -> None:
    """The placement's logs are all here (or can no longer be pulled)."""
    LogDrain.objects.filter(node_id=node_id, job_id=job_id, attempt=attempt).delete()


# A drain its node never came back for is given up after this long (the agent keeps a job's logs a week).
LOG_DRAIN_KEEP_S = 7 * 24 * 3600


def log_drains(*, node_id: int) -> list[tuple[int, int]]:
    """The (job, attempt) placements that ended on this node with logs still to pull (those older than
    LOG_DRAIN_KEEP_S given up)."""
    drains = LogDrain.objects.filter(node_id=node_id)
    drains.filter(created_at__lt=timezone.now() - timedelta(seconds=LOG_DRAIN_KEEP_S)).delete()
    return list(drains.values_list("job_id", "attempt"))


def _attempt_base(job_id: int, stream: str, attempt: int) -> int:
    """Where this attempt's log starts in the portal's per-job file: earlier attempts' logs come first."""
    marker = joblogs.log_path(job_id=job_id, stream=stream).with_suffix(f".attempt{attempt}")
    try:
        return int(marker.read_text())
    except (FileNotFoundError, ValueError):
        base = joblogs.log_size(job_id=job_id, stream=stream)
        joblogs.log_marker_write(job_id=job_id, stream=stream, name=f"attempt{attempt}", text=str(base))
        return base
