"""Writes for jobs: submit, transitions, slices, a gang's members, cancel and requeue.

Every job state change goes through `job_transition`, which checks the state machine and appends a JobEvent.
Slices change the GPU ledger with `allocated = allocated + x` guarded in the same UPDATE, so two writers racing
for one card cannot both win; the CHECK constraints on Gpu are the last guard.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from portal import database
from portal.database import fetch_rows, update_from_values
from quotas.models import PriorityClass, Team
from quotas.selectors import ClassGrant, TeamAllowance, team_allowance
from scheduling.choices import ActorKind, GangMemberOutcome, JobState, SharingMode, Topology
from scheduling.cycle.requests import cycle_request_after_commit
from scheduling.engine import types as eng
from scheduling.engine.accounting import estimated_charge
from scheduling.errors import ServiceError
from scheduling.inventory import selectors as inventory
from scheduling.inventory.models import Gpu, Node
from scheduling.jobs.fields import (
    CANNOT_RUN,
    INCOMPATIBLE,
    MAX_CHECKPOINT_INTERVAL_S,
    MAX_GANG_NODES,
    MAX_GPUS_PER_JOB_NODE,
    MIN_CHECKPOINT_INTERVAL_S,
    JobSpec,
)
from scheduling.jobs.models import GangMember, Job, JobEvent, Slice
from scheduling.jobs.states import ACTIVE_STATES, TERMINAL_STATES, IllegalTransition, check_transition
from scheduling.notifications.services import job_events_wanted, job_state_notify
from scheduling.realtime import events

log = logging.getLogger("tessera.jobs")


class SliceDoesNotFit(ServiceError):
    pass


class NoRendezvousPort(ServiceError):
    pass


def _refuse(message: str, field_name: str, code: str = CANNOT_RUN) -> None:
    raise ServiceError(message, field=field_name, code=code)


def allowed_gpu_models(*, spec: JobSpec, models: list[inventory.GpuModelRow]) -> list[inventory.GpuModelRow]:
    """The GPU models a spec may run on: those it names (any, if none), with enough memory and architecture."""
    names = set(spec.gpu_models)
    return [
        m
        for m in models
        if (not names or m.name in names)
        and m.memory_mib >= spec.min_gpu_memory_mib
        and m.compute_capability >= spec.min_compute_capability
    ]


def largest_slice_mib(*, spec: JobSpec) -> int:
    """The largest slice the spec could hold: the memory of the largest allowed card the cluster has."""
    allowed = allowed_gpu_models(spec=spec, models=inventory.gpu_model_rows(installed_only=True))
    return max((m.memory_mib for m in allowed), default=0)


def job_spec_validate(*, spec: JobSpec) -> list[inventory.GpuModelRow]:
    """Refuse a spec that can never run on this cluster, naming the field and the limit. Returns the GPU models
    it may run on."""
    for name in ("gpus", "gpu_memory_mib", "compute_pct", "min_gpu_memory_mib", "cpu_milli", "memory_mib"):
        if getattr(spec, name) < 0:
            _refuse(f"{name} must not be negative (got {getattr(spec, name)}).", name)
    if not spec.name.strip():
        _refuse("name must not be empty.", "name")
    if not spec.command.strip():
        _refuse("command must not be empty.", "command")
    if spec.nodes < 1 or spec.nodes > MAX_GANG_NODES:
        _refuse(f"nodes must be between 1 and {MAX_GANG_NODES} (got {spec.nodes}).", "nodes")
    if spec.gpus > MAX_GPUS_PER_JOB_NODE:
        _refuse(f"gpus must be at most {MAX_GPUS_PER_JOB_NODE} per node (got {spec.gpus}).", "gpus")
    if spec.compute_pct > 100:
        _refuse(f"compute_pct is a share of one GPU: at most 100 (got {spec.compute_pct}).", "compute_pct")
    is_slice = spec.gpu_memory_mib > 0 or spec.compute_pct > 0
    if spec.gpus and is_slice:
        _refuse(
            "Ask for whole GPUs (gpus) or one slice (gpu_memory / compute_pct), not both.",
            "gpus",
            INCOMPATIBLE,
        )
    if spec.nodes > 1 and spec.gpus == 0:
        _refuse("A multi-node (gang) job needs whole GPUs on each node: set gpus.", "nodes", INCOMPATIBLE)
    if spec.topology not in Topology.values:
        _refuse(f"topology must be one of {', '.join(Topology.values)} (got {spec.topology!r}).", "topology")
    if spec.max_runtime_s is not None and spec.max_runtime_s <= 0:
        _refuse(f"max_runtime must be positive (got {spec.max_runtime_s} s).", "max_runtime")
    _refuse_bad_checkpoint_interval(spec.checkpoint_interval_s)

    inventory_now = inventory.catalogue()
    models = {m.name: m for m in inventory_now.models}
    unknown = [name for name in spec.gpu_models if name not in models]
    if unknown:
        known = ", ".join(sorted(models)) or "none registered"
        _refuse(f"Unknown GPU model {', '.join(unknown)}; known models: {known}.", "gpu_models")
    allowed = allowed_gpu_models(spec=spec, models=list(models.values()))
    if not allowed:
        _refuse(
            "No GPU model meets gpu_models, min_gpu_memory and min_compute_capability together.", "gpu_models"
        )
    if spec.gpu_memory_mib:
        # Only cards the cluster has: a model in the catalogue with no GPU here holds no slice.
        largest = max((m.memory_mib for m in allowed if m.installed), default=0)
        if spec.gpu_memory_mib > largest:
            _refuse(
                f"gpu_memory {spec.gpu_memory_mib} MiB is more than the largest allowed GPU has ({largest} MiB).",
                "gpu_memory",
            )
    if inventory_now.largest_node_cpu_milli is not None:
        cpu_milli = inventory_now.largest_node_cpu_milli
        memory_mib = inventory_now.largest_node_memory_mib or 0
        if spec.cpu_milli > cpu_milli:
            _refuse(
                f"cpu {spec.cpu_milli // 1000} cores per node can never be had: the largest node has "
                f"{cpu_milli // 1000}.",
                "cpu",
            )
        if spec.memory_mib > memory_mib:
            _refuse(
                f"memory {spec.memory_mib // 1024} GiB per node can never be had: the largest node has "
                f"{memory_mib // 1024} GiB.",
                "memory",
            )
    if spec.gpus:
        per_node, nodes_with_enough = inventory.whole_gpu_capacity(
            allowed_models={m.id for m in allowed}, topology=spec.topology, gpus=spec.gpus
        )
        if spec.gpus > per_node:
            what = {"nvlink": "NVLink-connected ", "numa": "same-NUMA "}.get(spec.topology, "")
            _refuse(
                f"{spec.gpus} {what}GPUs on one node can never be had: the most on any node is {per_node}.",
                "gpus",
            )
        if spec.nodes > nodes_with_enough:
            _refuse(
                f"A gang of {spec.nodes} nodes x {spec.gpus} GPUs needs {spec.nodes} such nodes; "
                f"the cluster has {nodes_with_enough}.",
                "nodes",
            )
    return allowed


def _refuse_bad_checkpoint_interval(seconds: float | None) -> None:
    if seconds is None:
        return
    low, high = MIN_CHECKPOINT_INTERVAL_S, MAX_CHECKPOINT_INTERVAL_S
    whole = isinstance(seconds, int) and not isinstance(seconds, bool)
    if whole and low <= seconds <= high:
        return
    raise ServiceError(
        f"checkpoint_interval_s must be a whole number of seconds from {low} (1 minute) to {high} (7 days) "
        f"(got {seconds!r}).",
        field="checkpoint_interval_s",
        limit=(low if seconds < low else high) if whole else None,
    )


def _priority_class_grant(*, spec: JobSpec, team: Team, allowance: TeamAllowance) -> ClassGrant:
    """The priority class the job asks for, or the team's default; refused when the team may not use it."""
    if not spec.priority:
        if allowance.default_class is None:
            if not allowance.known_classes:
                _refuse("No priority class exists; an admin must create one.", "priority", "unknown_priority")
            _refuse(
                f"Team {team.slug} may use no priority class; an admin must grant it one.",
                "priority",
                "priority_not_granted",
            )
        return allowance.grant_of(allowance.default_class.name)
    grant = allowance.grant_of(spec.priority)
    if grant is None:
        if spec.priority not in allowance.known_classes:
            _refuse(
                f"Unknown priority {spec.priority!r}; known: {', '.join(allowance.known_classes)}.",
                "priority",
                "unknown_priority",
            )
        raise ServiceError(
            f"priority {spec.priority} is not granted to team {team.slug}; team {team.slug} may use: "
            f"{allowance.classes_text()}.",
            field="priority",
            code="priority_not_granted",
        )
    return grant


def _gpus_words(gpus: Decimal) -> str:
    """12.000 -> "12 GPUs", 1 -> "1 GPU", 0.250 -> "0.25 GPUs"."""
    return f"{gpus.normalize():f} GPU{'' if gpus == 1 else 's'}"


def _gib_words(mib: int) -> str:
    return f"{mib / 1024:g} GiB"


def _refuse_beyond_team_limits(
    *,
    spec: JobSpec,
    team: Team,
    allowance: TeamAllowance,
    grant: ClassGrant,
    models: list[inventory.GpuModelRow],
) -> None:
    """Refuse a job that could not start even with nothing else of its team running: what it counts against
    quota is beyond the team's limit on GPUs or GPU memory, or its limit at the job's priority class. The count
    is the engine's estimate, a lower bound (each whole GPU counts the memory of the smallest card it may get),
    so only a job that surely can never start is refused; the rest wait in the queue."""
    request = eng.Request(
        gpus=spec.gpus,
        nodes=spec.nodes,
        gpu_memory_mib=spec.gpu_memory_mib,
        gpu_compute_milli=spec.compute_pct * 10,
        gpu_models=tuple(spec.gpu_models),
        min_gpu_memory_mib=spec.min_gpu_memory_mib,
    )
    # Model -> (smallest, largest) card memory: the catalogue's figure, widened by the cards installed.
    cards = {
        m.name: (
            min(m.memory_mib, m.smallest_card_mib or m.memory_mib),
            max(m.memory_mib, m.largest_card_mib or 0),
        )
        for m in models
    }
    memory_mib, compute_milli = estimated_charge(request, cards)
    cards_needed = spec.gpus * spec.nodes
    if spec.gpus:
        field_name = "gpus"
        needs = _gpus_words(Decimal(cards_needed))
        needs += f" ({spec.nodes} nodes x {spec.gpus})" if spec.nodes > 1 else ""
    else:
        field_name = "compute_pct" if spec.compute_pct else "gpu_memory"
        needs = f"{Decimal(compute_milli) / eng.WHOLE_GPU_MILLI:f} of a GPU"

    gpu_limits = [(allowance.limit_gpus, "(its limit)")]
    if grant.limit_gpus is not None:
        gpu_limits.append(
            (grant.limit_gpus, f"at priority {grant.priority_class.name} (its limit for that class)")
        )
    for limit, which in gpu_limits:
        if limit is not None and compute_milli > limit * eng.WHOLE_GPU_MILLI:
            raise ServiceError(
                f"{field_name}: this job needs {needs} but team {team.slug} may hold at most "
                f"{_gpus_words(limit)} {which}.",
                field=field_name,
                code="beyond_team_limit",
                limit=int(limit) if limit == limit.to_integral_value() else float(limit),
            )

    limit_mib = allowance.limit_gpu_memory_mib
    if limit_mib is not None and memory_mib > limit_mib:
        if spec.gpus:
            field_name = "gpus"
            needs = f"at least {_gib_words(memory_mib)} of GPU memory"
            needs += f" ({cards_needed} x a card of at least {_gib_words(memory_mib // cards_needed)})"
        else:
            field_name, needs = "gpu_memory", f"{_gib_words(memory_mib)} of GPU memory"
        raise ServiceError(
            f"{field_name}: this job needs {needs} but team {team.slug} may hold at most "
            f"{_gib_words(limit_mib)} (its limit).",
            field=field_name,
            code="beyond_team_limit",
            limit=f"{limit_mib}MiB",
        )


def job_spec_validate_for_team(*, spec: JobSpec, team: Team, allowance: TeamAllowance) -> PriorityClass:
    """Refuse what this team can never run, naming the field and the limit: what the cluster can never give
    (`job_spec_validate`), a priority class the team may not use, a job beyond the team's limits. Returns the
    priority class the job runs at."""
    models = job_spec_validate(spec=spec)
    grant = _priority_class_grant(spec=spec, team=team, allowance=allowance)
    priority_class = grant.priority_class
    if spec.preemptible and not priority_class.preemptible:
        # Refused rather than quietly turned off: whoever asked for it expects to be evictable.
        raise ServiceError(
            f"priority class {priority_class.name} is never preempted; drop preemptible or choose another "
            "priority.",
            field="preemptible",
            code=INCOMPATIBLE,
        )
    _refuse_beyond_team_limits(spec=spec, team=team, allowance=allowance, grant=grant, models=models)
    return priority_class


def _insert_values(obj: Any) -> tuple[list[str], list[Any]]:
    """Columns and database values of a new row, as `Model.save` would write them (defaults, auto_now_add)."""
    fields = [f for f in obj._meta.concrete_fields if not f.primary_key]
    return [f.column for f in fields], [
        f.get_db_prep_save(f.pre_save(obj, True), connection=connection) for f in fields
    ]


def _insert_job_and_event(*, job: Job, event: JobEvent) -> None:
    """INSERT a new job and its first event. On PostgreSQL it is one statement (a data-modifying CTE): one
    round trip and no ORM save machinery per submit; other databases take the two ordinary saves."""
    if not database.postgresql():
        job.save(force_insert=True)
        event.job = job
        event.save(force_insert=True)
        return
    job_columns, job_values = _insert_values(job)
    event_columns, event_values = _insert_values(event)
    at = event_columns.index("job_id")
    del event_columns[at], event_values[at]
    marks = ", ".join(["%s"] * len(event_values))
    rows = fetch_rows(
        f"""
        WITH new_job AS (
            INSERT INTO {Job._meta.db_table} ({", ".join(job_columns)})
            VALUES ({", ".join(["%s"] * len(job_values))}) RETURNING id
        )
        INSERT INTO {JobEvent._meta.db_table} (job_id, {", ".join(event_columns)})
        SELECT new_job.id, {marks} FROM new_job RETURNING job_id, id""",
        [*job_values, *event_values],
    )
    job.pk, event.pk = rows[0]
    event.job = job
    for obj in (job, event):
        obj._state.adding, obj._state.db = False, connection.alias


def job_from_spec(
    *, submitter: AbstractBaseUser, team: Team, spec: JobSpec, priority_class: PriorityClass
) -> Job:
    """The job row a spec makes (not saved): submit stores it, the what-if asks the engine about it."""
    return Job(
        team=team,
        submitter=submitter,
        name=spec.name,
        command=spec.command,
        env=dict(spec.env),
        gpus=spec.gpus,
        gpu_memory_mib=spec.gpu_memory_mib,
        compute_pct=spec.compute_pct,
        gpu_models=list(spec.gpu_models),
        min_gpu_memory_mib=spec.min_gpu_memory_mib,
        min_compute_capability=spec.min_compute_capability,
        topology=spec.topology,
        nodes=spec.nodes,
        cpu_milli=spec.cpu_milli,
        memory_mib=spec.memory_mib,
        priority_class=priority_class,
        preemptible=priority_class.preemptible if spec.preemptible is None else spec.preemptible,
        max_runtime_s=spec.max_runtime_s,
        checkpoint_interval_s=spec.checkpoint_interval_s,
        requeue_on_node_loss=spec.requeue_on_node_loss,
        workdir=spec.workdir,
        notify=None if spec.notify is None else list(spec.notify),
    )


def job_spec_of(job: Job) -> JobSpec:
    """The spec that submits this job again (its priority class by name): job_from_spec's inverse."""
    return JobSpec(
        name=job.name,
        command=job.command,
        env=dict(job.env or {}),
        gpus=job.gpus,
        gpu_memory_mib=job.gpu_memory_mib,
        compute_pct=job.compute_pct,
        gpu_models=tuple(job.gpu_models or ()),
        min_gpu_memory_mib=job.min_gpu_memory_mib,
        min_compute_capability=job.min_compute_capability,
        topology=job.topology,
        nodes=job.nodes,
        cpu_milli=job.cpu_milli,
        memory_mib=job.memory_mib,
        priority=job.priority_class.name,
        preemptible=job.preemptible,
        max_runtime_s=job.max_runtime_s,
        checkpoint_interval_s=job.checkpoint_interval_s,
        requeue_on_node_loss=job.requeue_on_node_loss,
        workdir=job.workdir,
        notify=None if job.notify is None else tuple(job.notify),
    )


@transaction.atomic
def job_submit(*, submitter: AbstractBaseUser, team: Team, spec: JobSpec) -> Job:
    """Accept a job into the queue. A job within the cluster and its team's limits but over quota now is accepted
    and waits."""
    allowance = team_allowance(team=team, user=submitter)
    if not submitter.is_staff and not allowance.is_member:
        raise ServiceError(f"You are not a member of team {team.slug}.", field="team", code="not_member")
    priority_class = job_spec_validate_for_team(spec=spec, team=team, allowance=allowance)
    job = job_from_spec(submitter=submitter, team=team, spec=spec, priority_class=priority_class)
    job.pending_reason_code, job.pending_reason = "queued", "Waiting for the next scheduling cycle."
    event = JobEvent(
        from_state="",
        to_state=JobState.PENDING,
        actor_kind=ActorKind.USER,
        actor=submitter,
        code="submitted",
        message=f"Submitted by {submitter} to {team.slug}.",
    )
    _insert_job_and_event(job=job, event=event)
    _log_change_on_commit(
        job_id=job.id, from_state="", to_state=job.state, code="submitted", message=event.message
    )
    events.job_changed(
        job_id=job.id, team_id=team.id, submitter_id=submitter.pk, state=job.state, code="submitted"
    )
    cycle_request_after_commit()
    return job


def _log_change_on_commit(*, job_id: int, from_state: str, to_state: str, code: str, message: str) -> None:
    """The one log line of a job's state change (every change goes through job_submit or job_transition), written
    once it is committed: a change rolled back (a placement the ledger refused) never happened."""
    arrow = f"{from_state} -> {to_state}" if from_state else to_state
    text = f"job {job_id}: {arrow} ({code or 'no code'})" + (f": {message}" if message else "")
    transaction.on_commit(lambda: log.info("%s", text, extra={"job_id": job_id}))


def _enter_state(
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
) -> Job:
    """Move a job along a legal transition and record it. Raises IllegalTransition otherwise. `happened_at`: when
    it really happened, for a report that arrives late (a job that ended while its node could not reach the
    portal); the job's start or end time is then that moment, never later than now nor before it was placed."""
    from_state = job.state
    check_transition(job_id=job.pk, from_state=from_state, to_state=to_state)
    now = timezone.now()
    at = now
    if happened_at is not None:
        at = min(happened_at, now)
        earliest = job.started_at if to_state in TERMINAL_STATES and job.started_at else job.placed_at
        if earliest is not None:
            at = max(at, earliest)
    update = _enter_state(job, to_state=to_state, now=now, at=at, code=code, message=message)
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
    _log_change_on_commit(job_id=job.pk, from_state=from_state, to_state=to_state, code=code, message=message)
    if from_state in ACTIVE_STATES and to_state not in ACTIVE_STATES:
        # The agents running it must stop it: their desired state changed.
        for node_name in set(Slice.objects.filter(job=job).values_list("gpu__node__name", flat=True)):
            events.node_desired_state_changed(node_name=node_name)
        job_release_slices(job=job)
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
    )
    job_state_notify(job=job, from_state=from_state, to_state=to_state, message=message)
    return job


def _slice_check(*, gpu: Gpu, memory_mib: int, compute_pct: int) -> None:
    """Refuse a slice no card could hold this way, whatever it has free (SliceDoesNotFit)."""
    if memory_mib < 0 or compute_pct < 0:
        raise SliceDoesNotFit("A slice cannot be negative.", field="memory_mib")
    if gpu.sharing_mode == SharingMode.EXCLUSIVE and (memory_mib, compute_pct) != (gpu.memory_mib, 100):
        raise SliceDoesNotFit(f"{gpu} is exclusive: only whole-GPU jobs may use it.", field="gpu")


def slice_allocate(*, job: Job, gpu: Gpu, memory_mib: int, compute_pct: int) -> Slice:
    """Take part of one GPU for a job, or refuse cleanly if it no longer fits.

    The check and the increment are one UPDATE, so concurrent allocations of the same card serialise in the
    database: exactly one of two racing writers wins the last free memory.
    """
    _slice_check(gpu=gpu, memory_mib=memory_mib, compute_pct=compute_pct)
    with transaction.atomic():
        updated = Gpu.objects.filter(
            pk=gpu.pk,
            allocated_memory_mib__lte=F("memory_mib") - memory_mib,
            allocated_compute_pct__lte=F("compute_capacity_pct") - compute_pct,
        ).update(
            allocated_memory_mib=F("allocated_memory_mib") + memory_mib,
            allocated_compute_pct=F("allocated_compute_pct") + compute_pct,
        )
        if not updated:
            gpu.refresh_from_db(fields=["allocated_memory_mib", "allocated_compute_pct"])
            raise SliceDoesNotFit(
                f"{gpu} has {gpu.free_memory_mib} MiB and {gpu.free_compute_pct}% compute free; "
                f"the slice needs {memory_mib} MiB and {compute_pct}%.",
                field="memory_mib" if memory_mib > gpu.free_memory_mib else "compute_pct",
                code="does_not_fit",
            )
        return Slice.objects.create(job=job, gpu=gpu, memory_mib=memory_mib, compute_pct=compute_pct)


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


class _LedgerRefused(Exception):
    """Raised inside jobs_place's savepoint to roll the whole batch back."""


def jobs_place(*, placements: list[PlacementWrite]) -> bool:
    """Place many pending single-node jobs in a few statements, all or none: one guarded UPDATE of the GPU
    ledger for every card, one UPDATE of the jobs, one INSERT of their events and one of their slices.

    The ledger's guard is the one slice_allocate applies card by card (memory and compute within what the card
    has free, the CHECK constraints behind it); if it refuses any card, nothing is written and False comes back
    (the jobs as they were): the caller then places them one at a time, each in its own savepoint, to find
    which. A cycle placing thousands of jobs spent ~30 ms a job in the one-at-a-time path (bench/cluster_scale.py).
    On PostgreSQL; elsewhere the caller takes the one-at-a-time path.
    """
    if not placements:
        return True
    for p in placements:
        check_transition(job_id=p.job.pk, from_state=p.job.state, to_state=JobState.PLACED)
        if p.job.nodes > 1:
            raise ValueError(f"job {p.job.pk} is a gang: place it with job_transition and gang_members_place")
        try:
            for want in p.slices:
                _slice_check(gpu=want.gpu, memory_mib=want.memory_mib, compute_pct=want.compute_pct)
        except SliceDoesNotFit:
            return False  # the one-at-a-time path refuses that placement alone, saying why
    per_gpu: dict[int, list[int]] = {}
    for p in placements:
        for want in p.slices:
            total = per_gpu.setdefault(want.gpu.pk, [0, 0])
            total[0] += want.memory_mib
            total[1] += want.compute_pct
    now = timezone.now()
    before = [(p.job.state, p.job.borrowed) for p in placements]
    try:
        with transaction.atomic():
            _ledger_take(per_gpu)
            update: list[str] = []
            for p in placements:
                update = _enter_state(
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
                raise _LedgerRefused(f"{len(placements) - len(written)} jobs no longer pending")
            changes = [
                (p.job, state, p.message, p.data) for p, (state, _) in zip(placements, before, strict=True)
            ]
            _changes_record(changes, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER, code="placed")
            Slice.objects.bulk_create(
                [
                    Slice(job=p.job, gpu=w.gpu, memory_mib=w.memory_mib, compute_pct=w.compute_pct)
                    for p in placements
                    for w in p.slices
                ],
                batch_size=2000,
            )
    except _LedgerRefused as exc:
        log.info("placing %d jobs at once refused (%s): placing them one at a time", len(placements), exc)
        for p in placements:
            p.job.refresh_from_db()
        return False
    _changes_tell(changes, to_state=JobState.PLACED, code="placed")
    return True


def _changes_record(
    changes: list[tuple[Job, str, str, dict[str, Any]]], *, to_state: str, actor_kind: str, code: str
) -> None:
    """The events of many jobs' changes to `to_state` ((job, from state, message, data) each), in one INSERT."""
    JobEvent.objects.bulk_create(
        [
            JobEvent(
                job=job,
                from_state=from_state,
                to_state=to_state,
                actor_kind=actor_kind,
                code=code,
                message=message,
                data=data,
            )
            for job, from_state, message, data in changes
        ],
        batch_size=2000,
    )


def _changes_tell(changes: list[tuple[Job, str, str, dict[str, Any]]], *, to_state: str, code: str) -> None:
    """What job_transition says of each change once written: its log line, its owner's notifications (their
    defaults read once for all), the browsers' events (one commit hook)."""
    defaults = job_events_wanted(user_ids={job.submitter_id for job, *_ in changes if job.notify is None})
    for job, from_state, message, _ in changes:
        _log_change_on_commit(
            job_id=job.pk, from_state=from_state, to_state=to_state, code=code, message=message
        )
        job_state_notify(
            job=job, from_state=from_state, to_state=to_state, message=message, defaults=defaults
        )
    events.jobs_changed(
        changes=[
            (job.pk, job.team_id, job.submitter_id, to_state, code, message) for job, _, message, _ in changes
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
    served 1,000 nodes (bench/cluster_scale.py); on PostgreSQL, elsewhere one job_transition each."""
    if not starts:
        return
    for s in starts:
        check_transition(job_id=s.job.pk, from_state=s.job.state, to_state=JobState.RUNNING)
        if s.job.nodes > 1:
            raise ValueError(f"job {s.job.pk} is a gang: its members start one by one (gang_member_started)")
    if not database.postgresql():
        for s in starts:
            job_transition(
                job=s.job,
                to_state=JobState.RUNNING,
                actor_kind=ActorKind.AGENT,
                code="started",
                message=s.message,
                data=s.data,
            )
        return
    now = timezone.now()
    before = [s.job.state for s in starts]
    for s in starts:
        _enter_state(s.job, to_state=JobState.RUNNING, now=now, at=now, code="started", message=s.message)
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


def _ledger_take(per_gpu: dict[int, list[int]]) -> None:
    """Add (memory MiB, compute %) to each GPU's allocation in one UPDATE, each card only if it stays within
    what it has; raises _LedgerRefused (the caller's savepoint rolls back) if any card refuses."""
    table = Gpu._meta.db_table
    rows = sorted(per_gpu.items())  # one lock order for every writer of the ledger
    taken = fetch_rows(
        f"UPDATE {table} AS g SET allocated_memory_mib = g.allocated_memory_mib + v.memory_mib, "
        "allocated_compute_pct = g.allocated_compute_pct + v.compute_pct "
        "FROM unnest(%s::integer[], %s::integer[], %s::integer[]) AS v(id, memory_mib, compute_pct) "
        "WHERE g.id = v.id AND g.allocated_memory_mib <= g.memory_mib - v.memory_mib "
        "AND g.allocated_compute_pct <= g.compute_capacity_pct - v.compute_pct RETURNING g.id",
        [
            [gpu_id for gpu_id, _ in rows],
            [memory_mib for _, (memory_mib, _) in rows],
            [compute_pct for _, (_, compute_pct) in rows],
        ],
    )
    if len(taken) != len(rows):
        refused = sorted(set(per_gpu) - {r[0] for r in taken})
        raise _LedgerRefused(f"GPU ids {refused[:5]} have less free than the batch takes")


def job_release_slices(*, job: Job) -> int:
    """Give back every slice the job holds; returns how many were released."""
    released = 0
    for sl in Slice.objects.select_for_update().filter(job=job).order_by("gpu_id"):
        Gpu.objects.filter(pk=sl.gpu_id).update(
            allocated_memory_mib=F("allocated_memory_mib") - sl.memory_mib,
            allocated_compute_pct=F("allocated_compute_pct") - sl.compute_pct,
        )
        sl.delete()
        released += 1
    return released


def gang_members_place(*, job: Job, nodes: list[Node]) -> list[GangMember]:
    """Record the members of a multi-node job's new placement: ranks in node-name order (the order the placement
    event lists them), each node's address as of now, and on rank 0 a rendezvous port from
    TESSERA_GANG_PORT_FIRST..LAST that no other live gang uses on that address. Raises NoRendezvousPort when all
    are taken (the placement is refused and retried next cycle)."""
    ordered = sorted(nodes, key=lambda n: n.name)
    master = ordered[0].reachable_address
    taken = set(GangMember.objects.filter(rank=0, address=master).values_list("port", flat=True))
    first, last = settings.TESSERA_GANG_PORT_FIRST, settings.TESSERA_GANG_PORT_LAST
    port = next((p for p in range(first, last + 1) if p not in taken), None)
    if port is None:
        raise NoRendezvousPort(
            f"every rendezvous port {first}-{last} on {master} is held by a running gang", code="no_port"
        )
    return GangMember.objects.bulk_create(
        [
            GangMember(
                job=job,
                attempt=job.attempt,
                node=node,
                rank=rank,
                address=node.reachable_address,
                port=port if rank == 0 else None,
            )
            for rank, node in enumerate(ordered)
        ]
    )


def gang_member_started(*, job: Job, node: Node) -> bool:
    """Its agent reported the member started (once); returns whether this was news."""
    return bool(
        GangMember.objects.filter(job=job, attempt=job.attempt, node=node, started_at__isnull=True).update(
            started_at=timezone.now()
        )
    )


def gang_member_end(
    *, member: GangMember, outcome: str, reported_state: str, exit_code: int | None, reason: str = ""
) -> GangMember:
    """Record how one member ended. The caller holds the job's row lock, so reports about one gang apply one
    after the other."""
    member.outcome = outcome
    member.reported_state = reported_state[:20]
    member.exit_code = exit_code
    member.reason = reason[:200]
    member.ended_at = timezone.now()
    member.save(update_fields=["outcome", "reported_state", "exit_code", "reason", "ended_at"])
    return member


def gang_members_unstarted_stop(*, job: Job) -> list[GangMember]:
    """A member failed: members whose agents never reported them started will not be started now (their nodes'
    desired states drop the job), so they have ended, stopped, without a report."""
    unstarted = list(
        GangMember.objects.filter(
            job=job, attempt=job.attempt, outcome=GangMemberOutcome.RUNNING, started_at__isnull=True
        ).select_related("node")
    )
    for member in unstarted:
        gang_member_end(
            member=member, outcome=GangMemberOutcome.STOPPED, reported_state="not_started", exit_code=None
        )
    return unstarted


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
