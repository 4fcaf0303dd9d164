"""The state machine's writes: every job state change goes through `job_transition`, which checks the move
(`states.py`), records what entering the state means on the job and appends a JobEvent; a move, cancel and
requeue are built on it."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from scheduling.choices import ActorKind, JobState
from scheduling.cycle import node_loss
from scheduling.cycle.requests import cycle_request_after_commit
from scheduling.jobs.fields import NEVER_SATISFIED
from scheduling.jobs.ledger import job_release_slices
from scheduling.jobs.models import GangMember, Job, JobEvent, Slice
from scheduling.jobs.states import ACTIVE_STATES, TERMINAL_STATES, IllegalTransition, check_transition
from scheduling.notifications.services import job_state_notify
from scheduling.realtime import events, groups

log = logging.getLogger("tessera.jobs")


def job_change_log_on_commit(*, job_id: int, from_state: str, to_state: str, code: str, message: str) -> None:
    """The one log line of a job's state change (every change goes through job_submit or job_transition), written
    once it is committed: a change rolled back (a placement the ledger refused) never happened."""
    arrow = f"{from_state} -> {to_state}" if from_state else to_state
    text = f"job {job_id}: {arrow} ({code or 'no code'})" + (f": {message}" if message else "")
    transaction.on_commit(lambda: log.info("%s", text, extra={"job_id": job_id}))


def job_state_enter(
    job: Job, *, to_state: str, now: datetime, at: datetime, code: str, message: str
) -> list[str]:
    """Set what entering `to_state` records on the job (the one rule for it: job_transition and jobs_place both
    use it); the names of the fields changed."""
    job.state = to_state
    update = ["state"]
    if to_state == JobState.PLACED:
        job.placed_at, job.attempt = now, job.attempt + 1
        job.pending_reason_code, job.pending_reason, job.queue_position, job.estimated_start_at = (
            "",
            "",
            None,
            None,
        )
        update += [
            "placed_at",
            "attempt",
            "pending_reason_code",
            "pending_reason",
            "queue_position",
            "estimated_start_at",
        ]
    elif to_state == JobState.RUNNING:
        job.started_at = at
        update.append("started_at")
    elif to_state in TERMINAL_STATES:
        job.finished_at = at
        job.queue_position = None
        update += ["finished_at", "queue_position"]
    elif to_state == JobState.PENDING:
        job.pending_reason_code, job.pending_reason = code or "requeued", message or "Back in the queue."
        job.placed_at = job.started_at = None
        job.borrowed = False
        # Back in the queue: a reservation from before it ran no longer holds.
        job.reserved_nodes = []
        update += [
            "pending_reason_code",
            "pending_reason",
            "placed_at",
            "started_at",
            "borrowed",
            "reserved_nodes",
        ]
    if job.moving_until is not None and to_state not in (JobState.PREEMPTED, *ACTIVE_STATES):
        job.moving_until = None  # it has stopped: the move is done (or void)
        update.append("moving_until")
    return update


def job_moving(*, job: Job, until: datetime) -> None:
    """The preempted job is being moved: it stops until `until` (its grace), then restarts where the scheduler
    holds its place. A move is not counted against its requeues (`moves`)."""
    job.moves += 1
    job.moving_until = until
    job.save(update_fields=["moves", "moving_until"])


def job_transition(
    *,
    job: Job,
    to_state: str,
    actor_kind: str,
    actor: AbstractBaseUser | None = None,
    code: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
    happened_at: datetime | None = None,
    notify_always: bool = False,
) -> Job:
    """Move a job along a legal transition and record it. Raises IllegalTransition otherwise. `happened_at`: when
    it really happened, for a report that arrives late (a job that ended while its node could not reach the
    portal); the job's start or end time is then that moment, never later than now nor before it was placed.
    `notify_always`: its owner is told whatever events they chose (an end they could not foresee)."""
    from_state = job.state
    check_transition(job_id=job.pk, from_state=from_state, to_state=to_state)
    now = timezone.now()
    at = now
    if happened_at is not None:
        at = min(happened_at, now)
        earliest = job.started_at if to_state in TERMINAL_STATES and job.started_at else job.placed_at
        if earliest is not None:
            at = max(at, earliest)
    update = job_state_enter(job, to_state=to_state, now=now, at=at, code=code, message=message)
    if to_state in TERMINAL_STATES and job.array_pending:
        # An array's first row ending (cancelled, failed) ends its tasks not yet placed with it, whatever path
        # ended it (the admin site's cancel, a dependency never met).
        job.array_pending = ""
        update = [*update, "array_pending"]
    job.save(update_fields=update)
    JobEvent.objects.create(
        job=job,
        from_state=from_state,
        to_state=to_state,
        actor_kind=actor_kind,
        actor=actor,
        code=code,
        message=message,
        data=data or {},
    )
    job_change_log_on_commit(
        job_id=job.pk, from_state=from_state, to_state=to_state, code=code, message=message
    )
    if from_state in ACTIVE_STATES and to_state not in ACTIVE_STATES:
        # The agents running it must stop it: their desired state changed.
        nodes = dict(Slice.objects.filter(job=job).values_list("gpu__node_id", "gpu__node__name").distinct())
        for node_name in nodes.values():
            events.node_desired_state_changed(node_name=node_name)
        # A job that ends while its node is silent may run on there until its fence: its cards stay taken there
        # ("releasing") until the node's agent confirms the stop or the fence has surely passed (the watchdog).
        # Not so for a requeue (the job would be placed again while holding them), nor for an end its agents
        # reported (they have seen it end, whatever the age of their last recorded heartbeat).
        ends_unseen = to_state in TERMINAL_STATES and actor_kind != ActorKind.AGENT
        silent = node_loss.silent_nodes(node_ids=nodes, now=now) if ends_unseen else {}
        job_release_slices(job=job, keep_node_ids=silent)
        GangMember.objects.filter(job=job).delete()  # a gang's members go with its placement
        cycle_request_after_commit()
    elif to_state == JobState.PENDING:
        cycle_request_after_commit()
    events.job_changed(
        job_id=job.pk,
        team_id=job.team_id,
        submitter_id=job.submitter_id,
        state=to_state,
        code=code,
        message=message,
        array_id=job.array_job_id,
    )
    job_state_notify(job=job, from_state=from_state, to_state=to_state, message=message, always=notify_always)
    return job


def job_dependency_never_met(*, job: Job, why: str, tell_owner: bool = True) -> Job:
    """End a pending job whose dependency can never be met (scheduling/jobs/dependencies.py): failed as
    `dependency_never_satisfied`, its owner told whatever events they chose (`tell_owner`; an array's task is
    told with its array's end instead)."""
    return job_transition(
        job=job,
        to_state=JobState.FAILED,
        actor_kind=ActorKind.SCHEDULER,
        code=NEVER_SATISFIED,
        message=f"Its dependency can never be met: {why}.",
        notify_always=tell_owner,
    )


@transaction.atomic
def job_cancel(*, job: Job, actor: AbstractBaseUser | None, actor_kind: str = ActorKind.USER) -> Job:
    """Cancel a live job. An ended one is refused (IllegalTransition: the API's 409) saying so in words: "Job 7 is
    already cancelled.", "Job 7 has already ended (succeeded): there is nothing to cancel."."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state in TERMINAL_STATES:
        said = (
            f"Job {job.pk} is already cancelled."
            if job.state == JobState.CANCELLED
            else f"Job {job.pk} has already ended ({job.state}): there is nothing to cancel."
        )
        raise IllegalTransition(job.pk, job.state, JobState.CANCELLED, message=said)
    return job_transition(
        job=job,
        to_state=JobState.CANCELLED,
        actor_kind=actor_kind,
        actor=actor,
        code="cancelled",
        message=f"Cancelled by {actor or actor_kind}.",
    )


def job_cards_released(*, job: Job, node_id: int, node_name: str, message: str) -> bool:
    """An ended job's cards on a node it may have run on after it ended (its node was silent: "releasing") are
    free again: its agent confirmed the stop, or its fence has surely passed. Recorded on the job; whether any
    were held."""
    if not job_release_slices(job=job, on_node_ids=[node_id]):
        return False
    JobEvent.objects.create(
        job=job,
        from_state=job.state,
        to_state=job.state,
        actor_kind=ActorKind.SYSTEM,
        code="gpus_released",
        message=message,
        data={"node": node_name},
    )
    job_change_log_on_commit(
        job_id=job.pk, from_state=job.state, to_state=job.state, code="gpus_released", message=message
    )
    events.publish_after_commit(groups.CLUSTER, {"type": "node.changed", "node": node_name})
    events.job_changed(
        job_id=job.pk,
        team_id=job.team_id,
        submitter_id=job.submitter_id,
        state=job.state,
        code="gpus_released",
        message=message,
    )
    cycle_request_after_commit()
    return True


@transaction.atomic
def job_requeue(
    *, job: Job, actor: AbstractBaseUser | None, actor_kind: str = ActorKind.ADMIN, reason: str = ""
) -> Job:
    """Send a job back to the queue, keeping its submit time. Active jobs pass through preempted."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state in ACTIVE_STATES:
        job_transition(
            job=job,
            to_state=JobState.PREEMPTED,
            actor_kind=actor_kind,
            actor=actor,
            code="requeued",
            message=reason or "Requeued by an admin.",
        )
    return job_transition(
        job=job,
        to_state=JobState.PENDING,
        actor_kind=actor_kind,
        actor=actor,
        code="requeued",
        message=reason or "Requeued by an admin.",
    )
