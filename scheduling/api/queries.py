"""Reads the API needs beyond scheduling.selectors: who may do what to a job, and team and cluster aggregates.

Aggregates count GPUs in whole-GPU equivalents: a slice counts max(memory share, compute share) of its card.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser

from quotas.models import Quota, Team
from quotas.selectors import team_ids_administered_by, team_ids_for_user
from scheduling.choices import GpuHealth, JobState, NodeState
from scheduling.cycle import decayed_usage, engine_quotas
from scheduling.engine.accounting import dominant_share, history_share
from scheduling.models import Gpu, Job, Slice
from scheduling.states import ACTIVE_STATES, LIVE_STATES


def slice_share(*, memory_mib: int, compute_pct: int, gpu_memory_mib: int) -> float:
    """Whole-GPU equivalents one slice holds: a 10 GiB / 25 % slice of an 80 GiB card counts 0.25."""
    memory_share = memory_mib / gpu_memory_mib if gpu_memory_mib else 0.0
    return min(1.0, max(memory_share, compute_pct / 100))


def can_cancel_job(*, user: AbstractBaseUser, job: Job) -> bool:
    """Staff: any job; a team admin: any job of the team; a member: their own jobs."""
    if user.is_staff:
        return True
    if job.team_id in team_ids_administered_by(user=user):
        return True
    return job.submitter_id == user.pk and job.team_id in team_ids_for_user(user=user)


@dataclass
class TeamAllocation:
    gpus: float = 0.0
    gpu_memory_mib: int = 0
    compute_milli: int = 0  # the engine's unit: a whole GPU is 1000
    borrowed_gpus: float = 0.0
    borrowed_gpu_memory_mib: int = 0
    running_jobs: int = 0
    pending_jobs: int = 0
    members: set[int] = field(default_factory=set)


def allocations_by_team() -> dict[int, TeamAllocation]:
    """What each team holds right now, from the live slices, and how many of its jobs wait."""
    out: dict[int, TeamAllocation] = defaultdict(TeamAllocation)
    rows = Slice.objects.filter(job__state__in=ACTIVE_STATES).values_list(
        "job__team_id", "job__borrowed", "memory_mib", "compute_pct", "gpu__memory_mib"
    )
    for team_id, borrowed, memory_mib, compute_pct, gpu_memory_mib in rows:
        share = slice_share(memory_mib=memory_mib, compute_pct=compute_pct, gpu_memory_mib=gpu_memory_mib)
        alloc = out[team_id]
        alloc.gpus += share
        alloc.gpu_memory_mib += memory_mib
        alloc.compute_milli += compute_pct * 10
        if borrowed:
            alloc.borrowed_gpus += share
            alloc.borrowed_gpu_memory_mib += memory_mib
    counts = Job.objects.filter(state__in=LIVE_STATES).values_list("team_id", "state").order_by()
    for team_id, state in counts:
        if state in ACTIVE_STATES:
            out[team_id].running_jobs += 1
        elif state == JobState.PENDING:
            out[team_id].pending_jobs += 1
    return out


def schedulable_gpu_count() -> int:
    return (
        Gpu.objects.filter(node__state__in=[NodeState.READY, NodeState.DRAINING])
        .exclude(health=GpuHealth.FAILED)
        .count()
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
    *, allocations: dict[int, TeamAllocation], now_s: float | None = None
) -> dict[int, dict[str, float]]:
    """Each team's fair-share standing as the scheduling cycle computes it, by team id.

    `held_share`: memory or compute held now relative to the team's guarantee, whichever is larger;
    `usage_share`: decayed past compute usage relative to what running at the guarantee would have accumulated;
    `queue_share`: the larger of the two over the fair-share weight, the number the queue orders a priority's
    jobs by (lower goes first). Same inputs and functions as the cycle's snapshot and the engine's fairshare
    plugin, so what a team admin reads here is what ranks their jobs. `allocations` is allocations_by_team().
    """
    now_s = time.time() if now_s is None else now_s
    half_life_s = float(settings.TESSERA_FAIRSHARE_HALF_LIFE_S)
    quotas = engine_quotas()
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


def team_summary(
    *,
    team: Team,
    allocation: TeamAllocation,
    fair_share_gpus: float | None,
    queue_share: dict[str, float] | None = None,
) -> dict:
    quotas = [
        {
            "gpu_model": q.gpu_model.name if q.gpu_model_id else None,
            "guaranteed_gpus": float(q.guaranteed_gpus),
            "limit_gpus": float(q.limit_gpus) if q.limit_gpus is not None else None,
            "guaranteed_gpu_memory_mib": q.guaranteed_gpu_memory_mib,
            "limit_gpu_memory_mib": q.limit_gpu_memory_mib,
            "fair_share_weight": float(q.fair_share_weight),
            "default_priority_class": q.default_priority_class.name if q.default_priority_class_id else None,
        }
        for q in team.quotas.all()
    ]
    return {
        "quotas": quotas,
        "usage": {
            "gpus": round(allocation.gpus, 3),
            "gpu_memory_mib": allocation.gpu_memory_mib,
            "running_jobs": allocation.running_jobs,
            "pending_jobs": allocation.pending_jobs,
        },
        "borrowed": {
            "gpus": round(allocation.borrowed_gpus, 3),
            "gpu_memory_mib": allocation.borrowed_gpu_memory_mib,
        },
        "fair_share": {
            "gpus": round(fair_share_gpus, 3) if fair_share_gpus is not None else None,
            **(queue_share or {"held_share": 0.0, "usage_share": 0.0, "queue_share": 0.0}),
        },
    }
