"""Reads of the history rollups for the portal's charts and tables. Every read is one indexed, aggregating query
(the database buckets and sums; Python only shapes the answer), so a 30-day page of a 1,000-node cluster reads
kilobytes, not the millions of rows behind it.

Times are UTC. `step_s` is the width of a chart's bucket: each bucket is the mean of the rows in it (a minute
table read at step 3600 gives hourly means). Series come as columns for uPlot: `t` (Unix seconds) and one list
per measure, None where a bucket has no row.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import reduce
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count, Min, Q

from portal import database
from quotas.models import PriorityClass, Team
from scheduling.agents.live_metrics import live_metrics_for_nodes
from scheduling.choices import GpuHealth, JobState, NodeState
from scheduling.engine import types as eng
from scheduling.history.models import (
    WAIT_BUCKETS,
    WAIT_RATIO,
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
    wait_quantile,
)
from scheduling.inventory.models import Gpu, GpuModel, Node
from scheduling.jobs.models import Job, JobEvent

MILLI = eng.WHOLE_GPU_MILLI
# Windows the pages offer, and the bucket each is drawn with (about 150-350 points a series).
WINDOWS = {
    "1h": (timedelta(hours=1), 60),
    "6h": (timedelta(hours=6), 120),
    "24h": (timedelta(hours=24), 300),
    "7d": (timedelta(days=7), 3600),
    "30d": (timedelta(days=30), 3 * 3600),
}


@dataclass(frozen=True)
class Window:
    name: str
    since: datetime
    until: datetime
    step_s: int


def window(name: str, *, now: datetime | None = None, default: str = "24h") -> Window:
    """The named window ending now (an unknown name gives the default)."""
    name = name if name in WINDOWS else default
    span, step = WINDOWS[name]
    until = (now or datetime.now(UTC)).astimezone(UTC)
    return Window(name, until - span, until, step)


def _bucket_key(column: str, step_s: int) -> str:
    """What rows are grouped by: the bucket's start (PostgreSQL's date_bin, twice as fast as arithmetic on the
    numeric EXTRACT gives), or its Unix second on SQLite."""
    if database.postgresql():
        return f"date_bin(INTERVAL '{int(step_s)} seconds', {column}, TIMESTAMPTZ 'epoch')"
    return f"(FLOOR({database.epoch(column)} / {int(step_s)}) * {int(step_s)})"


def _bucket(column: str, step_s: int) -> str:
    """The bucket's start in Unix seconds, computed once per group (GROUP BY the _bucket_key)."""
    if database.postgresql():
        return f"EXTRACT(EPOCH FROM {_bucket_key(column, step_s)})"
    return _bucket_key(column, step_s)


def _fetch(sql: str, params: Sequence[Any]) -> list[tuple]:
    """Run a hand-written read. Moments are passed as the database stores them (on SQLite, naive UTC text),
    so a row exactly on a window's edge compares equal there as it does on PostgreSQL."""
    adapt = connection.ops.adapt_datetimefield_value
    params = [adapt(p) if isinstance(p, datetime) else p for p in params]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _marks(values: Collection) -> str:
    return ", ".join(["%s"] * len(values))


def _columns(rows: list[tuple], names: Sequence[str], *, w: Window) -> dict[str, list]:
    """Rows of (bucket, *measures) into uPlot columns over every bucket of the window (gaps as None)."""
    found = {int(r[0]): r[1:] for r in rows}
    first = math.floor(w.since.timestamp() / w.step_s) * w.step_s
    ts = list(range(first, int(w.until.timestamp()) + 1, w.step_s))
    out: dict[str, list] = {"t": ts}
    for i, name in enumerate(names):
        out[name] = [
            None if found.get(t) is None or found[t][i] is None else round(float(found[t][i]), 3) for t in ts
        ]
    return out


# --- capacity -------------------------------------------------------------------------------------------------
CAPACITY_MEASURES = ("ready_gpus", "allocated_gpus", "used_gpus", "free_gpus", "stranded_gpus")


def capacity_series(*, w: Window) -> list[dict[str, Any]]:
    """Per GPU model over the window: ready, allocated, used (utilisation summed), wholly free, and free capacity
    stranded on partly used cards, in GPUs."""
    table = ModelMinute._meta.db_table
    rows = _fetch(
        f"""SELECT model_id, {_bucket("at", w.step_s)} AS b, AVG(ready_gpus), AVG(allocated_milli) / {MILLI},
                   AVG(used_milli) / {MILLI}, AVG(free_gpus), AVG(stranded_milli) / {MILLI}
            FROM {table} WHERE at >= %s AND at < %s GROUP BY model_id, {_bucket_key("at", w.step_s)} ORDER BY model_id, b""",
        [w.since, w.until],
    )
    names = dict(GpuModel.objects.values_list("pk", "name"))
    by_model: dict[int, list[tuple]] = {}
    for model_id, *rest in rows:
        by_model.setdefault(model_id, []).append(tuple(rest))
    return sorted(
        (
            {"model": names.get(model_id, f"model {model_id}"), **_columns(r, CAPACITY_MEASURES, w=w)}
            for model_id, r in by_model.items()
        ),
        key=lambda s: s["model"],
    )


def node_heatmap(*, node_ids: Collection[int], w: Window) -> dict[int, dict[int, float | None]]:
    """node id -> bucket (Unix s) -> mean utilisation (%) of its GPUs; the per-node heatmap's cells."""
    if not node_ids:
        return {}
    table = NodeMinute._meta.db_table
    rows = _fetch(
        f"""SELECT node_id, {_bucket("at", w.step_s)} AS b, AVG(util_pct) FROM {table}
            WHERE node_id IN ({_marks(node_ids)}) AND at >= %s AND at < %s GROUP BY node_id, {_bucket_key("at", w.step_s)}""",
        [*node_ids, w.since, w.until],
    )
    out: dict[int, dict[int, float | None]] = {}
    for node_id, b, util in rows:
        out.setdefault(node_id, {})[int(b)] = None if util is None else round(float(util), 1)
    return out


def node_series(*, node_id: int, w: Window) -> dict[str, list]:
    """One node over the window: allocated and used GPUs, memory allocated and used (GiB), power (W)."""
    table = NodeMinute._meta.db_table
    rows = _fetch(
        f"""SELECT {_bucket("at", w.step_s)} AS b, AVG(allocated_milli) / {MILLI}, AVG(util_pct) * AVG(gpus) / 100,
                   AVG(memory_allocated_mib) / 1024, AVG(memory_used_mib) / 1024, AVG(power_w)
            FROM {table} WHERE node_id = %s AND at >= %s AND at < %s GROUP BY {_bucket_key("at", w.step_s)} ORDER BY b""",
        [node_id, w.since, w.until],
    )
    return _columns(
        rows, ("allocated_gpus", "used_gpus", "memory_allocated_gib", "memory_used_gib", "power_w"), w=w
    )


GPU_MEASURES = (
    "util_pct",
    "memory_used_gib",
    "memory_allocated_gib",
    "temperature_c",
    "power_w",
    "sm_clock_mhz",
)


def gpu_series(*, node_id: int, w: Window) -> list[dict[str, Any]]:
    """Each GPU of a node over the window (5-minute windows, coarser for long ranges): the DCGM set."""
    step = max(w.step_s, 300)
    table = GpuFiveMinute._meta.db_table
    rows = _fetch(
        f"""SELECT gpu_id, {_bucket("at", step)} AS b,
                   SUM(util_pct_sum) / SUM(samples), MAX(memory_used_mib_max) / 1024.0,
                   MAX(memory_allocated_mib) / 1024.0, MAX(temperature_c_max), SUM(power_w_sum) / SUM(samples),
                   SUM(sm_clock_mhz_sum) / SUM(samples)
            FROM {table} WHERE node_id = %s AND at >= %s AND at < %s AND samples > 0
            GROUP BY gpu_id, {_bucket_key("at", step)} ORDER BY gpu_id, b""",
        [node_id, w.since, w.until],
    )
    index_of = dict(Gpu.objects.filter(node_id=node_id).values_list("pk", "index"))
    stepped = Window(w.name, w.since, w.until, step)
    by_gpu: dict[int, list[tuple]] = {}
    for gpu_id, *rest in rows:
        by_gpu.setdefault(gpu_id, []).append(tuple(rest))
    return sorted(
        (
            {"gpu_id": gpu_id, "index": index_of.get(gpu_id), **_columns(r, GPU_MEASURES, w=stepped)}
            for gpu_id, r in by_gpu.items()
        ),
        key=lambda s: (s["index"] is None, s["index"] or 0),
    )


def gpu_events(*, node_id: int, w: Window, limit: int = 100) -> list[GpuEvent]:
    return list(
        GpuEvent.objects.filter(node_id=node_id, at__gte=w.since, at__lt=w.until).order_by("-at", "-id")[
            :limit
        ]
    )


# --- teams ----------------------------------------------------------------------------------------------------
TEAM_MEASURES = (
    "guaranteed_gpus",
    "limit_gpus",
    "held_gpus",
    "borrowed_gpus",
    "pending_gpus",
    "fair_share_gpus",
)


def team_series(*, team_id: int, w: Window) -> dict[str, list]:
    table = TeamMinute._meta.db_table
    rows = _fetch(
        f"""SELECT {_bucket("at", w.step_s)} AS b, AVG(guaranteed_milli) / {MILLI}, AVG(limit_milli) / {MILLI},
                   AVG(held_milli) / {MILLI}, AVG(borrowed_milli) / {MILLI}, AVG(pending_milli) / {MILLI},
                   AVG(fair_share_milli) / {MILLI}
            FROM {table} WHERE team_id = %s AND at >= %s AND at < %s GROUP BY {_bucket_key("at", w.step_s)} ORDER BY b""",
        [team_id, w.since, w.until],
    )
    return _columns(rows, TEAM_MEASURES, w=w)


def quota_satisfaction(*, team_id: int, since: datetime, until: datetime) -> float | None:
    """The seed's quota satisfaction rate from the minute rows: of what the team was owed within its guarantee
    (the smaller of its guarantee and what it held or asked for), the part it held. None: it was owed nothing."""
    table = TeamMinute._meta.db_table
    table, least = TeamMinute._meta.db_table, database.least()
    owed = f"{least}(guaranteed_milli, held_milli + pending_milli)"
    rows = _fetch(
        f"SELECT SUM({owed}), SUM({least}(held_milli, {owed})) FROM {table} "
        "WHERE team_id = %s AND at >= %s AND at < %s",
        [team_id, since, until],
    )
    owed, met = rows[0] if rows else (None, None)
    return None if not owed else round(float(met) / float(owed), 4)


WAIT_P95_NOTE = "from a histogram of waits, within 10 %"


def _hour_floor(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def waits(
    *,
    since: datetime,
    until: datetime,
    team_ids: Collection[int] | None = None,
    step_s: int | None = None,
) -> dict[str, Any]:
    """Jobs that started in the window: how many, and their wait from submit to start: the mean (exact) and the
    p95 (s; from the histogram of waits, within 10 %), with per-bucket columns (`series`: the mean wait and the
    jobs started each `step_s` seconds) when `step_s` is given. `team_ids`: only these teams' jobs.

    The whole hours the roll has closed come from `WaitHour` (one aggregating query over its rows); the rest (the
    window's partial first hour, and from the newest hour rolled up to now) from the jobs' own rows, a small
    range of the `job_started_at` index."""
    out: dict[str, Any] = {"jobs": 0, "wait_mean_s": None, "wait_p95_s": None}
    if team_ids is not None and not team_ids:
        return out if step_s is None else {**out, "series": _wait_columns({}, since, until, step_s)}
    # Hours before the newest one rolled (each hour rolled has a row) are closed: the roll recomputed them after
    # they ended. (A row dated ahead of the clock is no sign of a roll.)
    newest = (
        WaitHour.objects.filter(hour__lte=datetime.now(UTC))
        .order_by("-hour")
        .values_list("hour", flat=True)
        .first()
    )
    first = _hour_floor(since) + (timedelta(hours=1) if _hour_floor(since) < since else timedelta(0))
    last = min(_hour_floor(until), newest) if newest is not None else first
    counts: dict[int, int] = {}
    per_step: dict[int, list[float]] = {}  # bucket start (Unix s) -> [jobs, summed wait]
    total = [0, 0.0]

    def add(bucket: int, b: int | None, n: int, wait_s: float) -> None:
        if not n:  # an hour's mark that it was rolled
            return
        counts[bucket] = counts.get(bucket, 0) + n
        total[0] += n
        total[1] += wait_s
        if b is not None:
            entry = per_step.setdefault(b, [0, 0.0])
            entry[0] += n
            entry[1] += wait_s

    # As the ORM writes them (SQLite keeps naive UTC text, which an aware bound would not compare equal to).
    where, params = (
        "hour >= %s AND hour < %s",
        [connection.ops.adapt_datetimefield_value(v) for v in (first, last)],
    )
    if team_ids is not None:
        where += f" AND team_id IN ({_marks(team_ids)})"
        params += list(team_ids)
    table = WaitHour._meta.db_table
    if last > first:
        if step_s is None:
            for bucket, n, wait_s in _fetch(
                f"SELECT bucket, SUM(jobs), SUM(wait_s_sum) FROM {table} WHERE {where} GROUP BY bucket",
                params,
            ):
                add(int(bucket), None, int(n), float(wait_s))
        else:
            for b, bucket, n, wait_s in _fetch(
                f"""SELECT {_bucket("hour", step_s)}, bucket, SUM(jobs), SUM(wait_s_sum) FROM {table}
                    WHERE {where} GROUP BY {_bucket_key("hour", step_s)}, bucket""",
                params,
            ):
                add(int(bucket), int(b), int(n), float(wait_s))
        ranges = [(since, first), (last, until)]
    else:
        ranges = [(since, until)]
    for b, bucket, n, wait_s in _job_waits(ranges=ranges, team_ids=team_ids, step_s=step_s):
        add(bucket, b, n, wait_s)
    if total[0]:
        out = {
            "jobs": total[0],
            "wait_mean_s": round(total[1] / total[0], 1),
            "wait_p95_s": round(wait_quantile(counts, 0.95), 1),
        }
    if step_s is not None:
        out["series"] = _wait_columns(per_step, since, until, step_s)
    return out


def _job_waits(
    *, ranges: list[tuple[datetime, datetime]], team_ids: Collection[int] | None, step_s: int | None
) -> list[tuple[int | None, int, int, float]]:
    """(bucket start or None, wait bucket, jobs, summed wait) of the jobs started in the ranges, from their own
    rows: aggregated in the database on PostgreSQL (from the `job_started_at` index), in Python on SQLite (whose
    builds need not have LN; the embedded demo's few jobs)."""
    ranges = [(start, end) for start, end in ranges if start < end]
    if not ranges:
        return []
    if not database.postgresql():
        jobs = Job.objects.filter(
            reduce(operator.or_, (Q(started_at__gte=start, started_at__lt=end) for start, end in ranges))
        )
        if team_ids is not None:
            jobs = jobs.filter(team_id__in=list(team_ids))
        out = []
        for submitted_at, started_at in jobs.order_by().values_list("submitted_at", "started_at"):
            wait = max(0.0, (started_at - submitted_at).total_seconds())
            b = None if step_s is None else math.floor(started_at.timestamp() / step_s) * step_s
            out.append((b, wait_bucket(wait), 1, wait))
        return out
    where = " OR ".join(["(started_at >= %s AND started_at < %s)"] * len(ranges))
    params: list[Any] = [v for r in ranges for v in r]
    if team_ids is not None:
        where = f"({where}) AND team_id IN ({_marks(team_ids)})"
        params += list(team_ids)
    # wait_bucket in SQL: 0 under a second, else floor(log_ratio(wait)) + 1, the last bucket past 30 days.
    bucket = (
        f"CASE WHEN w < 1 THEN 0 ELSE LEAST({WAIT_BUCKETS - 1}, FLOOR(LN(w) / LN({WAIT_RATIO}))::int + 1) END"
    )
    b = "NULL" if step_s is None else _bucket("started_at", step_s)
    rows = _fetch(
        f"""SELECT {b}, {bucket}, COUNT(*), SUM(w) FROM (
                SELECT started_at, GREATEST(0, EXTRACT(EPOCH FROM started_at - submitted_at)::float8) AS w
                FROM {Job._meta.db_table} WHERE {where}) j
            GROUP BY 1, 2""",
        params,
    )
    return [(None if r[0] is None else int(r[0]), int(r[1]), int(r[2]), float(r[3])) for r in rows]


def _wait_columns(per_step: dict[int, list[float]], since: datetime, until: datetime, step_s: int) -> dict:
    rows = [(b, wait_s / n if n else None, n) for b, (n, wait_s) in per_step.items()]
    return _columns(rows, ("wait_mean_s", "started_jobs"), w=Window("", since, until, step_s))


def wait_stats(
    *, since: datetime, until: datetime, team_ids: Collection[int] | None = None
) -> dict[str, Any]:
    """Jobs that started in the window: how many, their mean wait from submit to start (exact) and its p95 (s,
    from the histogram of waits, within 10 %)."""
    return waits(since=since, until=until, team_ids=team_ids)


def wait_series(*, w: Window, step_s: int = 86400) -> dict[str, Any]:
    """The cluster's jobs started in the window: count, mean and p95 wait (s), and the mean wait and the jobs
    started in each bucket (`series`, a day by default)."""
    return waits(since=w.since, until=w.until, step_s=step_s)


def priority_inversions(*, team_id: int, since: datetime, until: datetime) -> int:
    """The team's jobs that started in the window while an earlier-submitted job of the team at a higher
    priority was still waiting (jobs with a declared max runtime excepted: they are backfill), as the simulator
    counts them."""
    job, pc = Job._meta.db_table, PriorityClass._meta.db_table
    rows = _fetch(
        f"""SELECT COUNT(*) FROM {job} j JOIN {pc} p ON p.id = j.priority_class_id
            WHERE j.team_id = %s AND j.started_at >= %s AND j.started_at < %s AND j.max_runtime_s IS NULL
              AND EXISTS (
                SELECT 1 FROM {job} k JOIN {pc} kp ON kp.id = k.priority_class_id
                WHERE k.team_id = j.team_id AND kp.value > p.value AND k.submitted_at < j.submitted_at
                  AND (k.started_at IS NULL OR k.started_at > j.started_at)
                  AND (k.finished_at IS NULL OR k.finished_at > j.started_at))""",
        [team_id, since, until],
    )
    return int(rows[0][0])


def preemptions_suffered(*, team_id: int, since: datetime, until: datetime) -> int:
    return JobEvent.objects.filter(
        job__team_id=team_id, to_state=JobState.PREEMPTED, at__gte=since, at__lt=until
    ).count()


# --- usage ----------------------------------------------------------------------------------------------------
USAGE_GROUPS = ("team", "user", "model")


def usage_totals(
    *, since: datetime, until: datetime, group: str, team_ids: Collection[int] | None = None
) -> list[dict[str, Any]]:
    """GPU-hours and idle-allocated GPU-hours by team, user or model from the hourly rows (hours that start in
    the window), largest first. `team_ids`: only these teams (None: all)."""
    if group not in USAGE_GROUPS:
        raise ValueError(f"group is one of {', '.join(USAGE_GROUPS)}")
    column = {"team": "team_id", "user": "user_id", "model": "model_id"}[group]
    table = UsageHour._meta.db_table
    where, params = "hour >= %s AND hour < %s", [since, until]
    if team_ids is not None:
        if not team_ids:
            return []
        where += f" AND team_id IN ({_marks(team_ids)})"
        params += list(team_ids)
    rows = _fetch(
        f"""SELECT {column}, SUM(gpu_seconds) / 3600, SUM(idle_gpu_seconds) / 3600 FROM {table}
            WHERE {where} GROUP BY {column} ORDER BY 2 DESC""",
        params,
    )
    ids = [r[0] for r in rows]
    if group == "team":
        names = dict(Team.objects.filter(pk__in=ids).values_list("pk", "slug"))
    elif group == "user":
        names = dict(get_user_model().objects.filter(pk__in=ids).values_list("pk", "username"))
    else:
        names = dict(GpuModel.objects.filter(pk__in=ids).values_list("pk", "name"))
    return [
        {
            group: names.get(key, "(unknown)" if key else "(model not known)"),
            "gpu_hours": round(float(hours or 0), 3),
            "idle_gpu_hours": round(float(idle or 0), 3),
        }
        for key, hours, idle in rows
    ]


def usage_series(
    *, w: Window, step_s: int = 86400, team_ids: Collection[int] | None = None
) -> dict[str, list]:
    """GPU-hours per bucket (a day by default) over the window, with the idle-allocated part."""
    table = UsageHour._meta.db_table
    where, params = "hour >= %s AND hour < %s", [w.since, w.until]
    if team_ids is not None:
        where += f" AND team_id IN ({_marks(team_ids) or 'NULL'})"
        params += list(team_ids)
    rows = _fetch(
        f"""SELECT {_bucket("hour", step_s)} AS b, SUM(gpu_seconds) / 3600, SUM(idle_gpu_seconds) / 3600
            FROM {table} WHERE {where} GROUP BY {_bucket_key("hour", step_s)} ORDER BY b""",
        params,
    )
    return _columns(rows, ("gpu_hours", "idle_gpu_hours"), w=Window(w.name, w.since, w.until, step_s))


def queue_series(*, w: Window) -> dict[str, list]:
    table = ClusterMinute._meta.db_table
    rows = _fetch(
        f"""SELECT {_bucket("at", w.step_s)} AS b, AVG(pending_jobs), MAX(pending_jobs), AVG(running_jobs)
            FROM {table} WHERE at >= %s AND at < %s GROUP BY {_bucket_key("at", w.step_s)} ORDER BY b""",
        [w.since, w.until],
    )
    return _columns(rows, ("pending_jobs", "pending_jobs_max", "running_jobs"), w=w)


def usage_by_team_user_model(*, since: datetime, until: datetime) -> list[tuple[int, int, int, float, float]]:
    """(team id, user id, model id, GPU-hours, idle-allocated GPU-hours) for the hours that start in the window:
    one scan of the hourly rows that the history page sums by team, user and model (a row per person and card
    model they used, not per hour)."""
    table = UsageHour._meta.db_table
    rows = _fetch(
        f"""SELECT team_id, user_id, model_id, SUM(gpu_seconds) / 3600, SUM(idle_gpu_seconds) / 3600
            FROM {table} WHERE hour >= %s AND hour < %s GROUP BY team_id, user_id, model_id""",
        [since, until],
    )
    return [(t, u, m, float(h or 0), float(i or 0)) for t, u, m, h, i in rows]


def usage_daily(
    *, w: Window, group: str, team_ids: Collection[int] | None = None, step_s: int = 86400
) -> dict[int, dict[int, float]]:
    """GPU-hours per bucket (a day by default) for each team, user or model id: id -> bucket (Unix s) -> hours.
    One query; the page names the ids and stacks them. `team_ids`: only these teams' rows (None: all)."""
    if group not in USAGE_GROUPS:
        raise ValueError(f"group is one of {', '.join(USAGE_GROUPS)}")
    column = {"team": "team_id", "user": "user_id", "model": "model_id"}[group]
    table = UsageHour._meta.db_table
    where, params = "hour >= %s AND hour < %s", [w.since, w.until]
    if team_ids is not None:
        if not team_ids:
            return {}
        where += f" AND team_id IN ({_marks(team_ids)})"
        params += list(team_ids)
    rows = _fetch(
        f"""SELECT {column}, {_bucket("hour", step_s)} AS b, SUM(gpu_seconds) / 3600 FROM {table}
            WHERE {where} GROUP BY {column}, {_bucket_key("hour", step_s)}""",
        params,
    )
    out: dict[int, dict[int, float]] = {}
    for key, b, hours in rows:
        out.setdefault(key, {})[int(b)] = round(float(hours or 0), 3)
    return out


# --- capacity now, pools and the pool heatmap -------------------------------------------------------------------
def capacity_now() -> list[dict[str, Any]]:
    """Per GPU model as the inventory stands: cards, ready, allocated, used (utilisation summed over the cards
    with a live sample; None where none has one), wholly free, and free capacity stranded on partly allocated
    ready cards, in GPUs. One aggregating query, plus the live samples."""
    gpu, node, model = Gpu._meta.db_table, Node._meta.db_table, GpuModel._meta.db_table
    ready = f"n.state IN ('{NodeState.READY}', '{NodeState.DRAINING}') AND g.health <> '{GpuHealth.FAILED}'"
    share = (
        f"{database.least()}(1.0, CASE WHEN g.memory_mib > 0 THEN "
        f"{database.greatest()}(1.0 * g.allocated_memory_mib / g.memory_mib, g.allocated_compute_pct / 100.0) "
        "ELSE g.allocated_compute_pct / 100.0 END)"
    )
    rows = _fetch(
        f"""SELECT m.id, m.name, COUNT(*), SUM(CASE WHEN {ready} THEN 1 ELSE 0 END), SUM({share}),
                   SUM(CASE WHEN {ready} AND g.allocated_memory_mib = 0 AND g.allocated_compute_pct = 0
                       THEN 1 ELSE 0 END),
                   SUM(CASE WHEN {ready} AND (g.allocated_memory_mib > 0 OR g.allocated_compute_pct > 0)
                       THEN 1 - {share} ELSE 0 END)
            FROM {gpu} g JOIN {node} n ON n.id = g.node_id JOIN {model} m ON m.id = g.model_id
            GROUP BY m.id, m.name ORDER BY m.name""",
        [],
    )
    used = _used_now_by_model()
    return [
        {
            "model": name,
            "gpus": int(gpus),
            "ready_gpus": int(ready_n or 0),
            "allocated_gpus": round(float(alloc or 0), 2),
            "used_gpus": None if model_id not in used else round(used[model_id], 2),
            "free_gpus": int(free or 0),
            "stranded_gpus": round(float(stranded or 0), 2),
        }
        for model_id, name, gpus, ready_n, alloc, free, stranded in rows
    ]


def _used_now_by_model() -> dict[int, float]:
    """GPU model id -> utilisation summed over its cards' newest live samples (2 cards at 50 % = 1.0)."""
    live = live_metrics_for_nodes(node_names=Node.objects.values_list("name", flat=True))
    if not live:
        return {}
    used: dict[int, float] = {}
    for name, index, model_id in Gpu.objects.filter(node__name__in=list(live)).values_list(
        "node__name", "index", "model_id"
    ):
        util = (live.get(name, {}).get(index) or {}).get("util_pct")
        if util is not None:
            used[model_id] = used.get(model_id, 0.0) + min(100.0, max(0.0, float(util))) / 100
    return used


@dataclass(frozen=True)
class Pool:
    """Nodes drawn as one row of the heatmap: those labelled `pool=<name>`, else those of one GPU model."""

    name: str
    node_ids: tuple[int, ...]
    gpus: int


def node_pools() -> list[Pool]:
    """The cluster's pools, by name: a node's `pool` label, else its GPU model (nodes without GPUs: "no GPUs")."""
    model_of = dict(
        Gpu.objects.values("node_id").annotate(m=Min("model__name")).values_list("node_id", "m").order_by()
    )
    gpus_of = dict(
        Gpu.objects.values("node_id").annotate(n=Count("id")).values_list("node_id", "n").order_by()
    )
    members: dict[str, list[int]] = {}
    for pk, labels in Node.objects.order_by("name").values_list("pk", "labels"):
        pool = (labels or {}).get("pool") if isinstance(labels, dict) else None
        members.setdefault(str(pool or model_of.get(pk) or "no GPUs"), []).append(pk)
    return sorted(
        (Pool(name, tuple(ids), sum(gpus_of.get(i, 0) for i in ids)) for name, ids in members.items()),
        key=lambda p: p.name,
    )


def pool_heatmap(*, pools: Sequence[Pool], w: Window) -> dict[str, dict[int, tuple[float | None, float]]]:
    """pool name -> bucket (Unix s, whole hours) -> (mean utilisation %, allocated %) of the pool's cards,
    weighting each node by its GPUs, from the hourly node rows. One aggregating query: the node -> pool map
    travels as a VALUES list. A pool of one node is that node's row (the per-node heatmap)."""
    pairs = [(node_id, i) for i, p in enumerate(pools) for node_id in p.node_ids]
    if not pairs:
        return {}
    table = NodeHour._meta.db_table
    values = ", ".join(["(%s, %s)"] * len(pairs))
    # A few nodes (one page of a pool): name them, so their rows are read by the (node_id, hour) key.
    few = f"AND h.node_id IN ({_marks(pairs)})" if len(pairs) <= 200 else ""
    step = max(3600, w.step_s)
    since = datetime.fromtimestamp(math.floor(w.since.timestamp() / step) * step, UTC)
    rows = _fetch(
        f"""WITH pool_of(node_id, pool) AS (VALUES {values})
            SELECT p.pool, {_bucket("h.hour", step)} AS b,
                   SUM(h.util_pct_sum * h.gpus) / NULLIF(SUM(h.util_minutes * h.gpus), 0),
                   SUM(h.allocated_milli_sum) * {100 / MILLI} / NULLIF(SUM(h.minutes * h.gpus), 0)
            FROM {table} h JOIN pool_of p ON p.node_id = h.node_id
            WHERE h.hour >= %s AND h.hour < %s {few} GROUP BY p.pool, {_bucket_key("h.hour", step)}""",
        [*(v for pair in pairs for v in pair), since, w.until, *([n for n, _ in pairs] if few else [])],
    )
    out: dict[str, dict[int, tuple[float | None, float]]] = {}
    for pool, b, util, alloc in rows:
        out.setdefault(pools[pool].name, {})[int(b)] = (
            None if util is None else round(float(util), 1),
            round(float(alloc or 0), 1),
        )
    return out


@dataclass(frozen=True)
class GpuHistory:
    source: str  # "prometheus" or "rollups"
    note: str  # what to tell the reader about where the figures come from
    step_s: int
    gpus: list[dict[str, Any]]


def node_gpu_history(*, node_id: int, node_name: str, w: Window) -> GpuHistory:
    """A node's GPUs over the window: from Prometheus where PROMETHEUS_URL is set (at the window's step), else
    (or when it does not answer) from the portal's 5-minute rollups."""
    from scheduling.history import prometheus

    if prometheus.configured():
        try:
            found = prometheus.gpu_series(
                node_name=node_name, since=w.since.timestamp(), until=w.until.timestamp(), step_s=w.step_s
            )
            return GpuHistory(
                "prometheus", "From Prometheus (the dcgm-exporter series of /metrics).", w.step_s, found
            )
        except prometheus.PrometheusUnavailable as exc:
            note = f"{exc}; showing the portal's own 5-minute history instead."
    else:
        note = "The portal's own history: each GPU's mean over 5-minute windows (PROMETHEUS_URL unset)."
    step = max(w.step_s, 300)
    return GpuHistory("rollups", note, step, gpu_series(node_id=node_id, w=w))
