"""Heartbeats: the node is alive (a lost node is revived), in one statement on PostgreSQL; and the starts a heartbeat
shows whose start reports never came, recorded off the heartbeat's own path."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.utils import timezone

from portal import database
from portal.database import fetch_rows
from scheduling import lock_objects
from scheduling.agents.reports.job_status import StartReport, job_starts_record
from scheduling.agents.reports.nodes import node_revive
from scheduling.choices import JobState, NodeState
from scheduling.cycle.models import NodeSync
from scheduling.inventory.models import Node
from scheduling.jobs.models import Job

log = logging.getLogger(__name__)


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
            node_revive(node)
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
    `heartbeat_catch_up` to record off the heartbeat's own path. (`node_heartbeats_checked` for one.)"""
    return node_heartbeats_checked(beats=[Beat(node_id, token_hash, running)])[0]


class Beat(NamedTuple):
    node_id: int
    token_hash: str  # the connection's: nothing is recorded for a node whose token is no longer this one
    running: Any  # the heartbeat's placements alive on the host, as the agent sent them


def node_heartbeats_checked(*, beats: list[Beat]) -> list[HeartbeatSeen]:
    """`node_heartbeat_checked` for many heartbeats (of many nodes) at once, in their order.

    On PostgreSQL the usual case (the token current, the node not lost) is one statement for them all: 1,000 nodes
    send 200 heartbeats a second, and a statement (with its transaction) per heartbeat was most of the agents'
    database threads' time, and a tenth of a core of the agents' web processes (bench/cluster_scale.py); before
    that, the token check, the UPDATE in its transaction and the two reads were six round trips each."""
    if not beats:
        return []
    alive = [_alive(b.running) for b in beats]
    placed_before = timezone.now() - timedelta(seconds=START_REPORT_GRACE_S)
    if not database.postgresql():
        seen = []
        for beat, runs in zip(beats, alive, strict=True):
            if not Node.objects.filter(pk=beat.node_id, agent_token_hash=beat.token_hash).exists():
                seen.append(HeartbeatSeen(False, None, ()))
                continue
            _heartbeat_record(node_id=beat.node_id)
            version = (
                NodeSync.objects.filter(node_id=beat.node_id)
                .values_list("desired_version", flat=True)
                .first()
            )
            seen.append(HeartbeatSeen(True, version, tuple(_behind(alive=runs, placed_before=placed_before))))
        return seen
    with transaction.atomic():
        # Not waiting for its WAL flush: a heartbeat lost in a database crash is the next one 5 s later. Waiting,
        # 200 heartbeats a second queued behind each other's fsync (0.2 s each while a cycle's writes were being
        # flushed), and busy nodes were declared lost (bench/cluster_scale.py at 1,000 nodes).
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
        rows = _heartbeats_statement(beats, alive, placed_before)
    seen = []
    for beat, (token_ok, recorded, version, behind) in zip(beats, rows, strict=True):
        if not token_ok:
            seen.append(HeartbeatSeen(False, None, ()))
            continue
        if not recorded:  # a lost node speaking again: revived
            _heartbeat_record(node_id=beat.node_id)
        seen.append(HeartbeatSeen(True, version, tuple(behind)))
    return seen


def _heartbeats_statement(
    beats: list[Beat], alive: list[dict[int, dict[str, Any]]], placed_before: datetime
) -> list[tuple]:
    return fetch_rows(*heartbeats_sql(beats, alive, placed_before))


def heartbeats_sql(
    beats: list[Beat], alive: list[dict[int, dict[str, Any]]], placed_before: datetime
) -> tuple[str, list[Any]]:
    """One row per heartbeat, in order: (token current, recorded, desired version, jobs behind). The nodes are
    locked in id order before their update, as every other writer of many nodes takes them, so two such writers
    never wait on each other in a cycle.

    The jobs a heartbeat names are looked up by id, and only then is their state checked (`OFFSET 0` keeps the
    planner from merging the two): given both at once, it walked the index on (state, submitted_at) over every
    placed job for each heartbeat, 5 ms a heartbeat with 1,568 placed, and up to 11 s a batch while an array's
    8,000 tasks were placed and starting (statistics taken before a cycle see almost none placed)."""
    node_t, sync_t, job_t = (m._meta.db_table for m in (Node, NodeSync, Job))
    return (
        f"""
        WITH hb AS (
            SELECT * FROM unnest(%s::bigint[], %s::text[], %s::text[]) WITH ORDINALITY
                AS b(node_id, token_hash, alive, k)
        ),
        token AS (
            SELECT DISTINCT hb.node_id, hb.token_hash FROM hb
            JOIN {node_t} AS n ON n.id = hb.node_id AND n.agent_token_hash = hb.token_hash
        ),
        locked AS (
            SELECT n.id FROM {node_t} AS n
            WHERE n.id IN (SELECT node_id FROM token) AND n.state <> %s
            ORDER BY n.id FOR NO KEY UPDATE
        ),
        beat AS (
            UPDATE {node_t} AS n SET last_heartbeat_at = %s FROM locked WHERE n.id = locked.id RETURNING n.id
        )
        SELECT t.node_id IS NOT NULL, t.node_id IS NOT NULL AND b.id IS NOT NULL, s.desired_version,
            ARRAY(
                SELECT r.id FROM (
                    SELECT j.id, j.state, j.placed_at FROM {job_t} AS j WHERE j.id = ANY(hb.alive::bigint[]) OFFSET 0
                ) AS r
                WHERE r.state IN (%s, %s) AND r.placed_at < %s ORDER BY r.id
            )
        FROM hb
        LEFT JOIN token AS t ON t.node_id = hb.node_id AND t.token_hash = hb.token_hash
        LEFT JOIN beat AS b ON b.id = hb.node_id
        LEFT JOIN {sync_t} AS s ON s.node_id = hb.node_id
        ORDER BY hb.k
        """,
        [
            [b.node_id for b in beats],
            [b.token_hash for b in beats],
            ["{" + ",".join(str(job_id) for job_id in runs) + "}" for runs in alive],
            NodeState.LOST,
            timezone.now(),
            JobState.PLACED,
            JobState.STARTING,
            placed_before,
        ],
    )


_MAX_ID = 2**63


def _alive(running: Any) -> dict[int, dict[str, Any]]:
    """The heartbeat's placements that run now, by job id (malformed entries skipped)."""
    alive: dict[int, dict[str, Any]] = {}
    for entry in running if isinstance(running, list) else []:
        if not isinstance(entry, dict) or entry.get("state") != "running":
            continue
        try:
            job_id = int(entry["job_id"])
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
        if 0 < job_id < _MAX_ID:  # no job has another id, and one out of a bigint's range fails the statement
            alive[job_id] = entry
    return alive


def _behind(*, alive: dict[int, dict[str, Any]], placed_before: datetime) -> list[int]:
    """Of the jobs a heartbeat runs, those placed or starting since before `placed_before`: read by id, the rest
    checked here (as in heartbeats_sql, and for the same reason)."""
    return [
        pk
        for pk, state, placed_at in Job.objects.filter(pk__in=alive)
        .order_by("pk")
        .values_list("pk", "state", "placed_at")
        if state in (JobState.PLACED, JobState.STARTING)
        and placed_at is not None
        and placed_at < placed_before
    ]


def heartbeat_catch_up(*, node_id: int, running: Any, token_hash: str | None = None) -> list[int]:
    """Record the starts a heartbeat shows whose start reports never came (jobs placed over START_REPORT_GRACE_S
    ago that run on the node), as start reports written together (job_starts_record: a wave of them, while the
    reports themselves queue behind others, is a few statements, not nine each); the jobs moved to running.
    `token_hash`: the connection's (nothing is recorded if the node's token has changed since); None, the node's."""
    alive = _alive(running)
    behind = _behind(alive=alive, placed_before=timezone.now() - timedelta(seconds=START_REPORT_GRACE_S))
    if not behind:
        return []
    if token_hash is None:
        token_hash = Node.objects.filter(pk=node_id).values_list("agent_token_hash", flat=True).first() or ""
    reports = [
        StartReport(
            node_id,
            token_hash,
            {
                "job_id": job_id,
                "attempt": alive[job_id].get("attempt"),
                "state": "started",
                "pid": alive[job_id].get("pid"),
                "adopted": alive[job_id].get("adopted"),
                "via": "heartbeat",
            },
        )
        for job_id in behind
    ]
    outcomes = job_starts_record(reports=reports)
    moved = [job_id for job_id, outcome in zip(behind, outcomes, strict=True) if outcome and outcome.changed]
    if moved:
        log.info(
            "node %s: heartbeat shows jobs %s running; their start reports had not arrived", node_id, moved
        )
    return moved
