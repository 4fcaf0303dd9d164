"""Failure handling: silent nodes become lost and their jobs go back to the queue; unanswered preemptions finish.

Every step re-reads its condition under a row lock, so two watchdogs (two beats) running at once do each thing
once. Requeues are bounded by TESSERA_MAX_REQUEUES; past it a job fails with a reason.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from scheduling import lock_objects
from scheduling.choices import ActorKind, JobState, NodeState
from scheduling.coordination import redis_client
from scheduling.cycle import node_loss
from scheduling.cycle.requests import cycle_request
from scheduling.inventory.models import Node
from scheduling.jobs.models import Job, JobEvent, Slice
from scheduling.jobs.selectors import gang_first_failure
from scheduling.jobs.states import ACTIVE_STATES, TERMINAL_STATES
from scheduling.jobs.transitions import job_cards_released, job_transition
from scheduling.notifications.services import admin_notify
from scheduling.realtime import events, groups

log = logging.getLogger(__name__)


def job_requeue_or_fail(*, job: Job, code: str, message: str, data: dict | None = None) -> Job:
    """From preempted or lost back to pending, unless the job has used up its requeues (then failed)."""
    max_requeues = settings.TESSERA_MAX_REQUEUES
    # Moves (the scheduler stopping it to make room, its new place held) are not the job's requeues.
    if job.attempt - job.moves > max_requeues:
        moved = f" (and moved {job.moves} times)" if job.moves else ""
        return job_transition(
            job=job,
            to_state=JobState.FAILED,
            actor_kind=ActorKind.SYSTEM,
            code="too_many_requeues",
            message=f"{message} It has been placed {job.attempt - job.moves} times{moved}; the limit is "
            f"{max_requeues} requeues.",
            data=data,
        )
    return job_transition(
        job=job, to_state=JobState.PENDING, actor_kind=ActorKind.SYSTEM, code=code, message=message, data=data
    )


def job_lose_then_requeue(
    *,
    job: Job,
    actor_kind: str,
    code: str,
    message: str,
    requeue_code: str,
    requeue_message: str,
    data: dict | None = None,
) -> Job:
    """Record that the job's placement was lost (why, by whom), then send it back to the queue (or fail it when
    it has used up its requeues): both steps are JobEvents."""
    job_transition(
        job=job, to_state=JobState.LOST, actor_kind=actor_kind, code=code, message=message, data=data
    )
    return job_requeue_or_fail(job=job, code=requeue_code, message=requeue_message, data=data)


def _silent_nodes(now):
    """Silent nodes not yet declared lost (pre-registered hosts without agents too: node_loss.silent_filter)."""
    return Node.objects.exclude(state=NodeState.LOST).filter(node_loss.silent_filter(now=now))


def jobs_on_node_changed(*, node: Node, code: str) -> None:
    """Tell the pages of the jobs holding cards on the node that its standing changed (silent, or heard again):
    their state is the same, what they say about their node is not."""
    for job_id, team_id, submitter_id, state in (
        Job.objects.filter(slices__gpu__node=node)
        .distinct()
        .values_list("pk", "team_id", "submitter_id", "state")
    ):
        events.job_changed(job_id=job_id, team_id=team_id, submitter_id=submitter_id, state=state, code=code)


def node_mark_lost(*, node_id: int, now=None) -> list[int]:
    """Declare one node lost (if it is still silent): nothing more is placed on it. Its jobs stay where they are
    until they have surely stopped (`lost_jobs_check`); it may come back before. Returns its active job ids."""
    now = now or timezone.now()
    with transaction.atomic():
        node = _silent_nodes(now).filter(pk=node_id).select_for_update().first()
        if node is None:  # it spoke up meanwhile, or another watchdog got here first
            return []
        node.state = NodeState.LOST
        node.save(update_fields=["state"])
        job_ids = sorted(
            set(
                Slice.objects.filter(gpu__node=node, job__state__in=ACTIVE_STATES).values_list(
                    "job_id", flat=True
                )
            )
        )
        events.publish_after_commit(
            groups.CLUSTER, {"type": "node.changed", "node": node.name, "state": NodeState.LOST}
        )
        jobs_on_node_changed(node=node, code="node_not_responding")
        silent_s = (now - (node.last_heartbeat_at or node.created_at)).total_seconds()
        admin_notify(
            kind="node_lost",
            subject=f"node {node.name} lost",
            body=f"No heartbeat from {node.name}'s agent for {silent_s:.0f} s: nothing new is placed there. "
            f"Its {len(job_ids)} running jobs are placed elsewhere once they have surely stopped (the fence).",
        )
    log.warning(
        "node %s lost; its jobs %s are placed elsewhere only once they have surely stopped",
        node.name,
        job_ids,
    )
    return job_ids


def _requeue_lost(*, job: Job, node: Node, silent_for: str) -> None:
    data = {"node": node.name}
    message = (
        f"Node {node.name} has not been heard for {silent_for}: its supervisor has stopped the job "
        f"(it stops a job {node_loss.fence_after_s():.0f} s after the portal last heard its node)."
    )
    failure = gang_first_failure(job=job) if job.nodes > 1 else None
    if failure is not None:
        # A gang already decided failed, waiting for its members to stop: failed, not requeued.
        job_transition(
            job=job,
            to_state=JobState.FAILED,
            actor_kind=ActorKind.SYSTEM,
            code="gang_failed",
            message=f"Failed: {failure.describe()}. Node {node.name} was lost before its member stopped.",
            data={**data, "failed_node": failure.node.name, "failed_rank": failure.rank},
        )
        return
    if job.requeue_on_node_loss:
        job_lose_then_requeue(
            job=job,
            actor_kind=ActorKind.SYSTEM,
            code="node_lost",
            message=message,
            requeue_code="requeued_node_lost",
            requeue_message=f"Requeued after node {node.name} was lost.",
            data=data,
        )
        return
    job_transition(
        job=job,
        to_state=JobState.LOST,
        actor_kind=ActorKind.SYSTEM,
        code="node_lost",
        message=message,
        data=data,
    )
    job_transition(
        job=job,
        to_state=JobState.FAILED,
        actor_kind=ActorKind.SYSTEM,
        code="node_lost",
        message=f"Failed: node {node.name} was lost and the job asked not to be requeued.",
        data=data,
    )


def lost_jobs_check(*, now=None) -> list[int]:
    """Jobs on lost nodes that have surely stopped by now (`node_loss.surely_stopped_at`): back to the queue, or
    failed when they asked not to be requeued. Not a moment before: a placement never runs in two places."""
    now = now or timezone.now()
    moved = []
    for node in Node.objects.filter(state=NodeState.LOST):
        last_heard = node.last_heartbeat_at or node.created_at
        candidates = (
            Job.objects.filter(slices__gpu__node=node, state__in=ACTIVE_STATES)
            .select_related("priority_class")
            .distinct()
        )
        due = [
            job.pk
            for job in candidates
            if node_loss.surely_stopped_at(
                last_heard_at=last_heard, grace_s=job.priority_class.preemption_grace_s
            )
            <= now
        ]
        if not due:
            continue
        with transaction.atomic():
            locked = lock_objects.nodes_for_update(ids=[node.pk]).first()
            if locked is None or locked.state != NodeState.LOST:
                continue  # it came back meanwhile: its jobs run on
            silent_for = f"{(now - last_heard).total_seconds():.0f} s"
            for job in lock_objects.jobs_for_update(ids=due):
                if job.state in ACTIVE_STATES:
                    _requeue_lost(job=job, node=locked, silent_for=silent_for)
                    moved.append(job.pk)
    # Each requeue or failure is logged once, by job_transition, with its reason.
    return moved


# When the watchdog last ran, and when it last resumed after a gap (Redis keys; a process fallback without Redis).
_LAST_RUN_KEY = "tessera:watchdog:last_run_s"
_RESUMED_KEY = "tessera:watchdog:resumed_s"
_local_marks: dict[str, float] = {}


def _marks_swap(*, now_s: float) -> tuple[float | None, float | None]:
    """Record this run; return (the previous run, the last resumption) in unix seconds."""
    r = redis_client()
    if r is None:
        previous, resumed = _local_marks.get(_LAST_RUN_KEY), _local_marks.get(_RESUMED_KEY)
        _local_marks[_LAST_RUN_KEY] = now_s
        return previous, resumed
    previous, resumed = r.getset(_LAST_RUN_KEY, now_s), r.get(_RESUMED_KEY)
    return (float(previous) if previous else None), (float(resumed) if resumed else None)


def _mark_resumed(*, now_s: float) -> None:
    r = redis_client()
    if r is None:
        _local_marks[_RESUMED_KEY] = now_s
    else:
        r.set(_RESUMED_KEY, now_s)


def watch_resumed_at(*, now) -> float:
    """When the watchdog's current unbroken watch began (unix s). A gap since its previous run longer than the
    lost timeout (it was paused, or Redis was down so neither it nor the agents' reports could run) starts a new
    watch: silence before it says nothing about the nodes. No record at all (Redis restarted) also starts one."""
    now_s = now.timestamp()
    lost_after_s = settings.TESSERA_NODE_LOST_AFTER_S
    previous, resumed = _marks_swap(now_s=now_s)
    if previous is None or resumed is None or now_s - previous > lost_after_s:
        _mark_resumed(now_s=now_s)
        return now_s
    return resumed


def nodes_check(*, now=None) -> dict[str, list[int]]:
    """Every node silent for longer than TESSERA_NODE_LOST_AFTER_S, counted from its last heartbeat or from when
    the watchdog resumed watching, whichever is later: lost. Returns node name -> job ids."""
    now = now or timezone.now()
    if watch_resumed_at(now=now) > now.timestamp() - settings.TESSERA_NODE_LOST_AFTER_S:
        return {}  # a full grace period after resuming: the agents could not report while nobody listened
    out = {}
    for node_id, name in _silent_nodes(now).values_list("pk", "name"):
        out[name] = node_mark_lost(node_id=node_id, now=now)
    return out


def _unheard_since(*, job: Job, now) -> datetime | None:
    """The last heartbeat of the silent node the job was placed on (None: its nodes are all heard)."""
    placed = last_placement(job)
    names = (placed.data or {}).get("nodes", []) if placed is not None else []
    silent_before = now - timedelta(seconds=settings.TESSERA_NODE_LOST_AFTER_S)
    heard = [
        n.last_heartbeat_at or n.created_at
        for n in Node.objects.filter(name__in=names)
        if n.state == NodeState.LOST or (n.last_heartbeat_at or n.created_at) < silent_before
    ]
    return min(heard) if heard else None


def preemptions_check(*, now=None) -> list[int]:
    """Preempted jobs whose agent never confirmed the stop within grace + the node-lost timeout: requeue them."""
    now = now or timezone.now()
    slack_s = settings.TESSERA_NODE_LOST_AFTER_S
    overdue = []
    preempted = (
        Job.objects.filter(state=JobState.PREEMPTED)
        .annotate(since=Max("events__at", filter=Q(events__to_state=JobState.PREEMPTED)))
        .annotate(grace_s=Coalesce(F("priority_class__preemption_grace_s"), 0))
    )
    for job_id, since, grace_s in preempted.values_list("pk", "since", "grace_s"):
        if since is None or since + timedelta(seconds=grace_s + slack_s) > now:
            continue
        with transaction.atomic():
            job = lock_objects.jobs_for_update(ids=[job_id]).first()
            if job is None or job.state != JobState.PREEMPTED:
                continue
            unheard = _unheard_since(job=job, now=now)
            if (
                unheard is not None
                and node_loss.surely_stopped_at(last_heard_at=unheard, grace_s=grace_s) > now
            ):
                continue  # its node is silent: the stop may not have reached it; wait for its fence
            job_requeue_or_fail(
                job=job,
                code="requeued",
                message=f"Preempted {grace_s + slack_s:.0f} s ago and its agent never confirmed the stop; "
                "back in the queue.",
            )
            overdue.append(job_id)
    return overdue


def releasing_check(*, now=None) -> list[int]:
    """Ended jobs still holding cards on a node that was silent when they ended ("releasing", job_transition):
    free once they have surely stopped there. On a node still silent, that is its fence (`surely_stopped_at`);
    on one heard again, whose agent has had the grace and the lost timeout to confirm the stop and has not (it
    lost its record of the job), that long after the job ended. Returns the job ids."""
    now = now or timezone.now()
    held = (
        Slice.objects.filter(job__state__in=TERMINAL_STATES)
        .values_list("job_id", "gpu__node_id")
        .distinct()
        .order_by("job_id", "gpu__node_id")
    )
    pairs = list(held)
    if not pairs:
        return []
    node_ids = {node_id for _, node_id in pairs}
    nodes = {n.pk: n for n in Node.objects.filter(pk__in=node_ids).select_related("sync")}
    silent = node_loss.silent_nodes(node_ids=node_ids, now=now)
    jobs = {
        j.pk: j
        for j in Job.objects.filter(pk__in={job_id for job_id, _ in pairs}).select_related("priority_class")
    }
    freed = []
    for job_id, node_id in pairs:
        node, job = nodes[node_id], jobs[job_id]
        grace_s = job.priority_class.preemption_grace_s
        if node_id in silent:
            due = node_loss.surely_stopped_at(last_heard_at=silent[node_id], grace_s=grace_s)
            why = "its fence has passed"
        else:
            # Heard again: its agent has had the grace and the lost timeout, since the job ended or since it
            # came back, whichever is later, to confirm the stop.
            back_at = getattr(getattr(node, "sync", None), "connected_at", None)
            since = max(t for t in (job.finished_at or now, back_at) if t is not None)
            due = since + timedelta(seconds=grace_s + settings.TESSERA_NODE_LOST_AFTER_S)
            why = "its agent, heard again, has not reported it running since"
        if due > now:
            continue
        with transaction.atomic():
            locked = lock_objects.jobs_for_update(ids=[job_id]).first()
            if locked is not None and job_cards_released(
                job=locked,
                node_id=node.pk,
                node_name=node.name,
                message=f"Its GPUs on {node.name} are free again: {why}, so the job has surely stopped there.",
            ):
                freed.append(job_id)
    return freed


def watchdog_run() -> dict:
    """One watchdog round: silent nodes lost, their jobs requeued once surely stopped, overdue preemptions
    finished, ended jobs' cards on silent nodes freed once surely stopped; a cycle asked for if any of it
    happened."""
    lost = nodes_check()
    requeued = lost_jobs_check()
    overdue = preemptions_check()
    released = releasing_check()
    if lost or requeued or overdue or released:
        cycle_request()
    return {
        "lost": lost,
        "lost_jobs_requeued": requeued,
        "preemptions_requeued": overdue,
        "releasing_freed": released,
    }


def last_placement(job: Job) -> JobEvent | None:
    """The event that placed the job's current attempt (it records the nodes and GPUs)."""
    return job.events.filter(to_state=JobState.PLACED).order_by("-at", "-id").first()
