"""Running scheduling cycles: one cycle (snapshot -> engine -> apply) under a fresh fencing epoch, and the
bounded loop a cycle task runs while requests keep arriving, under the cycle lock."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from scheduling.coordination import redis_client
from scheduling.cycle import requests
from scheduling.cycle.apply import ApplyResult, apply_decisions
from scheduling.cycle.desired_state import desired_state_sync
from scheduling.cycle.lease import StaleEpoch, epoch_issue, last_full_cycle
from scheduling.cycle.snapshot import cycle_profile, snapshot_from_db
from scheduling.engine import run_cycle
from scheduling.engine.collector import collector_paused
from scheduling.observability import instruments
from scheduling.observability.admission import admission_waits

log = logging.getLogger(__name__)

# Cycles one task may run back to back while requests keep arriving, before it hands over to a fresh task.
MAX_CYCLES_PER_TASK = 20


@dataclass
class CycleReport:
    epoch: int
    kind: str  # "full": the whole queue scored; "incremental": its head and the jobs no cycle has seen
    pending: int
    running: int
    placed: int
    evicted: int
    conflicts: int
    snapshot_s: float
    engine_s: float
    apply_s: float
    stale: bool = False

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def cycle_kind() -> str:
    """Whether the next cycle scores the whole queue ("full") or is an incremental pass.

    A full cycle reads, ranks and writes every waiting job: seconds at 20,000. While the last one is younger than
    TESSERA_FULL_CYCLE_INTERVAL_S and saw at least TESSERA_INCREMENTAL_MIN_PENDING jobs waiting, the cycles a
    submit or a job's end requests are incremental passes instead: the cluster and the running jobs whole, but of
    the queue only the first TESSERA_INCREMENTAL_QUEUE_DEPTH of the last full cycle's order, the jobs no cycle has
    ranked yet, and those holding a reservation. The same engine places them by the same rules; a job further
    back waits for the next full cycle, which stays the one source of the queue's order (as Slurm's main loop
    looks at the head of its queue on events and its backfill at the whole of it on an interval)."""
    minimum = int(settings.TESSERA_INCREMENTAL_MIN_PENDING)
    if minimum <= 0:
        return "full"
    full_at, full_pending = last_full_cycle()
    if full_at is None or full_pending < minimum:
        return "full"
    age_s = (timezone.now() - full_at).total_seconds()
    return "incremental" if 0 <= age_s < float(settings.TESSERA_FULL_CYCLE_INTERVAL_S) else "full"


def cycle_run_once(*, holder: str | None = None, kind: str = "full") -> CycleReport:
    """One scheduling cycle under a fresh fencing epoch: "full" or "incremental" (`cycle_kind`). The caller
    provides mutual exclusion (a lock); the epoch makes the database refuse this cycle's writes if a newer one
    started meanwhile."""
    report, observe = _cycle_run(holder=holder, kind=kind)
    observe()
    return report


def _cycle_run(*, holder: str | None, kind: str) -> tuple[CycleReport, Callable[[], None]]:
    """cycle_run_once, its figures for /metrics left to the caller (`observe`): their admission waits are a
    query over every job placed (a second for an array's 8,000 tasks on a busy machine), which the cycle task
    runs after the agents are told, not before."""
    full = kind == "full"
    epoch = epoch_issue(holder=holder)
    with collector_paused():  # the read and the apply too, not only the engine (engine/collector.py)
        t0 = time.perf_counter()
        snapshot = snapshot_from_db(
            queue_depth=None if full else int(settings.TESSERA_INCREMENTAL_QUEUE_DEPTH)
        )
        t1 = time.perf_counter()
        decisions = run_cycle(snapshot, cycle_profile())
        t2 = time.perf_counter()
        stale = False
        try:
            result = apply_decisions(
                decisions=decisions, epoch=epoch, full_pending=len(snapshot.pending) if full else None
            )
        except StaleEpoch as exc:
            log.warning("%s; its decisions were discarded", exc)
            result, stale = ApplyResult(epoch=epoch), True
        t3 = time.perf_counter()
    report = CycleReport(
        epoch=epoch,
        kind=kind,
        pending=len(snapshot.pending),
        running=len(snapshot.running),
        placed=len(result.placed),
        evicted=len(result.evicted),
        conflicts=len(result.conflicts),
        snapshot_s=round(t1 - t0, 4),
        engine_s=round(t2 - t1, 4),
        apply_s=round(t3 - t2, 4),
        stale=stale,
    )
    if report.placed or report.evicted or report.conflicts or stale:
        log.info("cycle %s", report.as_dict())
    return report, lambda: _observe(report, decisions, result)


def _observe(report: CycleReport, decisions, result: ApplyResult) -> None:
    """The cycle's figures for /metrics: phase durations, placements, evictions by reason, admission waits."""
    for phase, seconds in (
        ("snapshot", report.snapshot_s),
        ("engine", report.engine_s),
        ("apply", report.apply_s),
    ):
        instruments.CYCLE_DURATION.labels(phase).observe(seconds)
    instruments.CYCLE_DURATION.labels("total").observe(report.snapshot_s + report.engine_s + report.apply_s)
    instruments.CYCLES.labels("stale" if report.stale else "applied").inc()
    if report.placed:
        instruments.PLACEMENTS.inc(report.placed)
        for slug, priority_class, wait_s in admission_waits(job_ids=result.placed):
            instruments.ADMISSION_WAIT.labels(slug, priority_class).observe(wait_s)
    evicted = {str(job_id) for job_id in result.evicted}
    for eviction in decisions.evictions:
        if eviction.job_id in evicted:
            instruments.EVICTIONS.labels(eviction.code).inc()


def run_cycles(*, holder: str, keeper: requests.LockKeeper | None = None) -> list[dict]:
    """Run cycles until no request is outstanding (bounded). The caller holds the cycle lock, kept alive by
    `keeper` (with Redis); once the keeper has lost it, no further cycle starts."""
    reports = []
    r = redis_client()
    for _ in range(MAX_CYCLES_PER_TASK):
        if keeper is not None and keeper.lost.is_set():
            break
        if r is not None:
            r.delete(requests.KEY_WANTED)
        else:
            requests.local_cycle_wanted.clear()
        # The collector paused until the agents are told, the cycle's collection after, off that path; and the
        # cycle's figures observed after them too (_cycle_run).
        with collector_paused():
            report, observe = _cycle_run(holder=holder, kind=cycle_kind())
            reports.append(report.as_dict())
            if keeper is not None:
                keeper.progress()
            desired_state_sync()
        observe()
        if r is not None:
            if not r.exists(requests.KEY_WANTED):
                break
        elif not requests.local_cycle_wanted.is_set():
            break
    return reports


def cycles_run_locked() -> dict:
    """Run the scheduling cycle if no one else is; a busy lock means the holder will see our request."""
    r = redis_client()
    holder = f"{uuid.uuid4().hex}"
    if r is None:
        if not requests.local_lock.acquire(blocking=False):
            return {"ran": 0, "busy": True}
        try:
            return {"ran": len(run_cycles(holder=holder))}
        finally:
            requests.local_lock.release()
    r.delete(requests.KEY_QUEUED)  # from here on, a new request queues a new task
    lock = requests.lock_acquire(r, holder=holder)
    if lock is None:
        requests.cycle_request_when_lock_frees(r)
        return {"ran": 0, "busy": True}
    try:
        with requests.LockKeeper(lock, holder=holder) as keeper:
            reports = run_cycles(holder=holder, keeper=keeper)
    finally:
        requests.lock_release(lock)
    if r.exists(requests.KEY_WANTED):  # arrived after our last look: hand over rather than lose it
        requests.cycle_request()
    return {"ran": len(reports), "placed": sum(x["placed"] for x in reports)}
