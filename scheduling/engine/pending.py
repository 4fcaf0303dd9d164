"""Pending reasons: for every job left pending, a `Status(code, reason)` naming what it waits for, its queue
position, and its estimated start (a reservation's, or the start projection's). docs/engine.md, step 7.
"""

from __future__ import annotations

import numpy as np

from scheduling.engine.placement import effective, feasible, node_ok
from scheduling.engine.projection import StartProjection
from scheduling.engine.reasons import (
    BEING_FREED,
    FILTERED,
    GANG_INCOMPLETE,
    INSUFFICIENT_GPUS,
    INSUFFICIENT_HOST,
    MODEL_QUOTA_LIMIT,
    MOVING,
    NEVER_FITS_QUOTA,
    NO_FIT,
    NO_MATCHING_GPU,
    NO_NUMA_GROUP,
    NO_NVLINK_GROUP,
    NO_SLICE,
    NODE_UNAVAILABLE,
    NOT_REACHED,
    QUOTA_LIMIT,
    RESERVED,
    WAITING_FOR_RESERVATION,
    duration_words,
    explain_cluster,
)
from scheduling.engine.resources import node_fits
from scheduling.engine.session import Session
from scheduling.engine.types import Job, Pending, Request, Reservation, Status

# Reasons that say the job's GPU capacity is missing now (a per-model limit may be what is in the way).
_WAITING_FOR_ROOM = frozenset(
    {INSUFFICIENT_GPUS, NO_NVLINK_GROUP, NO_NUMA_GROUP, NO_SLICE, GANG_INCOMPLETE, NO_MATCHING_GPU}
)

# Pending jobs that wait for something other than GPU capacity: no start is projected for them.
_NO_ESTIMATE = frozenset(
    {
        QUOTA_LIMIT,
        NEVER_FITS_QUOTA,
        NOT_REACHED,
        FILTERED,
        NODE_UNAVAILABLE,
        NO_MATCHING_GPU,
        INSUFFICIENT_HOST,
        BEING_FREED,
    }
)


def explain_pending(s: Session) -> list[Pending]:
    """Every job left pending, in queue order, with its status, queue position and estimated start."""
    placed = {p.job_id for p in s.placements}
    explain = bool(s.param("explain"))
    explained: dict[Request, Status] = {}
    in_order = None  # the index in snapshot order, so reasons name the first node that qualifies
    holders = {r.job_id: r for r in s.reservations}
    rows: list[tuple[Job, Status, int]] = []
    position = 0
    # Asked about a few jobs: reasons as far as the last of them (the estimates of those before it count).
    focus, left = s.snap.focus, len(s.snap.focus)
    for job in s.queue:
        if focus and not left:
            break
        if job.id in placed:
            left -= job.id in focus
            continue
        left -= job.id in focus
        position += 1
        status = s.status.get(job.id)
        note = ""
        # The job as it may be placed now: per-model quota limits may leave it fewer GPU models (or none).
        subject = job
        if job.team in s.restricted and job.request.uses_gpu:
            view = s.views[job.id] = effective(s, job)
            if isinstance(view, Status):
                status = status or view
            else:
                subject = view
        if status is None and job.id in holders:
            status, note = _reserved_for(s, job, holders[job.id])
        if status is None and not explain:
            status = Status(NO_FIT, "no node can host it now")
        if status is None and job.id not in s.blocked and not s.allocates:
            status = Status(NOT_REACHED, "this profile does not allocate")
        if status is None and job.id not in holders:
            status = _reserved_reason(s, subject)
        if status is None:
            req = subject.request
            status = explained.get(req)
            if status is None:
                ok, _ = feasible(s, subject)
                if job.id in s.blocked and int(ok.sum()) >= max(1, req.nodes):
                    # It did not fit when its turn came; evictions for a later job freed room since.
                    first = s.index.ranked(np.flatnonzero(ok).tolist())[0]
                    status = Status(
                        BEING_FREED,
                        f"room is being freed on {s.index.names[first]} by this cycle's evictions; "
                        "it should start in the next cycle",
                    )
                    rows.append((job, _with_model_note(s, job, subject, status), position))
                    continue
                if in_order is None:
                    in_order = s.index.in_order()
                status = _filtered_reason(s, subject, ok) or explain_cluster(
                    req, in_order, ok[s.index.order], s.factor
                )
                explained[req] = status
        if note:
            status = Status(status.code, status.reason + note)
        dropped = s.reservation_notes.get(job.id)
        if dropped and job.id not in holders:
            status = Status(status.code, f"{status.reason}; {dropped}")
        if subject is not job and job.id not in s.status:
            status = _with_model_note(s, job, subject, status)
        rows.append((job, status, position))
    return _with_estimates(s, rows, explain)


def _reserved_for(s: Session, job: Job, held: Reservation) -> tuple[Status | None, str]:
    """What a job holding a reservation waits for, as (status, note to add to the status of what it lacks now):
    "node h100-03 is reserved for this job; it starts in about 12 min (when job 41 ends)"."""
    names = sorted({a.node for a in held.assignments})
    where = f"node {names[0]} is" if len(names) == 1 else f"nodes {', '.join(names)} are"
    now = s.snap.now
    if job.ready_at is not None and job.ready_at > now:
        return (
            Status(
                MOVING,
                f"it is being moved: it stops where it ran, and its place on {', '.join(names)} is held for it; "
                f"it restarts there in about {duration_words(job.ready_at - now)}",
            ),
            "",
        )
    blocker = ""
    if held.waits_for:
        blocker = f"job {held.waits_for} {held.waits_how or 'ends'}"
    if held.estimated_start is not None:
        when = f"it starts in about {duration_words(held.estimated_start - now)}"
        if blocker:
            when += f" (when {blocker})"
        dropped = s.reservation_notes.get(job.id)
        sentence = f"{where} reserved for this job; {when}"
        if dropped:
            sentence += f"; {dropped}"
        return Status(WAITING_FOR_RESERVATION, sentence), ""
    # No start is known: say what is missing now, and that the room is held for it.
    waits = (
        f"it starts when {blocker}, which declares no max runtime"
        if blocker
        else "the jobs there declare no max runtime"
    )
    return (
        None,
        f"; {where} reserved for this job: its cards are held as they free up ({waits}, so no start can be estimated)",
    )


def _with_model_note(s: Session, job: Job, view: Job, status: Status) -> Status:
    """The pending reason of a job that per-model limits keep off some GPU models. When it would fit now on
    a model it may not use, the limit is what holds it back: `model-quota-limit`, naming the limit, then what
    the models left to it lack. Otherwise it waits like any job, and the reason adds the limit."""
    if view is job:
        return status
    note = s.model_notes[job.id].reason
    if status.code in (NO_FIT, INSUFFICIENT_HOST) or status.code in _WAITING_FOR_ROOM:
        whole, _ = feasible(s, job)
        if int(whole.sum()) >= max(1, job.request.nodes):
            return Status(MODEL_QUOTA_LIMIT, f"{note}; on the GPU models it may still use: {status.reason}")
    return Status(status.code, f"{status.reason}; {note}")


def _with_estimates(s: Session, rows: list[tuple[Job, Status, int]], explain: bool) -> list[Pending]:
    """The pending list, each job with its estimated start: its reservation's where it has one, else a
    projection in queue order (`StartProjection`); the reason sentence names it."""
    projection = StartProjection.build(s) if rows and s.param("estimate_starts") else None
    est_start = s.est_start
    if projection is None and not est_start:
        return [
            Pending(job.id, status, position, None)
            for job, status, position in rows
            if not s.snap.focus or job.id in s.snap.focus
        ]
    now = s.snap.now
    focus = s.snap.focus
    # Jobs with the same reason and the same rounded estimate share one Status (fewer objects per cycle).
    with_eta: dict[tuple[int, str], Status] = {}
    out = []
    for job, status, position in rows:
        eta = None
        view = s.views.get(job.id, job)
        if status.code not in _NO_ESTIMATE and not isinstance(view, Status):
            if projection is not None:
                eta = projection.start(view)
            held = est_start.get(job.id)
            if held is not None:
                eta = held
        if focus and job.id not in focus:
            continue  # it took its projected capacity; its answer is not asked for
        if eta is not None and explain and status.code != WAITING_FOR_RESERVATION:
            text = duration_words(eta - now)
            key = (id(status), text)
            shared = with_eta.get(key)
            if shared is None:
                shared = with_eta[key] = Status(
                    status.code,
                    f"{status.reason}; estimated start in about {text} (from the running jobs' max runtimes)",
                )
            status = shared
        out.append(Pending(job.id, status, position, eta))
    return out


def _filtered_reason(s: Session, job: Job, ok: np.ndarray) -> Status | None:
    """When the profile has filters of its own and one refused a node that had room, say which and why."""
    extra = s.plugins.filters
    if not extra or ok.any():
        return None
    nodes = s.index.nodes
    for pos in s.index.ranked(np.flatnonzero(s.index.coarse(job.request)).tolist()):
        if not node_fits(job.request, nodes[pos], s.factor):
            continue
        for f in extra:
            status = f.filter(s.ctx, job, nodes[pos])
            if status is not None:
                return Status(FILTERED, f"{f.NAME} refused {nodes[pos].name}: {status.reason}")
    return None


def _reserved_reason(s: Session, job: Job) -> Status | None:
    """If the job would fit but for a reservation, say whose and until when."""
    if not s.holds or job.id not in s.blocked:
        return None
    key = (job.request, "reserved")
    if key not in s.reason_cache:
        s.reason_cache[key] = _reserved_reason_for(s, job)
    return s.reason_cache[key]


def _reserved_reason_for(s: Session, job: Job) -> Status | None:
    for pos in s.index.ranked(s.holds):
        if node_ok(s, job, s.real[pos]):
            first = min(s.holds[pos], key=lambda h: h.start)
            name = s.index.names[pos]
            if first.job_id not in s.est_start:
                return Status(
                    RESERVED,
                    f"the free capacity that fits it on {name} is reserved for job {first.job_id}, which "
                    "waits for the jobs running there to end; no start can be estimated, so nothing lower "
                    "may use it",
                )
            return Status(
                RESERVED,
                f"the free capacity that fits it on {name} is reserved for job {first.job_id}, "
                f"which should start in about {duration_words(first.start - s.snap.now)}; it could run there "
                "now if its max runtime ended before then",
            )
    return None
