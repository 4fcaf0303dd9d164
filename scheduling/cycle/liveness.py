"""Whether the scheduler is running: the one rule that /readyz, the pending reasons and the alert share.

A cycle starts at least every TESSERA_CYCLE_INTERVAL_S (beat's tick, or the embedded loop); none for three
intervals (+10 s of slack for a long cycle) means the scheduler is not running, and a pending job's reason says
so instead of "waiting for the next scheduling cycle".
"""

from __future__ import annotations

import time

from django.conf import settings

from scheduling.cycle.models import SchedulerLease

SCHEDULER_STALLED = "scheduler_stalled"
_CHECK_EVERY_S = 2.0  # a page of 50 pending jobs asks once, not 50 times
_last: list = [float("-inf"), None]


def _minutes_or_seconds(seconds: float) -> str:
    return f"{int(seconds // 60)} min" if seconds >= 120 else f"{int(seconds)} s"


def _last_cycle_at(*, fresh: bool) -> float | None:
    """When the last cycle started (Unix s; None: never), asked at most every _CHECK_EVERY_S per process."""
    now = time.monotonic()
    if fresh or now - _last[0] >= _CHECK_EVERY_S:
        lease = SchedulerLease.objects.filter(pk=1).only("issued_at").first()
        _last[0], _last[1] = now, lease.issued_at.timestamp() if lease and lease.issued_at else None
    return _last[1]


def scheduler_stall(*, waiting_since: float | None = None, fresh: bool = False) -> str | None:
    """None while cycles run; else what to tell people ("No scheduling cycle for 4 min: ..."). Before any cycle
    has ever run, a job is told so once it has waited three intervals (`waiting_since`, Unix s); /readyz (no
    `waiting_since`) is told at once."""
    max_age_s = 3 * float(settings.TESSERA_CYCLE_INTERVAL_S) + 10
    last = _last_cycle_at(fresh=fresh)
    now = time.time()
    if last is None:
        if waiting_since is not None and now - waiting_since <= max_age_s:
            return None
        return "No scheduling cycle has run yet: the scheduler is not running."
    age_s = now - last
    if age_s <= max_age_s:
        return None
    return (
        f"No scheduling cycle for {_minutes_or_seconds(age_s)}: the scheduler is not running. "
        "The job keeps its place in the queue; the cluster's operators are alerted."
    )
