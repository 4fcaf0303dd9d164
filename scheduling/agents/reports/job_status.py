"""job_status reports: a job started, exited, was stopped, killed or lost on the reporting node.

A report about a placement the database no longer gives to this node (an older attempt, a job requeued after the
node was lost) is refused as stale and changes nothing (`placed_here`, the one rule). Start reports from every
node a web process serves are recorded together (`job_starts_record`); a gang member's end goes to
gang_members.py.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import Any, NamedTuple

from django.db import InterfaceError, OperationalError, transaction

from agent.protocol import IMAGE_PULL_FAILED
from scheduling import lock_objects
from scheduling.agents import joblogs
from scheduling.agents.reports.gang_members import gang_member_end_apply
from scheduling.agents.reports.outcome import Outcome, db_text
from scheduling.choices import ActorKind, JobState, NodeState
from scheduling.cycle.watchdog import job_lose_then_requeue, job_requeue_or_fail, last_placement
from scheduling.inventory.models import Node
from scheduling.jobs.batches import StartWrite, jobs_start
from scheduling.jobs.gangs import gang_member_started
from scheduling.jobs.models import Job, Slice
from scheduling.jobs.states import ACTIVE_STATES
from scheduling.jobs.transitions import job_cards_released, job_transition
from scheduling.jobs.wording import LIMIT_STOPS

log = logging.getLogger(__name__)


def placed_here(job: Job, node: Node) -> bool:
    """Whether the job's current attempt was placed on this node (slices, or the placement record)."""
    if Slice.objects.filter(job=job, gpu__node=node).exists():
        return True
    placed = last_placement(job)
    return placed is not None and node.name in (placed.data or {}).get("nodes", [])


# The reports that say a placement's processes are gone.
ENDED = frozenset({"exited", "stopped", "killed", "launch_failed", "lost"})

# A final report's last lines kept in its event: so many, each cut to its last so many characters.
LOG_TAIL_LINES = 20
LOG_TAIL_LINE_CHARS = 1000


def _log_tail_data(payload: dict[str, Any]) -> dict[str, Any]:
    tail = payload.get("log_tail")
    if not isinstance(tail, dict):
        return {}
    return {
        k: [db_text(line)[-LOG_TAIL_LINE_CHARS:] for line in v[-LOG_TAIL_LINES:]]
        for k, v in tail.items()
        if k in joblogs.STREAMS and isinstance(v, list)
    }


def job_report(*, node_id: int, payload: dict[str, Any]) -> Outcome:
    """Apply one job_status report: started -> running; exited -> succeeded/failed; stopped after a
    preemption -> back to the queue (keeping its submit time); killed by a limit -> failed; lost -> requeued."""
    try:
        job_id, attempt, state = int(payload["job_id"]), int(payload["attempt"]), str(payload["state"])
    except (KeyError, TypeError, ValueError):
        return Outcome(False, "a job_status needs job_id, attempt and state")
    with transaction.atomic():
        node = Node.objects.get(pk=node_id)
        if node.state == NodeState.LOST:
            return lost_refusal(node)
        job = lock_objects.jobs_for_update(ids=[job_id]).first()
        if job is None:
            return Outcome(False, f"no job {job_id}")
        if attempt != job.attempt or not placed_here(job, node):
            return stale_refusal(job, attempt, node)
        return _apply_report(job, node, state, payload, _report_data(node, attempt, payload))


def stale_refusal(job: Job, attempt: int, node: Node) -> Outcome:
    """A report about a placement that is not the job's current one on this node. About one the portal has moved
    on from (an earlier attempt, or the job no longer running: requeued after a fence, cancelled), it is expected
    after an outage and no error of the node's; about the job's current placement elsewhere it is."""
    moved_on = attempt < job.attempt or job.state not in ACTIVE_STATES
    return Outcome(
        False, f"stale report: job {job.pk} attempt {attempt} is not placed on {node.name}", stale=moved_on
    )


def lost_refusal(node: Node) -> Outcome:
    """A report of a node declared lost, before its hello: its jobs are being placed elsewhere."""
    return Outcome(
        False, f"node {node.name} is lost; its reports are refused until it says hello", stale=True
    )


def _report_data(node: Node, attempt: int, payload: dict[str, Any]) -> dict[str, Any]:
    """What a report's event keeps: where, which attempt, the process, how it exited, its last lines."""
    data = {"node": node.name, "attempt": attempt, "pid": payload.get("pid")}
    exit_code = payload.get("exit_code")
    if exit_code is not None:
        data["exit_code"] = int(exit_code)
    tails = _log_tail_data(payload)
    if tails:
        data["log_tail"] = tails
    return data


def _start_message(node: Node, payload: dict[str, Any]) -> str:
    how = "Re-adopted" if payload.get("adopted") else "Started"
    if payload.get("via") == "heartbeat":
        how = "Seen running (by its heartbeat)"
    return f"{how} on {node.name} (pid {payload.get('pid')})."


class StartReport(NamedTuple):
    node_id: int
    token_hash: str  # the token of the connection it came on
    payload: dict[str, Any]  # a job_status whose state is "started"


def job_starts_record(*, reports: list[StartReport]) -> list[Outcome | None]:
    """Many start reports, from any nodes, in one transaction: each answered as job_report would answer it, or
    None where the connection's token is no longer its node's (nothing of it is recorded; the connection is
    refused). Single-node jobs placed on the reporting node move to running in a few statements whatever their
    number (jobs_start); the rest (gang members, placements known only from their record, a job reported twice)
    go through job_report one by one.

    A cycle's placements start within moments of each other: at 1,000 nodes, 1,568 starts reported one
    transaction each (nine statements) took 89 s to record, and the reports queued behind them in each node's
    connection held up its heartbeats until busy nodes were declared lost (bench/cluster_scale.py)."""
    outcomes: list[Outcome | None] = [None] * len(reports)
    with transaction.atomic():
        nodes = {n.pk: n for n in Node.objects.filter(pk__in={r.node_id for r in reports})}
        asked: dict[int, tuple[int, int]] = {}  # report index -> (job id, attempt)
        for i, r in enumerate(reports):
            node = nodes.get(r.node_id)
            if node is None or node.agent_token_hash != r.token_hash:
                continue
            try:
                asked[i] = (int(r.payload["job_id"]), int(r.payload["attempt"]))
            except (KeyError, TypeError, ValueError):
                outcomes[i] = Outcome(False, "a job_status needs job_id, attempt and state")
                continue
            if node.state == NodeState.LOST:
                del asked[i]
                outcomes[i] = lost_refusal(node)
        jobs = {j.pk: j for j in lock_objects.jobs_for_update(ids={job_id for job_id, _ in asked.values()})}
        here = set(Slice.objects.filter(job_id__in=list(jobs)).values_list("job_id", "gpu__node_id"))
        starts: list[StartWrite] = []
        starting: set[int] = set()
        one_by_one: list[int] = []
        for i, (job_id, attempt) in asked.items():
            job, r = jobs.get(job_id), reports[i]
            node = nodes[r.node_id]
            if job is None:
                outcomes[i] = Outcome(False, f"no job {job_id}")
            elif job.nodes > 1 or (job_id, node.pk) not in here or job_id in starting:
                one_by_one.append(i)
            elif attempt != job.attempt:
                outcomes[i] = stale_refusal(job, attempt, node)
            elif job.state not in (JobState.PLACED, JobState.STARTING):
                outcomes[i] = Outcome(True)
            else:
                try:
                    data = _report_data(node, attempt, r.payload)
                except (TypeError, ValueError, OverflowError) as exc:  # as job_report alone: this one refused
                    outcomes[i] = Outcome(False, f"portal error: {type(exc).__name__}")
                    continue
                starts.append(StartWrite(job=job, message=_start_message(node, r.payload), data=data))
                starting.add(job_id)
                outcomes[i] = Outcome(True, changed=True)
        jobs_start(starts=starts)
        for i in one_by_one:
            try:
                outcomes[i] = job_report(node_id=reports[i].node_id, payload=reports[i].payload)
            except (OperationalError, InterfaceError):
                raise  # the database failing: the whole batch is sent again
            # A boundary for one report: whatever fails in it refuses it, not its batch (job_report's savepoint
            # has undone what it wrote).
            except Exception as exc:
                log.exception("node %s: a start report failed", reports[i].node_id)
                outcomes[i] = Outcome(False, f"portal error: {type(exc).__name__}")
    return outcomes


def _reported_time(payload: dict[str, Any], key: str) -> datetime | None:
    """A time the agent reports (unix seconds): when the job really started or ended."""
    value = payload.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    try:
        return datetime.fromtimestamp(float(value), tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _apply_report(job: Job, node: Node, state: str, payload: dict[str, Any], data: dict) -> Outcome:
    reason = db_text(payload.get("reason") or "")
    ended_at = _reported_time(payload, "finished_at")
    if payload.get("grace_given_s") is not None:
        data["grace_given_s"] = payload.get("grace_given_s")
    if state == "started":
        if job.nodes > 1:
            gang_member_started(job=job, node=node)
        if job.state in (JobState.PLACED, JobState.STARTING):
            job_transition(
                job=job,
                to_state=JobState.RUNNING,
                actor_kind=ActorKind.AGENT,
                code="started",
                message=_start_message(node, payload),
                data=data,
            )
            return Outcome(True, changed=True)
        return Outcome(True)

    if job.state == JobState.PREEMPTED and state in ("stopped", "killed", "exited", "lost"):
        if job.moving_until is not None:
            message = (
                f"Stopped on {node.name} to move; back in the queue with its original submit time, and it restarts "
                "where its place is held."
            )
        else:
            message = f"Stopped on {node.name} after its preemption; back in the queue with its original submit time."
        job_requeue_or_fail(
            job=job, code="moved" if job.moving_until is not None else "requeued", message=message, data=data
        )
        return Outcome(True, changed=True)
    if job.state not in ACTIVE_STATES:
        # Cancelled meanwhile, or already final. One that ended while this node was silent still holds its cards
        # here ("releasing"): this report is its stop confirmed.
        if state in ENDED and job_cards_released(
            job=job,
            node_id=node.pk,
            node_name=node.name,
            message=f"Its GPUs on {node.name} are free again: the node's agent confirmed the job has stopped.",
        ):
            return Outcome(True, changed=True)
        return Outcome(True)
    if job.nodes > 1:
        gang_outcome = gang_member_end_apply(job, node, state, reason, data)
        if gang_outcome is not None:
            return gang_outcome

    if job.state == JobState.PLACED and state in ("exited", "killed"):
        # The start report was lost (an agent restart): record that it ran before recording how it ended.
        job_transition(
            job=job, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT, code="started", data=data
        )
    if state == "exited" and "exit_code" in data:
        code = data["exit_code"]
        job.exit_code = code
        job.save(update_fields=["exit_code"])
        job_transition(
            job=job,
            to_state=JobState.SUCCEEDED if code == 0 else JobState.FAILED,
            actor_kind=ActorKind.AGENT,
            code="exited",
            message=f"Exited with code {code} on {node.name}.",
            data=data,
            happened_at=ended_at,
        )
    elif state == "launch_failed" and reason.startswith("GPU(s) not on this node"):
        # The placement named GPUs the node does not have (an inventory that changed): not the job's fault.
        job_lose_then_requeue(
            job=job,
            actor_kind=ActorKind.AGENT,
            code="gpus_not_on_node",
            message=f"{node.name} refused the placement: {reason}.",
            requeue_code="requeued",
            requeue_message="Requeued: its GPUs were not on the node.",
            data=data,
        )
    elif state == "launch_failed" and reason.startswith(f"{IMAGE_PULL_FAILED}:"):
        job_transition(
            job=job,
            to_state=JobState.FAILED,
            actor_kind=ActorKind.AGENT,
            code=IMAGE_PULL_FAILED,
            message=f"Its image could not be pulled on {node.name}: "
            f"{reason.removeprefix(f'{IMAGE_PULL_FAILED}:').strip().rstrip('.')}.",
            data=data,
            happened_at=ended_at,
        )
    elif state in ("killed", "launch_failed"):
        if data.get("exit_code") is not None:
            job.exit_code = data["exit_code"]
            job.save(update_fields=["exit_code"])
        job_transition(
            job=job,
            to_state=JobState.FAILED,
            actor_kind=ActorKind.AGENT,
            code=reason if reason in LIMIT_STOPS else state,
            message=LIMIT_STOPS.get(reason)
            or f"{state.replace('_', ' ').capitalize()} on {node.name}: {reason}",
            data=data,
            happened_at=ended_at,
        )
    else:  # "lost", or "stopped" although still wanted (the agent held an older desired state)
        job_lose_then_requeue(
            job=job,
            actor_kind=ActorKind.AGENT,
            code=f"agent_{state}",
            message=f"The agent on {node.name} reported the job {state} ({reason or 'no reason given'}).",
            requeue_code="requeued",
            requeue_message="Requeued after its process was lost.",
            data=data,
        )
    return Outcome(True, changed=True)
