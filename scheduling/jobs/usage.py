"""What a job holds and has used, in one definition: whole-GPU equivalents of a slice, milli-GPU held (the
fair-share unit, in Python and its SQL twin), and each team's decayed past usage.

A slice holds the larger of its compute share and its memory share of the card it was placed on, at most one
card; whole GPUs hold one card each. The REST usage, the team aggregates and the scheduler's fair share all
count it so.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import connection
from django.db.models import Q

from portal import database
from quotas.models import Team
from scheduling.choices import JobState
from scheduling.engine import types as eng
from scheduling.inventory.models import Gpu, GpuModel, Node
from scheduling.jobs.models import Job, JobEvent, Slice
from scheduling.jobs.states import ACTIVE_STATES, LIVE_STATES

# Usage older than this many half-lives weighs under 2 % and is not read at all.
USAGE_HISTORY_HALF_LIVES = 6


def slice_share(*, memory_mib: int, compute_pct: int, gpu_memory_mib: int) -> float:
    """Whole-GPU equivalents one slice holds: a 10 GiB / 25 % slice of an 80 GiB card counts 0.25."""
    memory_share = memory_mib / gpu_memory_mib if gpu_memory_mib else 0.0
    return min(1.0, max(memory_share, compute_pct / 100))


def job_held_milli(
    *, gpus: int, nodes: int, compute_pct: int, gpu_memory_mib: int, card_memory_mib: int
) -> int:
    """Milli-GPU a job holds while it runs (the fair-share unit): whole GPUs count 1000 each; a slice counts the
    larger of its compute share and its memory share of the card it was placed on (a memory-only slice holds its
    proportional compute share, as the engine charges it), at most one card. The SQL twin: _HELD_MILLI_SQL."""
    if gpus:
        return gpus * nodes * eng.WHOLE_GPU_MILLI
    memory_milli = -(-gpu_memory_mib * eng.WHOLE_GPU_MILLI // card_memory_mib) if card_memory_mib else 0
    return min(eng.WHOLE_GPU_MILLI, max(compute_pct * 10, memory_milli))


# job_held_milli in SQL, over the spans' columns (gpus, nodes, compute_pct, gpu_memory_mib, card_mib).
_HELD_MILLI_SQL = f"""CASE WHEN gpus > 0 THEN gpus * nodes * {eng.WHOLE_GPU_MILLI}
    ELSE LEAST({eng.WHOLE_GPU_MILLI}, GREATEST(compute_pct * 10,
         COALESCE(CEIL(gpu_memory_mib * {eng.WHOLE_GPU_MILLI}.0 / NULLIF(card_mib, 0)), 0))) END"""


def _cards_memory_mib(job_ids: list[int]) -> dict[int, int]:
    """Memory of the card each job's current slice was placed on (from its newest placement event; 0 if unknown),
    in two queries whatever the number of jobs."""
    if not job_ids:
        return {}
    sizes = {(n, i): m for n, i, m in Gpu.objects.values_list("node__name", "index", "memory_mib")}
    out = dict.fromkeys(job_ids, 0)
    placed = JobEvent.objects.filter(job_id__in=job_ids, to_state=JobState.PLACED).order_by(
        "job_id", "at", "id"
    )
    for job_id, data in placed.values_list("job_id", "data").iterator():
        try:
            node_name, gpu_index = data["gpus"][0][:2]
            out[job_id] = sizes.get((str(node_name), int(gpu_index)), 0)
        except (AttributeError, KeyError, IndexError, TypeError, ValueError):
            out[job_id] = 0
    return out


def decayed_usage(*, now_s: float, half_life_s: float) -> dict[str, float]:
    """Past GPU usage per team (milli-GPU-seconds), each second weighted 2^-(age / half-life).

    Summed by PostgreSQL where it can be (history grows without bound); the same sum in Python otherwise.
    """
    if database.postgresql():
        return _decayed_usage_sql(now_s=now_s, half_life_s=half_life_s)
    return _decayed_usage_python(now_s=now_s, half_life_s=half_life_s)


def _decayed_usage_python(*, now_s: float, half_life_s: float) -> dict[str, float]:
    since = datetime.fromtimestamp(now_s - USAGE_HISTORY_HALF_LIVES * half_life_s, tz=UTC)
    rows = Job.objects.filter(started_at__isnull=False).filter(
        Q(finished_at__isnull=True) | Q(finished_at__gte=since)
    )
    rate = math.log(2) / half_life_s
    usage: dict[str, float] = defaultdict(float)
    rows = list(
        rows.values_list(
            "pk", "team__slug", "gpus", "nodes", "compute_pct", "gpu_memory_mib", "started_at", "finished_at"
        )
    )
    cards = _cards_memory_mib([r[0] for r in rows if not r[2] and r[5]])
    for job_id, slug, gpus, nodes, pct, memory_mib, started, finished in rows:
        milli = job_held_milli(
            gpus=gpus,
            nodes=nodes,
            compute_pct=pct,
            gpu_memory_mib=memory_mib,
            card_memory_mib=0 if gpus or not memory_mib else cards[job_id],
        )
        t0, t1 = started.timestamp(), min(finished.timestamp() if finished else now_s, now_s)
        if t1 <= t0 or not milli:
            continue
        # The integral of milli * 2^-((now - t) / h) over [t0, t1].
        usage[slug] += milli * (math.exp(-rate * (now_s - t1)) - math.exp(-rate * (now_s - t0))) / rate
    return dict(usage)


def _decayed_usage_sql(*, now_s: float, half_life_s: float) -> dict[str, float]:
    job, team, event = Job._meta.db_table, Team._meta.db_table, JobEvent._meta.db_table
    node, gpu = Node._meta.db_table, Gpu._meta.db_table
    sql = f"""
        WITH rows AS (
          SELECT t.slug AS slug, j.gpus AS gpus, j.nodes AS nodes, j.compute_pct AS compute_pct,
                 j.gpu_memory_mib AS gpu_memory_mib,
                 CASE WHEN j.gpus = 0 AND j.gpu_memory_mib > 0 THEN (
                   SELECT g.memory_mib FROM {event} e
                     JOIN {node} n ON n.name = e.data->'gpus'->0->>0
                     JOIN {gpu} g ON g.node_id = n.id AND g.index = (e.data->'gpus'->0->>1)::int
                   WHERE e.job_id = j.id AND e.to_state = '{JobState.PLACED.value}'
                   ORDER BY e.at DESC, e.id DESC LIMIT 1) END AS card_mib,
                 EXTRACT(EPOCH FROM j.started_at)::float8 AS t0,
                 LEAST(COALESCE(EXTRACT(EPOCH FROM j.finished_at)::float8, %(now)s), %(now)s) AS t1
          FROM {job} j JOIN {team} t ON t.id = j.team_id
          WHERE j.started_at IS NOT NULL AND (j.finished_at IS NULL OR j.finished_at >= %(since)s)
        ),
        spans AS (SELECT slug, t0, t1, {_HELD_MILLI_SQL} AS milli FROM rows)
        SELECT slug, SUM(milli * (exp(-%(rate)s * (%(now)s - t1)) - exp(-%(rate)s * (%(now)s - t0))) / %(rate)s)
        FROM spans WHERE t1 > t0 AND milli > 0 GROUP BY slug
    """
    params = {
        "now": now_s,
        "rate": math.log(2) / half_life_s,
        "since": datetime.fromtimestamp(now_s - USAGE_HISTORY_HALF_LIVES * half_life_s, tz=UTC),
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {slug: float(total) for slug, total in cursor.fetchall()}


@dataclass
class TeamAllocation:
    gpus: float = 0.0
    gpu_memory_mib: int = 0
    compute_milli: int = 0  # the engine's unit: a whole GPU is 1000
    running_jobs: int = 0
    pending_jobs: int = 0
    members: set[int] = field(default_factory=set)


def allocations_by_team() -> dict[int, TeamAllocation]:
    """What each team holds right now, from the live slices, and how many of its jobs wait. (The part of it that
    is borrowed is `scheduling.cycle.selectors.borrowed_by_team`'s.)"""
    out: dict[int, TeamAllocation] = defaultdict(TeamAllocation)
    rows = Slice.objects.filter(job__state__in=ACTIVE_STATES).values_list(
        "job__team_id", "memory_mib", "compute_pct", "gpu__memory_mib"
    )
    for team_id, memory_mib, compute_pct, gpu_memory_mib in rows:
        alloc = out[team_id]
        alloc.gpus += slice_share(
            memory_mib=memory_mib, compute_pct=compute_pct, gpu_memory_mib=gpu_memory_mib
        )
        alloc.gpu_memory_mib += memory_mib
        alloc.compute_milli += compute_pct * 10
    counts = Job.objects.filter(state__in=LIVE_STATES).values_list("team_id", "state").order_by()
    for team_id, state in counts:
        if state in ACTIVE_STATES:
            out[team_id].running_jobs += 1
        elif state == JobState.PENDING:
            out[team_id].pending_jobs += 1
    return out


def pending_demand_milli() -> dict[int, tuple[int, int]]:
    """team id -> (pending jobs, milli-GPU they ask for). A slice asking for memory is counted against the
    smallest card in the catalogue (the most it could weigh); whole GPUs count 1000 each."""
    smallest_card = min(GpuModel.objects.values_list("memory_mib", flat=True), default=0)
    out: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for team_id, gpus, nodes, pct, memory_mib in Job.objects.filter(state=JobState.PENDING).values_list(
        "team_id", "gpus", "nodes", "compute_pct", "gpu_memory_mib"
    ):
        entry = out[team_id]
        entry[0] += 1
        entry[1] += job_held_milli(
            gpus=gpus, nodes=nodes, compute_pct=pct, gpu_memory_mib=memory_mib, card_memory_mib=smallest_card
        )
    return {team_id: (n, milli) for team_id, (n, milli) in out.items()}
