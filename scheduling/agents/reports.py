"""What node agents report, turned into writes: hello (inventory), heartbeats, job status, events and logs.

Each function is idempotent: agents resend unacknowledged reports after a reconnect. A report about a placement
the database no longer gives to this node (an older attempt, a job requeued after the node was lost) is refused
and changes nothing.
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.db import InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from agent import protocol
from portal import database
from portal.database import fetch_rows
from scheduling import lock_objects
from scheduling.agents import joblogs
from scheduling.choices import ActorKind, GangMemberOutcome, GpuHealth, JobState, NodeState
from scheduling.cycle.models import NodeSync
from scheduling.cycle.requests import cycle_request_after_commit
from scheduling.cycle.watchdog import job_lose_then_requeue, job_requeue_or_fail, last_placement
from scheduling.inventory.models import Gpu, Node
from scheduling.jobs.batches import StartWrite, jobs_start
from scheduling.jobs.gangs import gang_member_end, gang_member_started, gang_members_unstarted_stop
from scheduling.jobs.models import GangMember, Job, JobEvent, Slice
from scheduling.jobs.selectors import gang_first_failure
from scheduling.jobs.states import ACTIVE_STATES
from scheduling.jobs.transitions import job_transition
from scheduling.realtime import events, groups

log = logging.getLogger(__name__)

# The agent's health words -> the inventory's.
_HEALTH = {
    "ok": GpuHealth.OK,
    "degraded": GpuHealth.DEGRADED,
    "lost": GpuHealth.FAILED,
    "failed": GpuHealth.FAILED,
}
_STOP_REASONS = {
    "max_runtime": "Stopped: it ran longer than its max runtime.",
    "memory_slice_exceeded": "Stopped: it used more GPU memory than its slice (protecting its neighbours).",
    "host_memory_exceeded": "Killed: it used more host memory than it asked for (memory_mib).",
}


@dataclass(frozen=True)
class Outcome:
    """The answer to one report: accepted or not, and why (sent back in the ack). `retry`: not refused, the portal
    failed to handle it (a database error): the agent keeps the report and sends it again shortly."""

    ok: bool
    error: str | None = None
    changed: bool = False
    retry: bool = False


# A host name or an IP address (v6 with a zone too): what goes into a hostfile line and MASTER_ADDR.
_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:%-]{0,252}")


def _revive(node: Node) -> None:
    """A lost node that speaks again is ready again; its old jobs were already requeued."""
    if node.state == NodeState.LOST:
        node.state = NodeState.READY
        node.save(update_fields=["state"])
        events.publish_after_commit(
            groups.CLUSTER, {"type": "node.changed", "node": node.name, "state": node.state}
        )
        cycle_request_after_commit()


def node_hello(*, node_id: int, payload: dict[str, Any]) -> dict[str, Any]:
    """Reconcile the inventory the agent sees with the database's, and take the address it reports (where its
    peers reach it); returns what differed."""
    inventory = payload.get("inventory") or {}
    reported = {int(g["index"]): g for g in inventory.get("gpus") or [] if "index" in g}
    report: dict[str, Any] = {"uuid_updated": [], "missing": [], "unregistered": [], "memory_mismatch": []}
    with transaction.atomic():
        node = lock_objects.nodes_for_update(ids=[node_id]).get()
        for gpu in Gpu.objects.filter(node=node).order_by("index"):
            seen = reported.pop(gpu.index, None)
            fields = []
            if seen is None:
                if gpu.health != GpuHealth.FAILED:
                    gpu.health = GpuHealth.FAILED
                    fields.append("health")
                report["missing"].append(gpu.index)
            else:
                uuid = str(seen.get("uuid") or "")
                if (
                    uuid
                    and uuid != gpu.uuid
                    and not Gpu.objects.filter(uuid=uuid).exclude(pk=gpu.pk).exists()
                ):
                    gpu.uuid = uuid
                    fields.append("uuid")
                    report["uuid_updated"].append(gpu.index)
                if gpu.health == GpuHealth.FAILED:
                    gpu.health = GpuHealth.OK  # present again; later samples report its health
                    fields.append("health")
                total = seen.get("memory_total_mib")
                if total is not None and int(total) < gpu.memory_mib:
                    report["memory_mismatch"].append([gpu.index, int(total), gpu.memory_mib])
            if fields:
                gpu.save(update_fields=fields)
        report["unregistered"] = sorted(reported)
        node.last_heartbeat_at = timezone.now()
        fields = ["last_heartbeat_at"]
        address = payload.get("address")
        if isinstance(address, str) and address:
            if _ADDRESS.fullmatch(address) and address != node.address:
                node.address = address
                fields.append("address")
                report["address"] = address
            elif not _ADDRESS.fullmatch(address):
                report["address_refused"] = address[:100]
        node.save(update_fields=fields)
        _revive(node)
        sync, _ = NodeSync.objects.get_or_create(node=node)
        sync.agent_version = str(payload.get("agent_version") or "")[:50]
        sync.inventory = {**inventory, "capabilities": payload.get("capabilities") or {}, "reconcile": report}
        sync.connected_at = timezone.now()
        sync.save(update_fields=["agent_version", "inventory", "connected_at"])
        if report["missing"] or report["uuid_updated"]:
            cycle_request_after_commit()
        if report["missing"]:
            missing = ", ".join(str(i) for i in report["missing"])
            node_error_note(node_id=node.pk, message=f"GPU(s) {missing} missing from the agent's inventory.")
    if any(report.values()):
        log.info("node %s inventory reconciled: %s", node.name, report)
    return report


def node_heartbeat(*, node_id: int, running: Any = None) -> list[int]:
    """The node is alive; and what it runs is running. Returns the jobs this heartbeat moved to running.

    `running` is the heartbeat's list of placements alive on the host. A job the database still has as placed or
    starting while its agent runs it missed its start report (the portal failed to take it, or it was lost):
    the heartbeat records the start, level-triggered, as a kubelet's status sync does.
    """
    if not _heartbeat_record(node_id=node_id):
        return []  # a node that was lost speaks again: its old placements were requeued meanwhile
    return heartbeat_catch_up(node_id=node_id, running=running)


def _heartbeat_record(*, node_id: int) -> bool:
    """Note the node alive now; False when it was lost (it is revived: ready again, its old placements gone)."""
    with transaction.atomic():
        updated = (
            Node.objects.filter(pk=node_id)
            .exclude(state=NodeState.LOST)
            .update(last_heartbeat_at=timezone.now())
        )
        if updated:
            return True
        node = lock_objects.nodes_for_update(ids=[node_id]).first()
        if node is not None:
            node.last_heartbeat_at = timezone.now()
            node.save(update_fields=["last_heartbeat_at"])
            _revive(node)
        return False


# A start report normally lands within moments of the start: a heartbeat records the starts of jobs placed longer
# ago than this only, so the two do not race for the same job (at 1,000 nodes a cycle's 1,500 starts were each
# recorded by both, the heartbeats' share holding up the heartbeats behind them).
START_REPORT_GRACE_S = 10.0


class HeartbeatSeen(NamedTuple):
    token_current: bool  # False: the node's token is no longer the connection's; nothing was recorded
    desired_version: int | None  # the node's desired version as the database has it (None before its first)
    behind: tuple[int, ...]  # jobs it runs whose start report has not come (heartbeat_catch_up records them)


def node_heartbeat_checked(*, node_id: int, token_hash: str, running: Any = None) -> HeartbeatSeen:
    """A heartbeat from a connection holding `token_hash`: the node is alive (a lost node is revived), unless the
    node's token is no longer that one. The jobs it runs that missed their start reports are returned, for
    `heartbeat_catch_up` to record off the heartbeat's own path.

    On PostgreSQL the usual case (the token current, the node not lost) is one statement: 1,000 nodes send 200
    heartbeats a second, and the token check, the UPDATE in its transaction and the two reads were six round
    trips and most of the agents' database threads' time (bench/agent_traffic.py).
    """
    alive = _alive(running)
    placed_before = timezone.now() - timedelta(seconds=START_REPORT_GRACE_S)
    if not database.postgresql():
        if not Node.objects.filter(pk=node_id, agent_token_hash=token_hash).exists():
            return HeartbeatSeen(False, None, ())
        _heartbeat_record(node_id=node_id)
        version = NodeSync.objects.filter(node_id=node_id).values_list("desired_version", flat=True).first()
        return HeartbeatSeen(True, version, tuple(_behind(alive=alive, placed_before=placed_before)))
    node_t, sync_t, job_t = (m._meta.db_table for m in (Node, NodeSync, Job))
    with transaction.atomic():
        # Not waiting for its WAL flush: a heartbeat lost in a database crash is the next one 5 s later. Waiting,
        # 200 heartbeats a second queued behind each other's fsync (0.2 s each while a cycle's writes were being
        # flushed), and busy nodes were declared lost (bench/cluster_scale.py at 1,000 nodes).
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
        ((token_ok, recorded, version, behind),) = _heartbeat_statement(
            node_t, sync_t, job_t, node_id, token_hash, alive, placed_before
        )
    if not token_ok:
        return HeartbeatSeen(False, None, ())
    if not recorded:  # a lost node speaking again: revived
        _heartbeat_record(node_id=node_id)
    return HeartbeatSeen(True, version, tuple(behind))


def _heartbeat_statement(
    node_t: str,
    sync_t: str,
    job_t: str,
    node_id: int,
    token_hash: str,
    alive: dict[int, dict[str, Any]],
    placed_before: datetime,
) -> list[tuple]:
    return fetch_rows(
        f"""
        WITH token AS (SELECT id FROM {node_t} WHERE id = %s AND agent_token_hash = %s),
        beat AS (
            UPDATE {node_t} AS n SET last_heartbeat_at = %s FROM token
            WHERE n.id = token.id AND n.state <> %s RETURNING n.id
        )
        SELECT EXISTS (SELECT 1 FROM token), EXISTS (SELECT 1 FROM beat),
            (SELECT desired_version FROM {sync_t} WHERE node_id = %s),
            ARRAY(
                SELECT id FROM {job_t}
                WHERE id = ANY(%s::bigint[]) AND state IN (%s, %s) AND placed_at < %s ORDER BY id
            )
        """,
        [
            node_id,
            token_hash,
            timezone.now(),
            NodeState.LOST,
            node_id,
            list(alive),
            JobState.PLACED,
            JobState.STARTING,
            placed_before,
        ],
    )


def _alive(running: Any) -> dict[int, dict[str, Any]]:
    """The heartbeat's placements that run now, by job id (malformed entries skipped)."""
    alive: dict[int, dict[str, Any]] = {}
    for entry in running if isinstance(running, list) else []:
        if not isinstance(entry, dict) or entry.get("state") != "running":
            continue
        try:
            alive[int(entry["job_id"])] = entry
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
    return alive


def _behind(*, alive: dict[int, dict[str, Any]], placed_before: datetime) -> list[int]:
    return list(
        Job.objects.filter(
            pk__in=alive, state__in=(JobState.PLACED, JobState.STARTING), placed_at__lt=placed_before
        )
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def heartbeat_catch_up(*, node_id: int, running: Any) -> list[int]:
    """Record the starts a heartbeat shows whose start reports never came (jobs placed over START_REPORT_GRACE_S
    ago that run on the node); the jobs moved to running."""
    alive = _alive(running)
    behind = _behind(alive=alive, placed_before=timezone.now() - timedelta(seconds=START_REPORT_GRACE_S))
    if not behind:
        return []
    moved = []
    for job_id in behind:
        entry = alive[job_id]
        report = {
            "job_id": job_id,
            "attempt": entry.get("attempt"),
            "state": "started",
            "pid": entry.get("pid"),
            "adopted": entry.get("adopted"),
            "via": "heartbeat",
        }
        if job_report(node_id=node_id, payload=report).changed:
            moved.append(job_id)
    if moved:
        log.info(
            "node %s: heartbeat shows jobs %s running; their start reports had not arrived", node_id, moved
        )
    return moved


LAST_ERROR_CHARS = 500  # NodeSync.last_error


def node_error_note(*, node_id: int, message: str) -> None:
    """Keep the node's newest problem (a refused report, MPS unavailable, a GPU gone bad): one row update, shown
    in the node's conditions (the API, `tessera nodes`, its tile and page)."""
    text = _text(message)[:LAST_ERROR_CHARS]
    if not NodeSync.objects.filter(node_id=node_id).update(last_error=text, last_error_at=timezone.now()):
        NodeSync.objects.get_or_create(
            node_id=node_id, defaults={"last_error": text, "last_error_at": timezone.now()}
        )


def node_disconnected(*, node_id: int) -> None:
    NodeSync.objects.filter(node_id=node_id).update(disconnected_at=timezone.now())


def node_acked(*, node_id: int, version: int | None) -> None:
    if version is not None:
        NodeSync.objects.filter(node_id=node_id, acked_version__lt=version).update(acked_version=version)


def _placed_here(job: Job, node: Node) -> bool:
    """Whether the job's current attempt was placed on this node (slices, or the placement record)."""
    if Slice.objects.filter(job=job, gpu__node=node).exists():
        return True
    placed = last_placement(job)
    return placed is not None and node.name in (placed.data or {}).get("nodes", [])


# A final report's last lines kept in its event: so many, each cut to its last so many characters.
LOG_TAIL_LINES = 20
LOG_TAIL_LINE_CHARS = 1000


def _log_tail_data(payload: dict[str, Any]) -> dict[str, Any]:
    tail = payload.get("log_tail")
    if not isinstance(tail, dict):
        return {}
    return {
        k: [_text(line)[-LOG_TAIL_LINE_CHARS:] for line in v[-LOG_TAIL_LINES:]]
        for k, v in tail.items()
        if k in joblogs.STREAMS and isinstance(v, list)
    }


def _text(value: Any) -> str:
    """A string PostgreSQL takes into text and JSON: NUL (which it refuses, and which a job's output may well
    hold) shown as U+2400, lone surrogates (which pass JSON decoding) replaced."""
    return str(value).replace("\0", "\u2400").encode("utf-8", "replace").decode("utf-8")


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
            return Outcome(False, f"node {node.name} is lost; its reports are refused until it says hello")
        job = lock_objects.jobs_for_update(ids=[job_id]).first()
        if job is None:
            return Outcome(False, f"no job {job_id}")
        if attempt != job.attempt or not _placed_here(job, node):
            return _stale(job_id, attempt, node)
        return _apply_report(job, node, state, payload, _report_data(node, attempt, payload))


def _stale(job_id: int, attempt: int, node: Node) -> Outcome:
    return Outcome(False, f"stale report: job {job_id} attempt {attempt} is not placed on {node.name}")


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
                outcomes[i] = Outcome(
                    False, f"node {node.name} is lost; its reports are refused until it says hello"
                )
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
                outcomes[i] = _stale(job_id, attempt, node)
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
            except Exception as exc:  # one bad report must not refuse the others
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
    reason = _text(payload.get("reason") or "")
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
        return Outcome(True)  # cancelled meanwhile, or already final: nothing left to do
    if job.nodes > 1:
        gang_outcome = _apply_gang_member_end(job, node, state, reason, data)
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
    elif state in ("killed", "launch_failed"):
        if data.get("exit_code") is not None:
            job.exit_code = data["exit_code"]
            job.save(update_fields=["exit_code"])
        job_transition(
            job=job,
            to_state=JobState.FAILED,
            actor_kind=ActorKind.AGENT,
            code=reason if reason in _STOP_REASONS else state,
            message=_STOP_REASONS.get(reason)
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


def _member_outcome(state: str, reason: str, exit_code: int | None, *, failing: bool) -> str | None:
    """How a member's final report ends it; None where the job's own rules apply instead (a member lost or
    stopped while its gang runs requeues the whole gang, as do GPUs the node does not have)."""
    if state == "exited" and exit_code == 0:
        return GangMemberOutcome.SUCCEEDED
    if state == "launch_failed" and reason.startswith("GPU(s) not on this node") and not failing:
        return None
    if state in ("killed", "launch_failed") or (state == "exited" and exit_code is not None):
        return GangMemberOutcome.FAILED
    return GangMemberOutcome.STOPPED if failing else None


def _apply_gang_member_end(job: Job, node: Node, state: str, reason: str, data: dict) -> Outcome | None:
    """One member of a multi-node job ended. The gang succeeds once every member exited 0; at the first failure
    it is decided failed: that member is named, the other members' nodes drop the job (their agents stop theirs
    with the job's grace), and the job fails once all have ended. None: not a member's end (the job's rules)."""
    member = GangMember.objects.filter(job=job, attempt=job.attempt, node=node).select_related("node").first()
    if member is None:
        return None
    if member.outcome != GangMemberOutcome.RUNNING:
        return Outcome(True)  # a repeat, or a member already counted as stopped
    first_failure = gang_first_failure(job=job)
    exit_code = data.get("exit_code")
    outcome = _member_outcome(state, reason, exit_code, failing=first_failure is not None)
    if outcome is None:
        return None
    if job.state == JobState.PLACED:
        # Its start report was lost (an agent restart): record that it ran before recording how it ended.
        job_transition(
            job=job, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT, code="started", data=data
        )
    gang_member_end(member=member, outcome=outcome, reported_state=state, exit_code=exit_code, reason=reason)
    members = list(GangMember.objects.filter(job=job, attempt=job.attempt).select_related("node"))
    data = {**data, "rank": member.rank}
    if outcome == GangMemberOutcome.FAILED and first_failure is None:
        first_failure = member
        job.exit_code = exit_code
        job.save(update_fields=["exit_code"])
        stopped = gang_members_unstarted_stop(job=job)
        running = [m for m in members if m.outcome == GangMemberOutcome.RUNNING and m not in stopped]
        others = ", ".join(f"rank {m.rank} on {m.node.name}" for m in running) or "none still running"
        grace_s = job.priority_class.preemption_grace_s
        _gang_event(
            job,
            code="gang_member_failed",
            message=f"{member.describe()}: the gang fails. Stopping the other members ({others}) with "
            f"{grace_s:g} s grace.",
            data={**data, "stopping": [m.node.name for m in running], "grace_s": grace_s},
        )
        for m in running:
            events.node_desired_state_changed(node_name=m.node.name)
        members = list(GangMember.objects.filter(job=job, attempt=job.attempt).select_related("node"))
    still_running = [m for m in members if m.outcome == GangMemberOutcome.RUNNING]
    if still_running:
        if outcome == GangMemberOutcome.SUCCEEDED:
            _gang_event(
                job,
                code="gang_member_exited",
                message=f"{member.describe()}; waiting for {len(still_running)} more member(s).",
                data=data,
            )
        return Outcome(True, changed=True)
    ended = "; ".join(m.describe() for m in members)
    if first_failure is None:
        job.exit_code = 0
        job.save(update_fields=["exit_code"])
        job_transition(
            job=job,
            to_state=JobState.SUCCEEDED,
            actor_kind=ActorKind.AGENT,
            code="exited",
            message=f"All {len(members)} members exited with code 0 ({', '.join(m.node.name for m in members)}).",
            data={**data, "members": _members_data(members)},
        )
    else:
        job_transition(
            job=job,
            to_state=JobState.FAILED,
            actor_kind=ActorKind.AGENT,
            code="gang_failed",
            message=f"Failed: {first_failure.describe()}. All {len(members)} members have ended: {ended}.",
            data={
                **data,
                "failed_node": first_failure.node.name,
                "failed_rank": first_failure.rank,
                "exit_code": first_failure.exit_code,
                "members": _members_data(members),
            },
        )
    return Outcome(True, changed=True)


def _gang_event(job: Job, *, code: str, message: str, data: dict[str, Any]) -> None:
    """A gang member's end that moves the job nowhere yet: recorded, and shown to whoever follows the job."""
    JobEvent.objects.create(
        job=job,
        from_state=job.state,
        to_state=job.state,
        actor_kind=ActorKind.AGENT,
        code=code,
        message=message,
        data=data,
    )
    events.job_changed(
        job_id=job.pk,
        team_id=job.team_id,
        submitter_id=job.submitter_id,
        state=job.state,
        code=code,
        message=message,
    )


def _members_data(members: list[GangMember]) -> list[dict[str, Any]]:
    return [
        {
            "node": m.node.name,
            "rank": m.rank,
            "outcome": m.outcome,
            "state": m.reported_state,
            "exit_code": m.exit_code,
        }
        for m in members
    ]


# What an agent event may carry into the audit log: known fields, bounded (the rest is dropped).
_EVENT_FIELDS = {
    "gpu_uuid": str,
    "used_mib": int,
    "limit_mib": int,
    "at": float,
    "detail": str,
    "health": str,
}
_EVENT_TEXT_CHARS = 200
_EVENT_MAX_PIDS = 32


def _event_data(payload: dict[str, Any]) -> dict[str, Any]:
    """The known fields of an event payload, typed and bounded: an agent cannot fill the audit log."""
    data: dict[str, Any] = {}
    for key, kind in _EVENT_FIELDS.items():
        value = payload.get(key)
        if value is None:
            continue
        try:
            data[key] = _text(value)[:_EVENT_TEXT_CHARS] if kind is str else kind(value)
        except (TypeError, ValueError):
            continue
    pids = payload.get("pids")
    if isinstance(pids, list):
        data["pids"] = [int(p) for p in pids[:_EVENT_MAX_PIDS] if isinstance(p, int)]
    return data


MAX_MESSAGE_ID_CHARS = 64  # the agent's own are 32 (a uuid4 in hex)


def node_event(*, node_id: int, payload: dict[str, Any], message_id: str = "") -> Outcome:
    """Agent events: prevented neighbour interference (memory watchdog), GPU health changes, MPS trouble.
    An event about a job is refused unless the job's current attempt is placed on this node and still active;
    the same message (its `message_id`, sent again after a reconnect or on several connections) is recorded
    once: a repeat is a no-op."""
    kind = _text(payload.get("kind") or "")[:_EVENT_TEXT_CHARS]
    data = _event_data(payload)
    if len(message_id) > MAX_MESSAGE_ID_CHARS:
        # The stored id is what makes a repeat a no-op: a longer one could not be matched when it came again.
        return Outcome(False, f"a message id is at most {MAX_MESSAGE_ID_CHARS} characters")
    with transaction.atomic():
        node = Node.objects.get(pk=node_id)
        if kind == "prevented_neighbour_interference":
            try:
                job_id, attempt = int(payload["job_id"]), int(payload["attempt"])
            except (KeyError, TypeError, ValueError):
                return Outcome(False, "an interference event needs job_id and attempt")
            # Locked, so the same message arriving on two connections at once is looked up one after the other.
            job = Job.objects.select_for_update().filter(pk=job_id).first()
            if job is None or attempt != job.attempt or not _placed_here(job, node):
                return Outcome(
                    False, f"stale event: job {job_id} attempt {attempt} is not placed on {node.name}"
                )
            if job.state not in ACTIVE_STATES:
                return Outcome(False, f"job {job_id} has ended ({job.state}): no more events about it")
            if (
                message_id
                and JobEvent.objects.filter(job=job, code=kind, data__message_id=message_id).exists()
            ):
                return Outcome(True)  # already recorded: a repeat
            JobEvent.objects.create(
                job=job,
                from_state=job.state,
                to_state=job.state,
                actor_kind=ActorKind.AGENT,
                code=kind,
                message=(
                    f"Used {data.get('used_mib')} MiB on {node.name} against a {data.get('limit_mib')} MiB "
                    "slice: stopped before it could push its neighbours out of memory."
                ),
                data={**data, "node": node.name, "attempt": attempt, "message_id": message_id},
            )
            return Outcome(True, changed=True)
        if kind == "gpu_health":
            health = _HEALTH.get(str(payload.get("health")), GpuHealth.DEGRADED)
            if health != GpuHealth.OK:
                gpu = Gpu.objects.filter(node=node, uuid=data.get("gpu_uuid")).values_list("index", flat=True)
                which = f"GPU {gpu[0]}" if gpu else f"GPU {data.get('gpu_uuid')}"
                xids = payload.get("xid_events")
                detail = f": {data['detail']}" if data.get("detail") else ""
                if not detail and isinstance(xids, list) and xids:
                    detail = f" (XID {', '.join(_text(x)[:20] for x in xids[:5])})"
                node_error_note(node_id=node.pk, message=f"{which} reported {health}{detail}")
            updated = Gpu.objects.filter(node=node, uuid=data.get("gpu_uuid")).exclude(health=health)
            if updated.update(health=health):
                events.publish_after_commit(
                    groups.CLUSTER,
                    {
                        "type": "gpu.health",
                        "node": node.name,
                        "uuid": data.get("gpu_uuid"),
                        "health": health,
                    },
                )
                cycle_request_after_commit()
            return Outcome(True, changed=True)
        if kind == "mps_unavailable":
            simulated = payload.get("simulated") is True
            if not simulated:  # a simulated node has no MPS daemon by design: not an error of the node's
                detail = f": {data['detail']}" if data.get("detail") else ""
                node_error_note(node_id=node.pk, message=f"MPS unavailable{detail}")
            _log_mps_unavailable(node=node.name, detail=data.get("detail", ""), simulated=simulated)
            return Outcome(True)
        log.info("node %s event %s: %s", node.name, kind, data, extra={"node": node.name})
        return Outcome(True)


_simulated_mps_said = False


def _log_mps_unavailable(*, node: str, detail: str, simulated: bool) -> None:
    """A real node whose MPS slices are not limited is worth a warning each; simulated nodes (the demo's) have no
    MPS daemon by design, which this process says once."""
    global _simulated_mps_said
    if not simulated:
        log.warning("node %s: %s", node, detail, extra={"node": node})
    elif not _simulated_mps_said:
        _simulated_mps_said = True
        log.info(
            "simulated nodes (%s first) run MPS slices without nvidia-cuda-mps-control: their limits are not "
            "enforced, as expected off a GPU host",
            node,
            extra={"node": node},
        )


def log_chunk_check(
    *, job_id: int, attempt: int, stream: str, offset: int, payload: dict[str, Any]
) -> tuple[int, int, bytes] | None:
    """The agent's answer to our logs_request for (job_id, attempt, stream) at `offset`, checked without the
    database: (next offset, size on the agent's side, bytes), or None for an error answer, an answer about another
    placement, bytes that are not base64 or not as many as its offsets say, or a chunk larger than asked for."""
    if stream not in joblogs.STREAMS or "error" in payload:
        return None
    claimed = (str(payload.get("job_id")), str(payload.get("attempt")), str(payload.get("stream")))
    if claimed != (str(job_id), str(attempt), stream):
        return None
    try:
        next_offset, size = int(payload.get("next_offset", offset)), int(payload.get("size", 0))
    except (TypeError, ValueError):
        return None
    # The bytes travel as base64, so they arrive exactly as the job wrote them: exactly as many as the offsets
    # say, and never more than one chunk.
    encoded = payload.get("data_b64", "")
    if not isinstance(encoded, str):
        return None
    try:
        chunk = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    if (
        not offset <= next_offset <= offset + protocol.MAX_LOG_CHUNK_BYTES
        or len(chunk) != next_offset - offset
    ):
        return None
    return next_offset, size, chunk


def job_logs_store(
    *, node_id: int, job_id: int, attempt: int, stream: str, offset: int, payload: dict[str, Any]
) -> tuple[int, int] | None:
    """Store the agent's answer to our logs_request for (job_id, attempt, stream) at `offset` (both what the
    portal asked for, never what the answer claims). Returns (next offset, size) on the agent's side, or None
    when the chunk is refused: an error answer, an answer about another placement, a job not placed on this node,
    or a chunk larger than asked for."""
    checked = log_chunk_check(job_id=job_id, attempt=attempt, stream=stream, offset=offset, payload=payload)
    if checked is None:
        return None
    next_offset, size, chunk = checked
    with transaction.atomic():
        node = Node.objects.get(pk=node_id)
        job = Job.objects.filter(pk=job_id).first()
        if job is None or job.attempt != attempt or not _placed_here(job, node):
            return None
        base = _attempt_base(job_id, stream, attempt)
        size_stored = joblogs.log_append(job_id=job_id, stream=stream, data=chunk, offset=base + offset)
        if chunk:
            events.publish_after_commit(
                groups.job(job_id), {"type": "logs.appended", "stream": stream, "size": size_stored}
            )
    return next_offset, size


def _attempt_base(job_id: int, stream: str, attempt: int) -> int:
    """Where this attempt's log starts in the portal's per-job file: earlier attempts' logs come first."""
    marker = joblogs.log_path(job_id=job_id, stream=stream).with_suffix(f".attempt{attempt}")
    try:
        return int(marker.read_text())
    except (FileNotFoundError, ValueError):
        base = joblogs.log_size(job_id=job_id, stream=stream)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(base))
        return base


__all__ = [
    "Outcome",
    "HeartbeatSeen",
    "heartbeat_catch_up",
    "node_heartbeat_checked",
    "job_logs_store",
    "job_report",
    "node_acked",
    "node_disconnected",
    "node_error_note",
    "node_event",
    "node_heartbeat",
    "node_hello",
]
