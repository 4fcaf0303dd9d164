"""Reads of the cluster and the teams as the scheduler stands: fair shares, fair-share standing, what each team
borrows, the summary.

What a team admin reads here is computed with the cycle's own inputs and the engine's accounting, so it is
what ranks their jobs.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Count, Sum

from quotas.models import Quota, Team
from scheduling.choices import GpuHealth, JobState, NodeState
from scheduling.cycle.snapshot import engine_quotas
from scheduling.engine import types as eng
from scheduling.engine.accounting import beyond_guarantee, dominant_share, history_share, quotas_on_capacity
from scheduling.inventory.models import Gpu, Node
from scheduling.inventory.selectors import schedulable_gpu_count
from scheduling.jobs.models import Job
from scheduling.jobs.states import ACTIVE_STATES
from scheduling.jobs.usage import (
    TeamAllocation,
    allocations_by_team,
    decayed_usage,
    pending_demand_milli,
    slice_share,
)


def fair_shares_gpus() -> dict[int, float]:
    """Each team's fair share in GPUs: its guarantee plus a weight-proportional part of the unguaranteed rest.

    A static reading of the quota tree (KAI-style water-filling without demand), for display; the engine's
    decisions use its own, demand-aware computation.
    """
    quotas = list(
        Quota.objects.filter(gpu_model__isnull=True).values_list(
            "team_id", "guaranteed_gpus", "fair_share_weight"
        )
    )
    total = Decimal(schedulable_gpu_count())
    guaranteed = sum((g for _, g, _ in quotas), Decimal(0))
    weights = sum((w for _, _, w in quotas), Decimal(0))
    rest = max(Decimal(0), total - guaranteed)
    return {team_id: float(g + (rest * w / weights if weights else 0)) for team_id, g, w in quotas}


def queue_shares(
    *,
    allocations: dict[int, TeamAllocation],
    now_s: float | None = None,
    quotas: Mapping[str, eng.Quota] | None = None,
) -> dict[int, dict[str, float]]:
    """Each team's fair-share standing as the scheduling cycle computes it, by team id.

    `held_share`: memory or compute held now relative to the team's guarantee, whichever is larger;
    `usage_share`: decayed past compute usage relative to what running at the guarantee would have accumulated;
    `queue_share`: the larger of the two over the fair-share weight, the number the queue orders a priority's
    jobs by (lower goes first). Same inputs and functions as the cycle's snapshot and the engine's fairshare
    plugin, so what a team admin reads here is what ranks their jobs. `allocations` is allocations_by_team(),
    `quotas` engine_quotas() (read when not given).
    """
    now_s = time.time() if now_s is None else now_s
    half_life_s = float(settings.TESSERA_FAIRSHARE_HALF_LIFE_S)
    quotas = engine_quotas() if quotas is None else quotas
    past = decayed_usage(now_s=now_s, half_life_s=half_life_s)
    out = {}
    for team_id, slug in Team.objects.values_list("pk", "slug"):
        quota = quotas.get(slug)
        weight = quota.weight if quota and quota.weight > 0 else 1.0
        held = allocations.get(team_id) or TeamAllocation()
        held_share = dominant_share(quota, (held.gpu_memory_mib, held.compute_milli))
        usage_share = history_share(quota, past.get(slug, 0.0), half_life_s)
        out[team_id] = {
            "held_share": round(held_share, 4),
            "usage_share": round(usage_share, 4),
            "queue_share": round(max(held_share, usage_share) / weight, 4),
        }
    return out


@dataclass(frozen=True)
class Borrowed:
    gpus: float  # whole-GPU equivalents (compute milli / 1000)
    gpu_memory_mib: int


def borrowed_by_team(
    *, allocations: dict[int, TeamAllocation], quotas: Mapping[str, eng.Quota] | None = None
) -> dict[int, Borrowed]:
    """What each team holds beyond its guarantee, by team id: the engine's `beyond_guarantee` of what it holds
    now against its guarantee, so a team guaranteed 4 GPUs that holds 8 borrows 4, whichever of its jobs carry
    the borrowed label; a team with no guarantee borrows all it holds. `allocations` is allocations_by_team(),
    `quotas` engine_quotas() (read when not given)."""
    quotas = engine_quotas() if quotas is None else quotas
    # As the engine applies them: a memory-only guarantee also guarantees its share of the compute.
    capacity = Gpu.objects.exclude(node__state=NodeState.LOST).aggregate(
        memory_mib=Sum("memory_mib"), cards=Count("pk")
    )
    quotas = quotas_on_capacity(
        quotas, int(capacity["memory_mib"] or 0), int(capacity["cards"] or 0) * eng.WHOLE_GPU_MILLI
    )
    out = {}
    for team_id, slug in Team.objects.values_list("pk", "slug"):
        held = allocations.get(team_id) or TeamAllocation()
        memory_mib, compute_milli = beyond_guarantee(
            quotas.get(slug), (held.gpu_memory_mib, held.compute_milli)
        )
        out[team_id] = Borrowed(gpus=compute_milli / eng.WHOLE_GPU_MILLI, gpu_memory_mib=memory_mib)
    return out


def cluster_summary() -> dict[str, Any]:
    """The whole cluster in numbers: nodes by state, capacity and allocation by GPU model, per-team aggregates."""
    node_states = Counter(Node.objects.values_list("state", flat=True))
    models: dict[str, dict[str, Any]] = {}
    ready_states = {NodeState.READY, NodeState.DRAINING}
    gpu_rows = Gpu.objects.values_list(
        "pk",
        "model__name",
        "memory_mib",
        "allocated_memory_mib",
        "allocated_compute_pct",
        "health",
        "node__state",
    )
    for _pk, model, memory, alloc_mem, alloc_pct, health, node_state in gpu_rows:
        entry = models.setdefault(
            model,
            {
                "model": model,
                "gpus": 0,
                "ready_gpus": 0,
                "memory_mib": 0,
                "allocated_memory_mib": 0,
                "allocated_gpus": 0.0,
                "free_whole_gpus": 0,
            },
        )
        ready = node_state in ready_states and health != GpuHealth.FAILED
        entry["gpus"] += 1
        entry["ready_gpus"] += int(ready)
        entry["memory_mib"] += memory
        entry["allocated_memory_mib"] += alloc_mem
        entry["allocated_gpus"] += slice_share(
            memory_mib=alloc_mem, compute_pct=alloc_pct, gpu_memory_mib=memory
        )
        entry["free_whole_gpus"] += int(ready and alloc_mem == 0 and alloc_pct == 0)
    allocations = allocations_by_team()
    borrowed = borrowed_by_team(allocations=allocations)
    shares = fair_shares_gpus()
    guaranteed = dict(Quota.objects.filter(gpu_model__isnull=True).values_list("team_id", "guaranteed_gpus"))
    team_rows = []
    for team in Team.objects.filter(parent__isnull=False) | Team.objects.filter(pk__in=list(guaranteed)):
        alloc = allocations.get(team.pk)
        team_rows.append(
            {
                "team": team.slug,
                "guaranteed_gpus": float(guaranteed[team.pk]) if team.pk in guaranteed else None,
                "fair_share_gpus": round(shares[team.pk], 3) if team.pk in shares else None,
                "allocated_gpus": round(alloc.gpus, 3) if alloc else 0.0,
                "borrowed_gpus": round(borrowed[team.pk].gpus, 3),
                "running_jobs": alloc.running_jobs if alloc else 0,
                "pending_jobs": alloc.pending_jobs if alloc else 0,
            }
        )
    team_rows.sort(key=lambda r: r["team"])
    for entry in models.values():
        entry["allocated_gpus"] = round(entry["allocated_gpus"], 3)
    return {
        "nodes": dict(node_states),
        "gpus": sum(m["gpus"] for m in models.values()),
        "memory_mib": sum(m["memory_mib"] for m in models.values()),
        "allocated_memory_mib": sum(m["allocated_memory_mib"] for m in models.values()),
        "allocated_gpus": round(sum(m["allocated_gpus"] for m in models.values()), 3),
        "pending_jobs": Job.objects.filter(state=JobState.PENDING).count(),
        "running_jobs": Job.objects.filter(state__in=ACTIVE_STATES).count(),
        "models": sorted(models.values(), key=lambda m: m["model"]),
        "teams": team_rows,
    }


@dataclass(frozen=True)
class TeamStanding:
    """A team now, in GPUs (whole-GPU equivalents as usage.slice_share counts them): what its all-models quota
    guarantees and limits, what it holds and borrows beyond the guarantee, its fair share, its jobs."""

    guaranteed_gpus: float  # 0 without an all-models quota
    limit_gpus: float | None  # None: no limit
    held_gpus: float
    borrowed_gpus: float
    fair_share_gpus: float | None  # None: no quota row
    running_jobs: int
    pending_jobs: int
    pending_gpus: float  # what its pending jobs ask for


def team_standings() -> dict[int, TeamStanding]:
    """Every team's standing, by team id, read once: what the team page, the history recorder and /metrics show."""
    allocations = allocations_by_team()
    borrowed = borrowed_by_team(allocations=allocations)
    shares = fair_shares_gpus()
    waiting = pending_demand_milli()
    quotas = {
        team_id: (guaranteed, limit)
        for team_id, guaranteed, limit in Quota.objects.filter(gpu_model__isnull=True).values_list(
            "team_id", "guaranteed_gpus", "limit_gpus"
        )
    }
    out = {}
    for team_id in Team.objects.values_list("pk", flat=True):
        alloc = allocations.get(team_id) or TeamAllocation()
        guaranteed, limit = quotas.get(team_id, (0, None))
        pending_jobs, pending_milli = waiting.get(team_id, (0, 0))
        out[team_id] = TeamStanding(
            guaranteed_gpus=float(guaranteed),
            limit_gpus=None if limit is None else float(limit),
            held_gpus=alloc.gpus,
            borrowed_gpus=borrowed[team_id].gpus if team_id in borrowed else 0.0,
            fair_share_gpus=shares.get(team_id),
            running_jobs=alloc.running_jobs,
            pending_jobs=pending_jobs,
            pending_gpus=pending_milli / eng.WHOLE_GPU_MILLI,
        )
    return out
