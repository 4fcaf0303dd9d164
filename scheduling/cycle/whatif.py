"""What-if: when would a job start if it were submitted now? The engine's own answer on the current snapshot,
placing nothing.

The hypothetical job joins the real queue (its team, priority class and the submit time of now) and the
configured profile runs one cycle over it; its placement, or its pending reason and estimated start, is the
answer. When it would wait, a few nearby requests are asked the same way and the first that starts sooner is
named. The snapshot is read at most every SNAPSHOT_TTL_S per process, and on a large cluster in the
background: a what-if is advice, not a decision.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection
from django.utils import timezone

from quotas.models import PriorityClass, Team
from quotas.selectors import team_allowance
from scheduling.cycle.snapshot import cycle_profile, engine_job, snapshot_from_db
from scheduling.engine import run_cycle
from scheduling.engine import types as eng
from scheduling.engine.reasons import duration_words
from scheduling.errors import ServiceError
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import JobEvent
from scheduling.jobs.submit import job_from_spec
from scheduling.jobs.validation import job_spec_validate_for_team

SNAPSHOT_TTL_S = 5.0
# A snapshot this cheap to read is read again, on the request, as soon as any job changed (a submit, a start, an
# end). A dearer one (a large cluster: seconds) is never read on a request once one is held: when it is older
# than SNAPSHOT_TTL_S a background thread reads the next while answers come from the one held.
CHEAP_SNAPSHOT_S = 0.5
WHATIF_JOB_ID = "what-if"
MAX_ALTERNATIVES = 3

_cache_lock = threading.Lock()


@dataclass
class _Held:
    read_at: float  # monotonic s
    cost_s: float
    newest_event: int  # the newest job event when it was read
    snapshot: eng.Snapshot


_cached: _Held | None = None
_refreshing = False


def _newest_event_id() -> int:
    return JobEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def _read() -> _Held:
    newest = _newest_event_id()
    started = time.monotonic()
    snapshot = snapshot_from_db()
    return _Held(started, time.monotonic() - started, newest, snapshot)


def _refresh_in_background() -> None:
    global _cached, _refreshing
    try:
        held = _read()
        with _cache_lock:
            _cached = held
    finally:
        _refreshing = False
        connection.close()  # this thread's own connection


def _snapshot() -> eng.Snapshot:
    global _cached, _refreshing
    with _cache_lock:
        held = _cached
        if held is not None:
            age_s = time.monotonic() - held.read_at
            if held.cost_s > CHEAP_SNAPSHOT_S:
                if age_s > SNAPSHOT_TTL_S and not _refreshing:
                    _refreshing = True
                    threading.Thread(
                        target=_refresh_in_background, name="whatif-snapshot", daemon=True
                    ).start()
                return held.snapshot
            if age_s <= SNAPSHOT_TTL_S and _newest_event_id() == held.newest_event:
                return held.snapshot
        _cached = _read()
        return _cached.snapshot


def current_snapshot() -> eng.Snapshot:
    """The snapshot what-ifs are asked on (read again as described above): advice, not a decision."""
    return _snapshot()


@dataclass(frozen=True)
class WhatIf:
    """The answer: `verdict` is "now", "later", "waits" (no start can be estimated) or "never"."""

    verdict: str
    text: str
    eta_s: float | None = None
    reason_code: str = ""
    alternative: str = ""


def _hypothetical(
    *, team: Team, user: AbstractBaseUser, spec: JobSpec, priority_class: PriorityClass, index: int = 0
) -> eng.Job:
    row = job_from_spec(submitter=user, team=team, spec=spec, priority_class=priority_class)
    row.submitted_at = timezone.now()
    return replace(engine_job(row), id=f"{WHATIF_JOB_ID}-{index}")


def _ask(
    snapshot: eng.Snapshot, jobs: list[eng.Job]
) -> list[tuple[eng.Placement | None, eng.Pending | None]]:
    """One cycle with the hypothetical jobs at the back of the real queue (they were submitted now), and what
    it decided for each. They come after every real job of their priority, so the real queue's answers are
    those of the next production cycle; among themselves, the first is answered as if alone, and a later one
    only after the earlier ones, which matters only when an earlier one starts (and then the later ones are
    not needed). The cycle runs at the snapshot's time, so what the engine keeps from the running jobs between
    cycles on one snapshot is reused, and it works out reasons only for the asked jobs (`focus`)."""
    trial = replace(snapshot, pending=(*snapshot.pending, *jobs), focus=frozenset(job.id for job in jobs))
    decisions = run_cycle(trial, cycle_profile())
    placed = {p.job_id: p for p in decisions.placements}
    pending = {p.job_id: p for p in decisions.pending}
    return [(placed.get(j.id), pending.get(j.id)) for j in jobs]


def _variants(spec: JobSpec) -> list[tuple[str, JobSpec]]:
    """Nearby requests, most like the original first. Each asks for less than the spec (fewer GPUs, a smaller
    slice, any model, no topology), so a spec that passed validation makes variants that pass it too."""
    out: list[tuple[str, JobSpec]] = []
    if spec.gpus > 1:
        half = spec.gpus // 2
        out.append((f"{half} GPU{'s' if half > 1 else ''} instead of {spec.gpus}", replace(spec, gpus=half)))
    if spec.gpu_memory_mib >= 2048:
        half = spec.gpu_memory_mib // 2
        out.append((f"a {half // 1024} GiB slice", replace(spec, gpu_memory_mib=half)))
    if spec.gpu_models:
        out.append(("any GPU model", replace(spec, gpu_models=())))
    if spec.topology != "none":
        out.append(("no topology constraint", replace(spec, topology="none")))
    return out[:MAX_ALTERNATIVES]


def _answer(placed: eng.Placement | None, pending: eng.Pending | None, now: float) -> WhatIf:
    if placed is not None:
        nodes = sorted({a.node for a in placed.assignments} | set(placed.cpu))
        where = f" on {', '.join(nodes)}" if nodes else ""
        borrowed = " (on borrowed capacity: it may be reclaimed)" if placed.borrowed else ""
        return WhatIf("now", f"Starts now{where}{borrowed}.", eta_s=0.0)
    if pending is None:
        return WhatIf("waits", "The scheduler gave no answer for it.")
    reason = pending.status.reason
    if pending.estimated_start is not None:
        eta = max(0.0, pending.estimated_start - now)
        return WhatIf(
            "later",
            f"Starts in about {duration_words(eta)}: {reason}.",
            eta_s=eta,
            reason_code=pending.status.code,
        )
    return WhatIf(
        "waits", f"Waits, with no start it can estimate: {reason}.", reason_code=pending.status.code
    )


def job_whatif(*, user: AbstractBaseUser, team: Team, spec: JobSpec) -> WhatIf:
    """When this job would start if submitted now, and a nearby request that starts sooner (one engine cycle
    answers both)."""
    try:
        priority_class = job_spec_validate_for_team(spec=spec, team=team, allowance=team_allowance(team=team))
    except ServiceError as exc:
        return WhatIf("never", f"Can never run here: {exc.message}", reason_code="never")
    variants = _variants(spec)
    asked = [spec, *(variant for _, variant in variants)]
    snapshot = _snapshot()
    jobs = [
        _hypothetical(team=team, user=user, spec=one, priority_class=priority_class, index=i)
        for i, one in enumerate(asked)
    ]
    answers = [_answer(placed, pending, snapshot.now) for placed, pending in _ask(snapshot, jobs)]
    answer = answers[0]
    if answer.verdict == "now":
        return answer
    for (label, _), other in zip(variants, answers[1:], strict=True):
        sooner = other.verdict == "now" or (
            other.eta_s is not None and (answer.eta_s is None or other.eta_s < answer.eta_s)
        )
        if sooner:
            when = (
                "starts now"
                if other.verdict == "now"
                else f"starts in about {duration_words(other.eta_s or 0)}"
            )
            return replace(answer, alternative=f"{label[0].upper()}{label[1:]} {when}.")
    return answer
