"""Reads for jobs: what a user may see, the queue in the scheduler's order, who may cancel what, and gangs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, F, Prefetch, Q, QuerySet
from django.utils import timezone

from quotas.choices import Role
from quotas.selectors import team_ids_for_user, team_role_of
from scheduling.choices import GangMemberOutcome, JobState
from scheduling.cycle import node_loss
from scheduling.cycle.liveness import SCHEDULER_STALLED, scheduler_stall
from scheduling.jobs.array_indexes import TaskIndexes
from scheduling.jobs.models import GangMember, Job, JobEvent, LogDrain, Slice
from scheduling.jobs.states import ACTIVE_STATES, TERMINAL_STATES
from scheduling.jobs.wording import reason_in_general


def jobs_visible_to(*, user: AbstractBaseUser) -> QuerySet[Job]:
    """Jobs a user may see in full: staff see all, others their teams' jobs."""
    jobs = Job.objects.select_related("team", "submitter", "priority_class")
    if user.is_staff:
        return jobs
    return jobs.filter(team_id__in=team_ids_for_user(user=user))


def queue() -> QuerySet[Job]:
    """Pending jobs in the order the last scheduling cycle saw them."""
    return (
        Job.objects.filter(state=JobState.PENDING)
        .select_related("team", "submitter", "priority_class")
        .order_by(F("queue_position").asc(nulls_last=True), "submitted_at", "id")
    )


def can_cancel_job(*, user: AbstractBaseUser, job: Job) -> bool:
    """Staff: any job; a team admin: any job of the team; a member: their own jobs."""
    if user.is_staff:
        return True
    role = team_role_of(user=user, team_id=job.team_id)  # None: not a member
    return role == Role.TEAM_ADMIN or (role is not None and job.submitter_id == user.pk)


def job_team_and_state(*, job_id: int) -> tuple[int, str] | None:
    """The team and state of a job (None when there is no such job)."""
    return Job.objects.filter(pk=job_id).values_list("team_id", "state").first()


def job_in_teams(*, job_id: int, team_ids: set[int]) -> bool:
    return Job.objects.filter(pk=job_id, team_id__in=team_ids).exists()


def job_request_fields(job: Job) -> dict[str, Any]:
    """What a job asks for, as the API and the pages show it."""
    return {
        "gpus": job.gpus,
        "gpu_memory_mib": job.gpu_memory_mib,
        "compute_pct": job.compute_pct,
        "gpu_models": job.gpu_models,
        "min_gpu_memory_mib": job.min_gpu_memory_mib,
        "min_compute_capability": f"{job.min_compute_capability:.1f}",
        "topology": job.topology,
        "nodes": job.nodes,
        "cpu_milli": job.cpu_milli,
        "memory_mib": job.memory_mib,
        "max_runtime_s": job.max_runtime_s,
        "checkpoint_interval_s": job.checkpoint_interval_s,
    }


def _request_gpu_equivalents(job: Job) -> float | None:
    if job.gpus:
        return float(job.gpus * job.nodes)
    if job.compute_pct and not job.gpu_memory_mib:
        return job.compute_pct / 100
    return None  # a memory slice's share depends on the card it lands on


def _queue_positions(jobs: list[Job]) -> dict[int, int]:
    """Each job's place in the whole queue, whatever filter picked it.

    The scheduling cycle writes `queue_position`; a job it has not seen yet (just submitted, or no cycle has
    run) ranks after every positioned job, in submit order, as `queue` orders them: the count of
    positioned pending jobs plus its rank among the unpositioned ones.
    """
    positions = {job.pk: job.queue_position for job in jobs if job.queue_position is not None}
    unpositioned = [job for job in jobs if job.queue_position is None]
    if not unpositioned:
        return positions
    pending = Job.objects.filter(state=JobState.PENDING)
    positioned = pending.filter(queue_position__isnull=False).count()
    latest = max(job.submitted_at for job in unpositioned)
    ahead = (
        pending.filter(queue_position__isnull=True, submitted_at__lte=latest)
        .order_by("submitted_at", "id")
        .values_list("id", flat=True)
    )
    rank = {job_id: positioned + i for i, job_id in enumerate(ahead, start=1)}
    for job in unpositioned:
        # A job that left the queue between the two reads keeps a place after the others.
        positions[job.pk] = rank.get(job.pk, positioned + len(rank) + 1)
    return positions


def queue_entries(*, user: AbstractBaseUser, jobs: list[Job]) -> list[dict[str, Any]]:
    """Queue rows as this user may see them: in full for their teams' jobs (staff: all), others anonymous (no
    id, name, user or reason text). The API's queue and the portal's queue page both show exactly these."""
    positions = _queue_positions(jobs)
    mine_ids = None if user.is_staff else team_ids_for_user(user=user)
    now = timezone.now()
    entries = []
    for job in jobs:
        mine = mine_ids is None or job.team_id in mine_ids
        entries.append(
            {
                "position": positions[job.pk],
                "mine": mine,
                "id": job.pk if mine else None,
                "name": job.name if mine else None,
                "user": job.submitter.username if mine else None,
                "team": job.team.slug,
                "priority": job.priority_class.name,
                "priority_value": job.priority_class.value,
                "request": job_request_fields(job),
                "gpu_equivalents": _request_gpu_equivalents(job),
                "submitted_at": job.submitted_at,
                "wait_s": int((now - job.submitted_at).total_seconds()),
                "pending_reason_code": pending_reason(job)[0],
                "pending_reason": pending_reason(job)[1] if mine else None,
                "pending_reason_general": reason_in_general(pending_reason(job)[0]),
                "estimated_start_at": job.estimated_start_at,
            }
        )
    return entries


JOB_SCOPES = ("mine", "teams", "all")


def jobs_for_user(
    *,
    user: AbstractBaseUser,
    scope: str = "mine",
    state: str = "",
    team: str = "",
    search: str = "",
    array: int | None = None,
) -> QuerySet[Job]:
    """The jobs list as the portal shows it: the user's own, their teams' or (staff only) everyone's, newest
    first, filtered by state, team slug and a name fragment; an array as one line, or (`array`) its tasks. Never
    more than `jobs_visible_to`."""
    jobs = jobs_visible_to(user=user)  # staff: everyone's; others: their teams'
    jobs = array_tasks_of(jobs, array_id=array) if array is not None else array_lines(jobs)
    if scope not in ("teams", "all"):
        jobs = jobs.filter(submitter=user)
    if state:
        jobs = jobs_in_states(jobs, [state], lines=array is None)
    if team:
        jobs = jobs.filter(team__slug=team)
    if search:
        jobs = jobs.filter(name__icontains=search)
    return jobs.order_by("-submitted_at", "-id")


def job_for_user(*, user: AbstractBaseUser, job_id: int) -> Job | None:
    """One job with what it holds, if this user may see it (None otherwise: a 404, never a 403)."""
    return (
        jobs_visible_to(user=user)
        .prefetch_related(
            Prefetch(
                "slices", queryset=Slice.objects.select_related("gpu__node", "gpu__model").order_by("gpu_id")
            )
        )
        .filter(pk=job_id)
        .first()
    )


# How long after a placement ended its logs are still waited for (its agent reconnecting, a busy portal) before
# readers are told the log is complete. A node that comes back later still delivers them.
LOG_DRAIN_WAIT_S = 120


def job_logs_complete(*, job: Job) -> bool:
    """The job has finished and its agents' last lines are here (or no longer expected soon): its log will not
    grow."""
    if job.state not in TERMINAL_STATES:
        return False
    since = timezone.now() - timedelta(seconds=LOG_DRAIN_WAIT_S)
    return not LogDrain.objects.filter(job=job, created_at__gt=since).exists()


def job_events(*, job: Job) -> list[JobEvent]:
    return list(job.events.select_related("actor").order_by("at", "id"))


def queue_for_user(*, user: AbstractBaseUser, team: str = "", model: str = "") -> QuerySet[Job]:
    """The queue as the portal filters it: one team, or the jobs that may run on one GPU model."""
    jobs = queue()
    if team:
        jobs = jobs.filter(team__slug=team)
    if model:
        jobs = jobs.filter(Q(gpu_models=[]) | Q(gpu_models__icontains=f'"{model}"'))
    return jobs


def jobs_in_order(*, ids: list[int]) -> list[Job]:
    """These jobs, with their team, submitter and class, in the order given. A page of a long list is its ids
    first (sorting 10,000 narrow rows, not 10,000 joined wide ones: 12 ms, not 50, at 10,000 pending), then
    this; a job gone meanwhile is left out."""
    found = Job.objects.select_related("team", "submitter", "priority_class").in_bulk(ids)
    return [found[i] for i in ids if i in found]


# Pending reason codes -> what the wait is for, in the job page's "time to start" bar.
_WAIT_KIND = {
    "quota-limit": "quota",
    "quota-never": "quota",
    "model-quota-limit": "quota",
    "reserved": "reserved",
    "waiting-for-reservation": "reserved",
}
PHASE_LABELS = {
    "quota": "waiting for quota",
    "capacity": "waiting for capacity",
    "reserved": "reserved, waiting for its cards",
    "starting": "starting",
    "running": "running",
    "grace": "preemption grace",
    "stopping": "a member failed: stopping the others",
    "lost": "node lost",
    "queued": "waiting in the queue",
}


def job_phases(*, job: Job, events: list[JobEvent]) -> list[dict[str, Any]]:
    """The job's life as consecutive phases [{kind, label, start, end, seconds}], from its events: each wait
    (labelled by the reason it waits for now, when it still waits), start-up, running, preemption grace, a failing
    gang stopping its other members. A job that waits or runs still has an open last phase ending now."""
    phases: list[dict[str, Any]] = []
    now = timezone.now()

    def kind_for(state: str) -> str | None:
        if state == JobState.PENDING:
            return _WAIT_KIND.get(job.pending_reason_code, "capacity")
        return {
            JobState.PLACED: "starting",
            JobState.STARTING: "starting",
            JobState.RUNNING: "running",
            JobState.PREEMPTED: "grace",
            JobState.LOST: "lost",
        }.get(state)

    for event in events:
        if not event.to_state:
            continue
        stopping = event.code == "gang_member_failed"
        if event.from_state == event.to_state and not stopping:
            continue  # an event within a phase (a gang member's exit, prevented interference)
        if phases and phases[-1]["end"] is None:
            phases[-1]["end"] = event.at
        kind = "stopping" if stopping else kind_for(event.to_state)
        if kind is not None:
            phases.append({"kind": kind, "label": PHASE_LABELS[kind], "start": event.at, "end": None})
    for phase in phases:
        if phase["end"] is not None and phase["kind"] in ("quota", "capacity", "reserved"):
            # A wait that is over: what it waited for is not recorded, only the current reason is.
            phase["kind"], phase["label"] = "queued", PHASE_LABELS["queued"]
        end = phase["end"] or now
        phase["seconds"] = max(0.0, (end - phase["start"]).total_seconds())
        phase["open"] = phase["end"] is None  # still going: its length counts on in the page
    return phases


def gang_members_of(*, job_ids: Iterable[int]) -> dict[int, list[GangMember]]:
    """The members of these multi-node jobs' current placements, by job id, in rank order."""
    out: dict[int, list[GangMember]] = defaultdict(list)
    members = GangMember.objects.filter(job_id__in=list(job_ids)).select_related("node", "job")
    for member in members.order_by("job_id", "rank"):
        if member.attempt == member.job.attempt:
            out[member.job_id].append(member)
    return dict(out)


def gang_first_failure(*, job: Job) -> GangMember | None:
    """The member whose failure decided the gang's outcome (the first to fail), if one has failed."""
    return (
        GangMember.objects.filter(job=job, attempt=job.attempt, outcome=GangMemberOutcome.FAILED)
        .select_related("node")
        .order_by("ended_at", "rank")
        .first()
    )


def gangs_failing(*, job_ids: Iterable[int]) -> set[int]:
    """Which of these jobs are gangs with a failed member, whose other members are being stopped."""
    return set(
        GangMember.objects.filter(job_id__in=list(job_ids), outcome=GangMemberOutcome.FAILED)
        .filter(attempt=F("job__attempt"))
        .values_list("job_id", flat=True)
    )


IDLE_HOLD = "idle_hold"  # requeued for idleness, held back a while (scheduling/cycle/idle.py)


def pending_reason(job: Job) -> tuple[str, str]:
    """(code, sentence) of why a job waits, as people are told it: what the last cycle said, unless the scheduler
    is not running at all; then that (scheduling.cycle.liveness)."""
    if job.state == JobState.PENDING and (
        stall := scheduler_stall(waiting_since=job.submitted_at.timestamp())
    ):
        return SCHEDULER_STALLED, stall
    if job.state == JobState.PENDING and job.hold_until is not None and job.hold_until > timezone.now():
        until = timezone.localtime(job.hold_until).strftime("%H:%M")
        return IDLE_HOLD, (
            f"Its GPUs were given back after they sat idle; it waits until {until} so the work that waited for "
            "them goes first."
        )
    return job.pending_reason_code, job.pending_reason


def job_team_ids(*, job_ids: list[int]) -> dict[int, int]:
    """job id -> its team's id (routing a node's samples to its jobs' teams)."""
    if not job_ids:
        return {}
    return dict(Job.objects.filter(pk__in=job_ids).values_list("pk", "team_id"))


# -- a job whose node is silent ------------------------------------------------------------------------------------
NODE_NOT_RESPONDING = "node_not_responding"
RELEASING = "releasing"


@dataclass(frozen=True)
class NodeSilence:
    """A live job on a node the portal has not heard for longer than TESSERA_NODE_LOST_AFTER_S (Slurm's NODE_FAIL
    shown before anything is done about it), or an ended job whose cards there wait for its stop ("releasing")."""

    code: str  # NODE_NOT_RESPONDING or RELEASING
    node: str
    since: datetime  # when the node was last heard
    until: datetime  # when the job has surely stopped there (its fence), if the node stays silent
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "node": self.node,
            "since": self.since,
            "until": self.until,
            "message": self.message,
        }


def job_node_silence(*, job: Job) -> NodeSilence | None:
    """Whether the job is on a silent node. A job read with its slices and their nodes (`job_for_user`) is answered
    from them, without a query."""
    if "slices" not in getattr(job, "_prefetched_objects_cache", {}):
        return jobs_node_silence(jobs=[job]).get(job.pk)
    if job.state not in ACTIVE_STATES and job.state not in TERMINAL_STATES:
        return None
    now = timezone.now()
    silent = {
        sl.gpu.node.name: sl.gpu.node.last_heartbeat_at or sl.gpu.node.created_at
        for sl in job.slices.all()
        if node_loss.node_is_silent(node=sl.gpu.node, now=now)
    }
    return _silence(job, min(silent.items(), key=lambda pair: pair[1])) if silent else None


def jobs_node_silence(*, jobs: Iterable[Job]) -> dict[int, NodeSilence]:
    """job id -> NodeSilence, for those of these jobs that hold cards on a silent node (node_loss.silent_filter):
    one query over these jobs' own nodes, however many others are silent (in an outage, all of them)."""
    from scheduling.inventory.models import Node

    holding = {j.pk: j for j in jobs if j.state in ACTIVE_STATES or j.state in TERMINAL_STATES}
    if not holding:
        return {}
    silent = Node.objects.filter(node_loss.silent_filter(now=timezone.now())).values("pk")
    held: dict[int, list[tuple[str, datetime]]] = defaultdict(list)
    for job_id, name, heard, created in (
        Slice.objects.filter(job_id__in=list(holding), gpu__node_id__in=silent)
        .values_list("job_id", "gpu__node__name", "gpu__node__last_heartbeat_at", "gpu__node__created_at")
        .distinct()
    ):
        held[job_id].append((name, heard or created))
    return {
        job_id: _silence(holding[job_id], min(on, key=lambda pair: pair[1])) for job_id, on in held.items()
    }


def _silence(job: Job, on: tuple[str, datetime]) -> NodeSilence:
    name, since = on
    until = node_loss.surely_stopped_at(last_heard_at=since, grace_s=job.priority_class.preemption_grace_s)
    heard = f"node {name} has not responded since {since:%H:%M:%S} UTC"
    if job.state in TERMINAL_STATES:
        return NodeSilence(
            RELEASING,
            name,
            since,
            until,
            f"Its GPUs on {name} are held (releasing) until the node's agent confirms the job has stopped, or "
            f"until its fence has surely stopped it (about {until:%H:%M} UTC): {heard}.",
        )
    then = (
        "placed again"
        if job.requeue_on_node_loss
        else "failed (it asked not to be requeued when its node is lost)"
    )
    return NodeSilence(
        NODE_NOT_RESPONDING,
        name,
        since,
        until,
        f"{heard[0].upper()}{heard[1:]}: the job may still be running there. If the node stays silent, its "
        f"supervisor stops it at its fence and it is {then} after about {until:%H:%M} UTC.",
    )


# --- Job arrays: one line each (its first row), its tasks, its counts by state --------------------------------
# The first row holds the tasks not yet placed (`array_pending`); counts add up the task rows, those runs, and
# the tasks cancelled before they were ever placed.


def array_lines(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """One line per array (its first row) and every job that is not in one: the tasks split off are left out."""
    return jobs.filter(Q(array_job_id__isnull=True) | Q(array_job_id=F("pk")))


def jobs_in_states(jobs: QuerySet[Job], states: Iterable[str], *, lines: bool = True) -> QuerySet[Job]:
    """The jobs in any of these states. Where `jobs` lists arrays as lines (`array_lines`), an array's line stands
    for its tasks: it matches when one of its tasks is in one of them (its row's own state is that of the tasks
    not yet placed: `pending` while they wait, though others run). Listing an array's tasks (`lines` False), each
    task by its own state."""
    states = list(states)
    if not lines:
        return jobs.filter(state__in=states)
    tasks_there = Job.objects.filter(state__in=states, array_task_id__isnull=False).values("array_job_id")
    match = Q(state__in=states) | Q(array_job_id=F("pk"), pk__in=tasks_there)
    if JobState.PENDING in states:
        match |= Q(array_job_id=F("pk")) & ~Q(array_pending="")
    return jobs.filter(match)


def array_tasks_of(jobs: QuerySet[Job], *, array_id: int) -> QuerySet[Job]:
    """The tasks of this array that are rows (placed at least once); those not yet placed are its line's."""
    return jobs.filter(array_job_id=array_id, array_task_id__isnull=False)


@dataclass(frozen=True)
class ArraySummary:
    array_id: int
    tasks: str  # as submitted: 0-999%50
    task_count: int
    max_running: int | None
    counts: dict[str, int]  # by state, every task counted once

    def as_dict(self) -> dict:
        return {
            "id": self.array_id,
            "tasks": self.tasks,
            "task_count": self.task_count,
            "max_running": self.max_running,
            "counts": self.counts,
        }


def array_summaries(*, jobs: Iterable[Job]) -> dict[int, ArraySummary]:
    """For the arrays among these rows (their first rows), their tasks counted by state: one statement."""
    firsts = {j.pk: j for j in jobs if j.array_job_id is not None and j.array_job_id == j.pk}
    if not firsts:
        return {}
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    for array_id, state, n in (
        Job.objects.filter(array_job_id__in=list(firsts), array_task_id__isnull=False)
        .values_list("array_job_id", "state")
        .annotate(n=Count("id"))
        .values_list("array_job_id", "state", "n")
    ):
        counts[array_id][state] = n
    out = {}
    for pk, first in firsts.items():
        by_state = counts[pk]
        waiting = len(TaskIndexes.parse(first.array_pending, trusted=True)) if first.array_pending else 0
        if waiting:
            by_state[JobState.PENDING] = by_state.get(JobState.PENDING, 0) + waiting
        never_placed = (first.array_task_count or 0) - sum(by_state.values())
        if never_placed > 0:  # ended before they were placed: cancelled, or failed with the array's row
            ended_as = (
                first.state if first.array_task_id is None and first.state == JobState.FAILED else "cancelled"
            )
            by_state[ended_as] = by_state.get(ended_as, 0) + never_placed
        out[pk] = ArraySummary(
            pk,
            first.array_spec,
            first.array_task_count or 0,
            first.array_max_running,
            dict(sorted(by_state.items())),
        )
    return out
