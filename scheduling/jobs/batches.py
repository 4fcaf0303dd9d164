"""Set-based writes of many jobs at once: a cycle's single-node placements (`jobs_place`) and a wave of start
reports (`jobs_start`), each what job_transition records for that change, job for job, in a few statements."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from portal.database import insert_from_values, update_from_values
from scheduling.choices import ActorKind, JobState
from scheduling.cycle import node_loss
from scheduling.cycle.requests import cycle_request_after_commit
from scheduling.inventory.models import Gpu
from scheduling.jobs.ledger import SliceDoesNotFit, gpus_allocate, slice_check, slices_release_many
from scheduling.jobs.models import Job, JobEvent, Slice
from scheduling.jobs.states import ACTIVE_STATES, TERMINAL_STATES, check_transition
from scheduling.jobs.transitions import job_change_log_on_commit, job_state_enter
from scheduling.notifications.services import job_events_wanted, job_state_notify
from scheduling.realtime import events

log = logging.getLogger("tessera.jobs")


@dataclass(frozen=True)
class SliceWant:
    """Part of one GPU a placement takes."""

    gpu: Gpu
    memory_mib: int
    compute_pct: int


@dataclass
class PlacementWrite:
    """One pending single-node job's placement, as jobs_place writes it."""

    job: Job
    slices: list[SliceWant]
    borrowed: bool
    message: str
    data: dict[str, Any]


class _BatchRefused(Exception):
    """Raised inside jobs_place's savepoint to roll the whole batch back."""


def jobs_place(*, placements: list[PlacementWrite]) -> bool:
    """Place many pending single-node jobs in a few statements, all or none: one guarded UPDATE of the GPU
    ledger for every card, one UPDATE of the jobs, one INSERT of their events and one of their slices.

    The ledger's guard is the one slice_allocate applies card by card (memory and compute within what the card
    has free, the CHECK constraints behind it); if it refuses any card, nothing is written and False comes back
    (the jobs as they were): the caller then places them one at a time, each in its own savepoint, to find
    which. A cycle placing thousands of jobs spent ~30 ms a job in the one-at-a-time path (bench/cluster_scale.py).
    """
    if not placements:
        return True
    for p in placements:
        check_transition(job_id=p.job.pk, from_state=p.job.state, to_state=JobState.PLACED)
        if p.job.nodes > 1:
            raise ValueError(f"job {p.job.pk} is a gang: place it with job_transition and gang_members_place")
        try:
            for want in p.slices:
                slice_check(gpu=want.gpu, memory_mib=want.memory_mib, compute_pct=want.compute_pct)
        except SliceDoesNotFit:
            return False  # the one-at-a-time path refuses that placement alone, saying why
    per_gpu: dict[int, tuple[int, int]] = {}
    for p in placements:
        for want in p.slices:
            memory_mib, compute_pct = per_gpu.get(want.gpu.pk, (0, 0))
            per_gpu[want.gpu.pk] = (memory_mib + want.memory_mib, compute_pct + want.compute_pct)
    now = timezone.now()
    before = [(p.job.state, p.job.borrowed) for p in placements]
    try:
        with transaction.atomic():
            refused = gpus_allocate(per_gpu=per_gpu)
            if refused:
                raise _BatchRefused(f"GPU ids {refused[:5]} have less free than the batch takes")
            update: list[str] = []
            for p in placements:
                update = job_state_enter(
                    p.job, to_state=JobState.PLACED, now=now, at=now, code="placed", message=""
                )
                p.job.borrowed = p.borrowed
            columns = [f for f in update if f != "state"] + ["borrowed", "state"]
            written = update_from_values(
                Job,
                columns,
                [[p.job.pk, *(getattr(p.job, c) for c in columns)] for p in placements],
                where=f"t.state = '{JobState.PENDING}'",
            )
            if len(written) != len(placements):
                raise _BatchRefused(f"{len(placements) - len(written)} jobs no longer pending")
            changes = [
                (p.job, state, p.message, p.data) for p, (state, _) in zip(placements, before, strict=True)
            ]
            _changes_record(changes, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER, code="placed")
            insert_from_values(
                Slice,
                ["job", "gpu", "memory_mib", "compute_pct", "created_at"],
                [
                    (p.job.pk, w.gpu.pk, w.memory_mib, w.compute_pct, now)
                    for p in placements
                    for w in p.slices
                ],
            )
    except _BatchRefused as exc:
        log.info("placing %d jobs at once refused (%s): placing them one at a time", len(placements), exc)
        for p in placements:
            p.job.refresh_from_db()
        return False
    _changes_tell(changes, to_state=JobState.PLACED, code="placed")
    return True


def _changes_record(
    changes: list[tuple[Job, str, str, dict[str, Any]]],
    *,
    to_state: str,
    actor_kind: str,
    code: str,
    actor: AbstractBaseUser | None = None,
) -> None:
    """The events of many jobs' changes to `to_state` ((job, from state, message, data) each), in one INSERT."""
    now = timezone.now()
    actor_id = actor.pk if actor is not None else None
    insert_from_values(
        JobEvent,
        ["job", "at", "from_state", "to_state", "actor_kind", "actor", "code", "message", "data"],
        [
            (job.pk, now, from_state, to_state, actor_kind, actor_id, code, message, data)
            for job, from_state, message, data in changes
        ],
    )


def _changes_tell(changes: list[tuple[Job, str, str, dict[str, Any]]], *, to_state: str, code: str) -> None:
    """What job_transition says of each change once written: its log line, its owner's notifications (their
    defaults read once for all), the browsers' events (one commit hook)."""
    defaults = job_events_wanted(user_ids={job.submitter_id for job, *_ in changes if job.notify is None})
    arrays_told: set[int] = set()  # an array's tasks changed together tell as one (notifications: arrays)
    for job, from_state, message, _ in changes:
        job_change_log_on_commit(
            job_id=job.pk, from_state=from_state, to_state=to_state, code=code, message=message
        )
        if job.array_job_id is not None:
            if job.array_job_id in arrays_told:
                continue
            arrays_told.add(job.array_job_id)
        job_state_notify(
            job=job, from_state=from_state, to_state=to_state, message=message, defaults=defaults
        )
    events.jobs_changed(
        changes=[
            (job.pk, job.team_id, job.submitter_id, to_state, code, message, job.array_job_id)
            for job, _, message, _ in changes
        ]
    )


@dataclass
class StartWrite:
    """One placed (or starting) single-node job its agent reports started, as jobs_start writes it."""

    job: Job
    message: str
    data: dict[str, Any]


def jobs_start(*, starts: list[StartWrite]) -> None:
    """Move many placed or starting single-node jobs to running in a few statements: one UPDATE of the jobs, one
    INSERT of their events, one read of their owners' notification defaults. What job_transition records for that
    change, job for job. The caller holds the jobs' row locks (it has checked each report against them).

    A cycle's wave of start reports, one job_transition each, was recorded at 17 jobs a second while the portal
    served 1,000 nodes (bench/cluster_scale.py)."""
    if not starts:
        return
    for s in starts:
        check_transition(job_id=s.job.pk, from_state=s.job.state, to_state=JobState.RUNNING)
        if s.job.nodes > 1:
            raise ValueError(f"job {s.job.pk} is a gang: its members start one by one (gang_member_started)")
    now = timezone.now()
    before = [s.job.state for s in starts]
    for s in starts:
        job_state_enter(s.job, to_state=JobState.RUNNING, now=now, at=now, code="started", message=s.message)
    written = update_from_values(
        Job,
        ["started_at", "state"],
        [[s.job.pk, s.job.started_at, s.job.state] for s in starts],
        where=f"t.state IN ('{JobState.PLACED}', '{JobState.STARTING}')",
    )
    if len(written) != len(starts):  # the caller's locks make this impossible; never write half of it
        raise RuntimeError(f"jobs {sorted({s.job.pk for s in starts} - set(written))} were not placed")
    changes = [(s.job, state, s.message, s.data) for s, state in zip(starts, before, strict=True)]
    _changes_record(changes, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT, code="started")
    _changes_tell(changes, to_state=JobState.RUNNING, code="started")


def jobs_cancel(*, jobs: list[Job], actor: AbstractBaseUser | None, message: str) -> None:
    """Cancel many live single-node jobs in a few statements, as job_cancel does each: the jobs, their events,
    their cards given back in one ledger UPDATE (those on a silent node stay taken, "releasing", as
    job_transition keeps them), their nodes told, one cycle asked for. The caller holds the jobs' row locks and
    has left out the ended ones. Cancelling an array's 8,000 running tasks one job_cancel at a time held their
    locks (and the cycle waiting on them) for minutes (bench/cluster_scale.py)."""
    if not jobs:
        return
    for job in jobs:
        check_transition(job_id=job.pk, from_state=job.state, to_state=JobState.CANCELLED)
        if job.nodes > 1:
            raise ValueError(f"job {job.pk} is a gang: cancel it with job_cancel")
    now = timezone.now()
    before = [job.state for job in jobs]
    changed: set[str] = set()  # every job's: a moved one also clears moving_until
    for job in jobs:
        changed.update(
            job_state_enter(
                job, to_state=JobState.CANCELLED, now=now, at=now, code="cancelled", message=message
            )
        )
        if job.array_pending:  # an array's first row: its tasks not yet placed end with it
            job.array_pending = ""
    columns = [*sorted(changed - {"state"}), "array_pending", "state"]
    written = update_from_values(
        Job,
        columns,
        [[job.pk, *(getattr(job, c) for c in columns)] for job in jobs],
        where=f"t.state NOT IN ({', '.join(repr(str(s)) for s in TERMINAL_STATES)})",
    )
    if len(written) != len(jobs):  # the caller's locks make this impossible; never write half of it
        raise RuntimeError(f"jobs {sorted({j.pk for j in jobs} - set(written))} had ended")
    changes = [(job, state, message, {}) for job, state in zip(jobs, before, strict=True)]
    _changes_record(
        changes, to_state=JobState.CANCELLED, actor_kind=ActorKind.USER, code="cancelled", actor=actor
    )
    active = [job.pk for job, state in zip(jobs, before, strict=True) if state in ACTIVE_STATES]
    # A job cancelled while its node is silent may run on there until its fence: its cards stay taken there
    # ("releasing"), as job_transition keeps them, until the agent confirms the stop or the fence has passed.
    on_nodes = Slice.objects.filter(job_id__in=active).values_list("gpu__node_id", flat=True).distinct()
    silent = node_loss.silent_nodes(node_ids=set(on_nodes), now=now)
    for node_name in slices_release_many(job_ids=active, keep_node_ids=silent):
        events.node_desired_state_changed(node_name=node_name)
    cycle_request_after_commit()
    _changes_tell(changes, to_state=JobState.CANCELLED, code="cancelled")
