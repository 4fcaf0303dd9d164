"""What-if: when would a job start if it were submitted now? The engine's own answer on the current snapshot,
placing nothing.

The hypothetical job joins the real queue (its team, priority class and the submit time of now) and the
configured profile runs one cycle over it; its placement, or its pending reason and estimated start, is the
answer. When it would wait, a few nearby requests are asked the same way and the first that starts sooner is
named, with the spec's values that ask for it; when it can never run, the nearest request that can (the same GPUs
split over more nodes, fewer GPUs, any model). A class the team may not use is its permission, said as such, not
a verdict on the cluster. The snapshot is read at most every SNAPSHOT_TTL_S per process, and on a large cluster in the
background: a what-if is advice, not a decision.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection
from django.utils import timezone

from quotas.models import PriorityClass, Team
from quotas.selectors import TeamAllowance, team_allowance
from scheduling.cycle.snapshot import cycle_profile, engine_job, snapshot_from_db
from scheduling.engine import run_cycle
from scheduling.engine import types as eng
from scheduling.engine.reasons import duration_words
from scheduling.errors import ServiceError
from scheduling.jobs.fields import CANNOT_RUN, MAX_GANG_NODES, JobSpec
from scheduling.jobs.models import JobEvent
from scheduling.jobs.spec import format_mib
from scheduling.jobs.submit import job_from_spec
from scheduling.jobs.validation import job_spec_validate_for_team

log = logging.getLogger(__name__)

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
_read_done = threading.Event()  # set while no background read is under way
_read_done.set()
# An answer asked while the first snapshot is being read in the background waits at most this long for it.
WARM_WAIT_S = 60.0


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
    except Exception:  # advice only: the next answer reads it on its request
        log.info("could not read the what-if's snapshot in the background", exc_info=True)
    finally:
        _refreshing = False
        _read_done.set()
        connection.close()  # this thread's own connection


def snapshot_warm() -> None:
    """Start reading the snapshot in the background when none is held: the submit form asks as it opens, so its
    first answer waits for no read (on a large cluster, seconds), or only for what is left of this one."""
    global _refreshing
    if connection.in_atomic_block:  # another connection would not see what this transaction has not committed
        return
    with _cache_lock:
        if _cached is not None or _refreshing:
            return
        _refreshing = True
        _read_done.clear()
    threading.Thread(target=_refresh_in_background, name="whatif-snapshot", daemon=True).start()


def _snapshot() -> eng.Snapshot:
    global _cached, _refreshing
    if _cached is None:
        _read_done.wait(WARM_WAIT_S)  # the first read already under way: not a second one beside it
    with _cache_lock:
        held = _cached
        if held is not None:
            age_s = time.monotonic() - held.read_at
            if held.cost_s > CHEAP_SNAPSHOT_S:
                if age_s > SNAPSHOT_TTL_S and not _refreshing:
                    _refreshing = True
                    _read_done.clear()
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


# Refusals of what the cluster or the team's limits can never give: "Can never run here". Any other refusal is
# not about capacity (a priority class the team may not use is its permission) and is said in its own words.
NEVER_CODES = frozenset({CANNOT_RUN, "beyond_team_limit"})
NO_RUNTIME_NOTE = (
    "Without a runtime limit the scheduler cannot backfill this job or estimate starts behind it: "
    "a limit (e.g. 2h) lets it start in gaps and tells others when it ends."
)
# How many ways of splitting a job over more nodes are tried when its shape can never be had.
MAX_SHAPES_TRIED = 4


@dataclass(frozen=True)
class WhatIf:
    """The answer: `verdict` is "now", "later", "waits" (no start can be estimated), "never" (the cluster or
    the team's limits can never give it) or "refused" (not a question of capacity: a priority class the team
    may not use, values that do not go together; `field_name` names the field).
    `alternative` names a nearby request and when it starts; `apply` is that request's changes as the spec
    writes them (field -> value), `apply_words` the same in a few words; `runtime_note` nudges towards a
    runtime limit when none is given."""

    verdict: str
    text: str
    eta_s: float | None = None
    reason_code: str = ""
    alternative: str = ""
    apply: dict[str, Any] = field(default_factory=dict)
    apply_words: str = ""
    field_name: str = ""
    runtime_note: str = ""


@dataclass(frozen=True)
class _Variant:
    label: str  # "4 GPUs per node instead of 8"
    words: str  # "4 GPUs per node"
    spec: JobSpec
    apply: dict[str, Any]


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


def _gpus_words(gpus: int, nodes: int) -> str:
    return f"{gpus} GPU{'s' if gpus > 1 else ''}{' per node' if nodes > 1 else ''}"


def _variants(spec: JobSpec) -> list[_Variant]:
    """Nearby requests, most like the original first. Each asks for less than the spec (fewer GPUs, a smaller
    slice, any model, no topology), so a spec that passed validation makes variants that pass it too."""
    out: list[_Variant] = []
    if spec.gpus > 1:
        half = spec.gpus // 2
        words = _gpus_words(half, spec.nodes)
        out.append(
            _Variant(f"{words} instead of {spec.gpus}", words, replace(spec, gpus=half), {"gpus": half})
        )
    if spec.gpu_memory_mib >= 2048:
        half = spec.gpu_memory_mib // 2
        words = f"a {half / 1024:g} GiB slice"
        out.append(
            _Variant(words, words, replace(spec, gpu_memory_mib=half), {"gpu_memory": format_mib(half)})
        )
    if spec.gpu_models:
        out.append(
            _Variant("any GPU model", "any GPU model", replace(spec, gpu_models=()), {"gpu_models": []})
        )
    if spec.topology != "none":
        words = "no topology constraint"
        out.append(_Variant(words, words, replace(spec, topology="none"), {"topology": "none"}))
    return out[:MAX_ALTERNATIVES]


def _shapes(spec: JobSpec) -> list[_Variant]:
    """The same whole GPUs split evenly over more nodes, fewest nodes first: for a job whose GPUs per node no
    node has (12 GPUs where the largest node has 8 -> 2 nodes x 6 GPUs). Whether a shape fits is the cluster's
    own answer (the validation that refused the job), so nothing here assumes a node size."""
    total = spec.gpus * spec.nodes
    out: list[_Variant] = []
    for nodes in range(spec.nodes + 1, min(total, MAX_GANG_NODES) + 1):
        if total % nodes:
            continue
        gpus = total // nodes
        words = f"{nodes} nodes x {gpus} GPU{'s' if gpus > 1 else ''}"
        out.append(
            _Variant(words, words, replace(spec, gpus=gpus, nodes=nodes), {"gpus": gpus, "nodes": nodes})
        )
        if len(out) == MAX_SHAPES_TRIED:
            break
    return out


def _fitting(spec: JobSpec, *, team: Team, allowance: TeamAllowance) -> list[tuple[_Variant, PriorityClass]]:
    """For a job that can never run: the nearby requests that can (the team's own rules included), the first
    few only."""
    out = []
    for variant in [*_shapes(spec), *_variants(spec)]:
        try:
            priority_class = job_spec_validate_for_team(spec=variant.spec, team=team, allowance=allowance)
        except ServiceError:
            continue
        out.append((variant, priority_class))
        if len(out) == MAX_ALTERNATIVES:
            break
    return out


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


def _when(answer: WhatIf) -> str:
    if answer.verdict == "now":
        return "starts now"
    if answer.eta_s is not None:
        return f"starts in about {duration_words(answer.eta_s)}"
    return "could run here, but waits with no start it can estimate"


def _named(answer: WhatIf, variant: _Variant, other: WhatIf) -> WhatIf:
    label = variant.label
    return replace(
        answer,
        alternative=f"{label[0].upper()}{label[1:]} {_when(other)}.",
        apply=dict(variant.apply),
        apply_words=variant.words,
    )


def _never(
    *, user: AbstractBaseUser, team: Team, spec: JobSpec, allowance: TeamAllowance, refusal: ServiceError
) -> WhatIf:
    """Can never run here, and the nearest request that can: the first of them the engine would start soonest
    (any of them, even one that would wait, is better than never)."""
    answer = WhatIf("never", f"Can never run here: {refusal.message}", reason_code="never")
    fitting = _fitting(spec, team=team, allowance=allowance)
    if not fitting:
        return answer
    snapshot = _snapshot()
    jobs = [
        _hypothetical(team=team, user=user, spec=variant.spec, priority_class=priority_class, index=i)
        for i, (variant, priority_class) in enumerate(fitting)
    ]
    answers = [_answer(placed, pending, snapshot.now) for placed, pending in _ask(snapshot, jobs)]
    best = min(
        range(len(fitting)),
        key=lambda i: (
            0.0
            if answers[i].verdict == "now"
            else (answers[i].eta_s if answers[i].eta_s is not None else float("inf"))
        ),
    )
    return _named(answer, fitting[best][0], answers[best])


def job_whatif(*, user: AbstractBaseUser, team: Team, spec: JobSpec) -> WhatIf:
    """When this job would start if submitted now, and a nearby request that starts sooner (one engine cycle
    answers both); for one that can never run, a nearby request that can."""
    note = NO_RUNTIME_NOTE if spec.max_runtime_s is None else ""
    answer = _whatif(user=user, team=team, spec=spec)
    return replace(answer, runtime_note=note)


def _whatif(*, user: AbstractBaseUser, team: Team, spec: JobSpec) -> WhatIf:
    allowance = team_allowance(team=team)
    try:
        priority_class = job_spec_validate_for_team(spec=spec, team=team, allowance=allowance)
    except ServiceError as exc:
        if exc.code not in NEVER_CODES:
            return WhatIf("refused", exc.message, reason_code=exc.code, field_name=exc.field or "")
        return _never(user=user, team=team, spec=spec, allowance=allowance, refusal=exc)
    variants = _variants(spec)
    asked = [spec, *(variant.spec for variant in variants)]
    snapshot = _snapshot()
    jobs = [
        _hypothetical(team=team, user=user, spec=one, priority_class=priority_class, index=i)
        for i, one in enumerate(asked)
    ]
    answers = [_answer(placed, pending, snapshot.now) for placed, pending in _ask(snapshot, jobs)]
    answer = answers[0]
    if answer.verdict == "now":
        return answer
    for variant, other in zip(variants, answers[1:], strict=True):
        sooner = other.verdict == "now" or (
            other.eta_s is not None and (answer.eta_s is None or other.eta_s < answer.eta_s)
        )
        if sooner:
            return _named(answer, variant, other)
    return answer
