"""Writes the history rollups: each minute the cluster as it stands, each few minutes the hours' GPU-seconds and
queue times from the jobs' own records, XID / ECC events as agents report them. Safe to run twice: a minute is claimed by its
`ClusterMinute` row, so a second recorder of the same minute writes nothing."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Count

from portal import database
from quotas.models import Quota, Team
from scheduling.agents.live_metrics import IDLE_UTIL_PCT, live_metrics_for_nodes
from scheduling.choices import GpuHealth, JobState, NodeState
from scheduling.cycle.selectors import team_standings
from scheduling.engine import types as eng
from scheduling.history.models import (
    WAIT_ROLLED_MARK,
    ClusterMinute,
    GpuEvent,
    GpuFiveMinute,
    ModelMinute,
    NodeHour,
    NodeMinute,
    TeamMinute,
    UsageHour,
    WaitHour,
    wait_bucket,
)
from scheduling.history.partitions import history_prune, partitions_ensure
from scheduling.inventory.models import Gpu, GpuModel, Node
from scheduling.jobs.chargeback import usage_rows
from scheduling.jobs.models import Job, Slice
from scheduling.jobs.states import ACTIVE_STATES
from scheduling.jobs.usage import slice_share
from scheduling.notifications.services import admin_notify

log = logging.getLogger(__name__)

MILLI = eng.WHOLE_GPU_MILLI
GPU_WINDOW_MIN = 5
READY_STATES = (NodeState.READY, NodeState.DRAINING)


def _minute(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(second=0, microsecond=0)


@dataclass
class _GpuRow:
    pk: int
    node_id: int
    index: int
    model_id: int
    memory_mib: int
    allocated_memory_mib: int
    allocated_compute_pct: int
    health: str

    @property
    def allocated_milli(self) -> int:
        share = slice_share(
            memory_mib=self.allocated_memory_mib,
            compute_pct=self.allocated_compute_pct,
            gpu_memory_mib=self.memory_mib,
        )
        return round(share * MILLI)


def history_record(*, now: datetime | None = None) -> bool:
    """Write this minute's rows. Returns False when another recorder already wrote them."""
    at = _minute(now or datetime.now(UTC))
    partitions_ensure(days=[at.date()])
    nodes = list(Node.objects.values_list("pk", "name", "state"))
    gpus = [
        _GpuRow(*row)
        for row in Gpu.objects.values_list(
            "pk",
            "node_id",
            "index",
            "model_id",
            "memory_mib",
            "allocated_memory_mib",
            "allocated_compute_pct",
            "health",
        )
    ]
    live = live_metrics_for_nodes(node_names=[name for _, name, _ in nodes])
    name_of = {pk: name for pk, name, _ in nodes}
    state_of = {pk: state for pk, _, state in nodes}
    sample_of: dict[int, dict[str, Any]] = {}
    for g in gpus:
        found = live.get(name_of.get(g.node_id, ""), {}).get(g.index)
        if found is not None:
            sample_of[g.pk] = found
    with transaction.atomic():
        if not _claim(at, _queue_counts(nodes)):
            return False
        node_rows = _node_rows(at, nodes, gpus, sample_of)
        NodeMinute.objects.bulk_create(node_rows, batch_size=2000)
        _node_hours_add(at, node_rows)
        _gpu_windows_add(at, gpus, sample_of)
        ModelMinute.objects.bulk_create(_model_rows(at, gpus, state_of, sample_of))
        TeamMinute.objects.bulk_create(_team_rows(at))
        _idle_add(at, sample_of)
    return True


def _claim(at: datetime, counts: dict[str, int]) -> bool:
    """Insert the minute's ClusterMinute row; False when it is there already (another recorder has the minute)."""
    table = ClusterMinute._meta.db_table
    columns = ", ".join(counts)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (at, {columns}) VALUES (%s{', %s' * len(counts)}) "
            "ON CONFLICT (at) DO NOTHING RETURNING at",
            [at, *counts.values()],
        )
        return cursor.fetchone() is not None


def _queue_counts(nodes: list[tuple]) -> dict[str, int]:
    counts = dict(
        Job.objects.filter(state__in=[JobState.PENDING, *ACTIVE_STATES])
        .values_list("state")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {
        "pending_jobs": counts.get(JobState.PENDING, 0),
        "running_jobs": sum(counts.get(s, 0) for s in ACTIVE_STATES),
        "ready_nodes": sum(1 for _, _, state in nodes if state in READY_STATES),
        "nodes": len(nodes),
    }


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 2) if values else None


def _node_rows(at, nodes, gpus, sample_of) -> list[NodeMinute]:
    by_node: dict[int, list[_GpuRow]] = defaultdict(list)
    for g in gpus:
        by_node[g.node_id].append(g)
    rows = []
    for pk, _name, state in nodes:
        cards = by_node.get(pk, [])
        samples = [sample_of[g.pk] for g in cards if g.pk in sample_of]
        util = [s["util_pct"] for s in samples if s.get("util_pct") is not None]
        used = [s["memory_used_mib"] for s in samples if s.get("memory_used_mib") is not None]
        power = [s["power_w"] for s in samples if s.get("power_w") is not None]
        temps = [s["temperature_c"] for s in samples if s.get("temperature_c") is not None]
        rows.append(
            NodeMinute(
                node_id=pk,
                at=at,
                state=state,
                gpus=len(cards),
                allocated_milli=sum(g.allocated_milli for g in cards),
                util_pct=_mean(util),
                memory_used_mib=sum(used) if used else None,
                memory_allocated_mib=sum(g.allocated_memory_mib for g in cards),
                memory_mib=sum(g.memory_mib for g in cards),
                power_w=round(sum(power), 1) if power else None,
                temperature_max_c=max(temps) if temps else None,
            )
        )
    return rows


def _node_hours_add(at: datetime, rows: list[NodeMinute]) -> None:
    """Add this minute of each node into its hour (the heatmap's rows; one upsert statement a batch)."""
    table, hour = NodeHour._meta.db_table, at.replace(minute=0)
    sql = f"""INSERT INTO {table} (node_id, hour, minutes, gpus, allocated_milli_sum, util_pct_sum, util_minutes)
              VALUES (%s, %s, 1, %s, %s, %s, %s)
              ON CONFLICT (node_id, hour) DO UPDATE SET
                minutes = {table}.minutes + 1, gpus = EXCLUDED.gpus,
                allocated_milli_sum = {table}.allocated_milli_sum + EXCLUDED.allocated_milli_sum,
                util_pct_sum = {table}.util_pct_sum + EXCLUDED.util_pct_sum,
                util_minutes = {table}.util_minutes + EXCLUDED.util_minutes"""
    values = [
        (r.node_id, hour, r.gpus, r.allocated_milli, r.util_pct or 0.0, int(r.util_pct is not None))
        for r in rows
    ]
    if values:
        with connection.cursor() as cursor:
            cursor.executemany(sql, values)


def _gpu_windows_add(at: datetime, gpus: list[_GpuRow], sample_of: dict[int, dict]) -> None:
    """Add this minute's sample of each sampled GPU into its 5-minute window (one upsert statement a batch)."""
    window = at.replace(minute=at.minute - at.minute % GPU_WINDOW_MIN)
    rows = []
    for g in gpus:
        s = sample_of.get(g.pk)
        if s is None:
            continue
        rows.append(
            (
                g.pk,
                window,
                g.node_id,
                1,
                float(s.get("util_pct") or 0.0),
                s.get("memory_used_mib"),
                g.allocated_memory_mib,
                s.get("temperature_c"),
                float(s.get("power_w") or 0.0),
                float(s.get("sm_clock_mhz") or 0.0),
                s.get("ecc_uncorrected_volatile"),
            )
        )
    if not rows:
        return
    table, top = GpuFiveMinute._meta.db_table, database.greatest()

    def most(column: str) -> str:
        return f"{top}(COALESCE({table}.{column}, EXCLUDED.{column}), COALESCE(EXCLUDED.{column}, {table}.{column}))"

    sql = f"""INSERT INTO {table} (gpu_id, at, node_id, samples, util_pct_sum, memory_used_mib_max,
                  memory_allocated_mib, temperature_c_max, power_w_sum, sm_clock_mhz_sum, ecc_uncorrected)
              VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
              ON CONFLICT (gpu_id, at) DO UPDATE SET
                samples = {table}.samples + 1,
                util_pct_sum = {table}.util_pct_sum + EXCLUDED.util_pct_sum,
                memory_used_mib_max = {most("memory_used_mib_max")},
                memory_allocated_mib = {most("memory_allocated_mib")},
                temperature_c_max = {most("temperature_c_max")},
                power_w_sum = {table}.power_w_sum + EXCLUDED.power_w_sum,
                sm_clock_mhz_sum = {table}.sm_clock_mhz_sum + EXCLUDED.sm_clock_mhz_sum,
                ecc_uncorrected = COALESCE(EXCLUDED.ecc_uncorrected, {table}.ecc_uncorrected)"""
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def _model_rows(at, gpus: list[_GpuRow], state_of, sample_of) -> list[ModelMinute]:
    totals: dict[int, dict[str, int]] = {}
    for g in gpus:
        t = totals.setdefault(
            g.model_id,
            {
                "gpus": 0,
                "ready_gpus": 0,
                "allocated_milli": 0,
                "used_milli": 0,
                "free_gpus": 0,
                "stranded_milli": 0,
            },
        )
        ready = state_of.get(g.node_id) in READY_STATES and g.health != GpuHealth.FAILED
        held = g.allocated_milli
        t["gpus"] += 1
        t["ready_gpus"] += int(ready)
        t["allocated_milli"] += held
        util = (sample_of.get(g.pk) or {}).get("util_pct")
        if util is not None:
            t["used_milli"] += round(min(100.0, max(0.0, util)) * MILLI / 100)
        if ready and not g.allocated_memory_mib and not g.allocated_compute_pct:
            t["free_gpus"] += 1
        elif ready and held < MILLI:
            t["stranded_milli"] += MILLI - held
    return [ModelMinute(at=at, model_id=model_id, **t) for model_id, t in totals.items()]


def _milli(gpus) -> int | None:
    return None if gpus is None else round(float(gpus) * MILLI)


def _team_rows(at: datetime) -> list[TeamMinute]:
    standings = team_standings()
    quota_teams = set(Quota.objects.filter(gpu_model__isnull=True).values_list("team_id", flat=True))
    # Teams that run work or hold a quota (an organisation with a quota of its own counts too).
    leaves = set(Team.objects.filter(children__isnull=True).values_list("pk", flat=True))
    rows = []
    for team_id in sorted((leaves | quota_teams) & set(standings)):
        t = standings[team_id]
        rows.append(
            TeamMinute(
                at=at,
                team_id=team_id,
                guaranteed_milli=_milli(t.guaranteed_gpus),
                limit_milli=_milli(t.limit_gpus),
                held_milli=_milli(t.held_gpus),
                borrowed_milli=_milli(t.borrowed_gpus),
                fair_share_milli=_milli(t.fair_share_gpus),
                pending_jobs=t.pending_jobs,
                pending_milli=_milli(t.pending_gpus),
                running_jobs=t.running_jobs,
            )
        )
    return rows


def _idle_add(at: datetime, sample_of: dict[int, dict]) -> None:
    """A minute of each running slice on a card under the idle threshold counts as idle-allocated GPU time."""
    idle: dict[tuple[int, int, int], float] = defaultdict(float)
    for gpu_id, team_id, user_id, model_id, memory_mib, pct, card_mib in Slice.objects.filter(
        job__state=JobState.RUNNING
    ).values_list(
        "gpu_id",
        "job__team_id",
        "job__submitter_id",
        "gpu__model_id",
        "memory_mib",
        "compute_pct",
        "gpu__memory_mib",
    ):
        util = (sample_of.get(gpu_id) or {}).get("util_pct")
        if util is None or util >= IDLE_UTIL_PCT:
            continue
        share = slice_share(memory_mib=memory_mib, compute_pct=pct, gpu_memory_mib=card_mib)
        idle[(team_id, user_id, model_id)] += share * 60
    if not idle:
        return
    hour = at.replace(minute=0)
    table = UsageHour._meta.db_table
    sql = f"""INSERT INTO {table} (hour, team_id, user_id, model_id, gpu_seconds, gpu_memory_gib_seconds,
                  idle_gpu_seconds) VALUES (%s, %s, %s, %s, 0, 0, %s)
              ON CONFLICT (hour, team_id, user_id, model_id)
              DO UPDATE SET idle_gpu_seconds = {table}.idle_gpu_seconds + EXCLUDED.idle_gpu_seconds"""
    with connection.cursor() as cursor:
        cursor.executemany(sql, [(hour, *key, round(seconds, 3)) for key, seconds in idle.items()])


def usage_hours_roll(*, now: datetime | None = None, hours: int = 2) -> int:
    """Recompute the GPU-seconds of the last `hours` hours (this one included, up to now) from the jobs' own
    records, as the usage API counts them. Returns the rows written."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    since = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours - 1)
    rows = usage_rows(
        jobs=Job.objects.all(), since=since, until=now, group_by=("team", "user", "model", "hour")
    )
    if not rows:
        return 0
    team_ids = dict(Team.objects.filter(slug__in={r["team"] for r in rows}).values_list("slug", "pk"))
    user_ids = dict(
        get_user_model().objects.filter(username__in={r["user"] for r in rows}).values_list("username", "pk")
    )
    model_ids = dict(GpuModel.objects.values_list("name", "pk"))
    table = UsageHour._meta.db_table
    sql = f"""INSERT INTO {table} (hour, team_id, user_id, model_id, gpu_seconds, gpu_memory_gib_seconds,
                  idle_gpu_seconds) VALUES (%s, %s, %s, %s, %s, %s, 0)
              ON CONFLICT (hour, team_id, user_id, model_id) DO UPDATE SET
                gpu_seconds = EXCLUDED.gpu_seconds, gpu_memory_gib_seconds = EXCLUDED.gpu_memory_gib_seconds"""
    values = [
        (
            r["hour"],
            team_ids[r["team"]],
            user_ids[r["user"]],
            model_ids.get(r["model"], 0),
            round(r["gpu_hours"] * 3600, 3),
            round(r["gpu_memory_gib_hours"] * 3600, 3),
        )
        for r in rows
        if r["team"] in team_ids and r["user"] in user_ids
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, values)
    return len(values)


WAIT_ROLL_CHUNK = timedelta(days=1)


def waits_roll(*, now: datetime | None = None, since: datetime | None = None) -> int:
    """Recompute the queue-time rollup (`WaitHour`) from the jobs that started since the last roll: every hour
    from the one before the newest hour rolled (late commits land there) through this one, from the jobs' own
    rows; with nothing rolled yet (or `since` given), from the retention period's start (or `since`). Each hour's
    rows are replaced (deleted and upserted, in one transaction a day of hours): safe to run twice, or at once.
    Returns the rows written for teams (each hour's mark of the roll aside)."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    if since is None:
        newest = (
            WaitHour.objects.filter(hour__lte=now).order_by("-hour").values_list("hour", flat=True).first()
        )
        since = (
            newest - timedelta(hours=1)
            if newest is not None
            else now - timedelta(days=settings.TESSERA_HISTORY_RETENTION_DAYS)
        )
    start = since.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    written = 0
    while start <= now:
        end = min(
            start + WAIT_ROLL_CHUNK, now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
        )
        written += _waits_roll_hours(start, end)
        start = end
    return written


def _waits_roll_hours(start: datetime, end: datetime) -> int:
    """Replace the rollup's rows of the hours in [start, end) (whole hours) with what the jobs' rows say."""
    sums: dict[tuple[datetime, int, int], list] = {}
    jobs = Job.objects.filter(started_at__gte=start, started_at__lt=end).values_list(
        "team_id", "submitted_at", "started_at"
    )
    for team_id, submitted_at, started_at in jobs.order_by().iterator(chunk_size=5000):
        wait = max(0.0, (started_at - submitted_at).total_seconds())
        hour = started_at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        entry = sums.setdefault((hour, team_id, wait_bucket(wait)), [0, 0.0])
        entry[0] += 1
        entry[1] += wait
    rows = [
        WaitHour(hour=hour, team_id=team_id, bucket=bucket, jobs=n, wait_s_sum=round(total, 3))
        for (hour, team_id, bucket), (n, total) in sums.items()
    ]
    # Each hour rolled gets a row of no team (0) and no jobs, so the readers know how far the roll has come
    # even through hours when nothing started.
    hour, marks = start, []
    while hour < end:
        marks.append(WaitHour(hour=hour, team_id=WAIT_ROLLED_MARK, bucket=0, jobs=0, wait_s_sum=0.0))
        hour += timedelta(hours=1)
    with transaction.atomic():
        WaitHour.objects.filter(hour__gte=start, hour__lt=end).delete()
        WaitHour.objects.bulk_create(
            rows + marks,
            batch_size=2000,
            update_conflicts=True,
            unique_fields=["hour", "team_id", "bucket"],
            update_fields=["jobs", "wait_s_sum"],
        )
    return len(rows)


def gpu_events_record(*, node_id: int, gpus: list[dict[str, Any]], at: datetime | None = None) -> int:
    """Keep the XID events of an agent's sample, one row each (they are rare; each one matters)."""
    at = at or datetime.now(UTC)
    uuids = {str(g.get("uuid")) for g in gpus if g.get("xid_events")}
    if not uuids:
        return 0
    ids = dict(Gpu.objects.filter(node_id=node_id, uuid__in=uuids).values_list("uuid", "pk"))
    rows = [
        GpuEvent(
            at=at,
            node_id=node_id,
            gpu_id=ids.get(str(g.get("uuid"))),
            gpu_uuid=str(g.get("uuid"))[:80],
            kind="xid",
            code=int(x),
        )
        for g in gpus
        for x in (g.get("xid_events") or [])[:16]
        if isinstance(x, int) and not isinstance(x, bool)
    ]
    GpuEvent.objects.bulk_create(rows)
    if rows:
        node = Node.objects.filter(pk=node_id).values_list("name", flat=True).first() or str(node_id)
        codes = ", ".join(f"XID {r.code} on {r.gpu_uuid}" for r in rows[:8])
        admin_notify(
            kind="gpu_xid",
            subject=f"XID error on {node}",
            body=f"{node} reported {codes}. See /cluster/{node}/.",
        )
    return len(rows)


def history_maintain(*, now: datetime | None = None) -> dict[str, int]:
    """The periodic upkeep: next days' partitions, and what is older than the retention period dropped."""
    return history_prune(now=now or datetime.now(UTC), retention_days=settings.TESSERA_HISTORY_RETENTION_DAYS)
