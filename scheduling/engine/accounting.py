"""Team usage and quota arithmetic shared by the queue-order and admission plugins and the session ledger.

Usage is aggregated lazily (once per cycle, only when a plugin asks), so profiles without quota or fair share
pay nothing per running job.
"""

from __future__ import annotations

import math

from scheduling.engine.framework import CycleContext
from scheduling.engine.resources import charge_of
from scheduling.engine.types import WHOLE_GPU_MILLI, Job, Quota, Request

_USAGE_KEY = "accounting.team_usage"


def team_usage(ctx: CycleContext) -> dict[str, list[int]]:
    """team -> [gpu memory MiB, compute milli] held now, including this cycle's placements and evictions."""
    usage = ctx.cache.get(_USAGE_KEY)
    if usage is None:
        usage = {}
        for job in ctx.snapshot.running:
            mem, comp = charge_of(job.assignments)
            row = usage.setdefault(job.team, [0, 0])
            row[0] += mem
            row[1] += comp
        ctx.cache[_USAGE_KEY] = usage
    return usage


def usage_add(ctx: CycleContext, team: str, memory_mib: int, compute_milli: int) -> None:
    """Keep the live usage in step with a placement (+) or eviction (-), if anyone has asked for it yet."""
    usage = ctx.cache.get(_USAGE_KEY)
    if usage is None:
        return
    row = usage.setdefault(team, [0, 0])
    row[0] += memory_mib
    row[1] += compute_milli


def min_charge(req: Request) -> tuple[int, int]:
    """A lower bound of what the request will count against quota, before we know which cards it gets."""
    if req.gpus:
        cards = req.gpus * req.nodes
        return cards * req.min_gpu_memory_mib, cards * WHOLE_GPU_MILLI
    if req.is_slice:
        return req.gpu_memory_mib, req.gpu_compute_milli
    return 0, 0


def exceeds_limit(
    quota: Quota | None, used: list[int] | tuple[int, int], charge: tuple[int, int]
) -> str | None:
    """Which limit the charge would break ('memory' / 'compute'), or None."""
    if quota is None:
        return None
    if quota.limit_gpu_memory_mib is not None and used[0] + charge[0] > quota.limit_gpu_memory_mib:
        return "memory"
    if quota.limit_compute_milli is not None and used[1] + charge[1] > quota.limit_compute_milli:
        return "compute"
    return None


def within_guarantee(quota: Quota | None, used: list[int] | tuple[int, int], charge: tuple[int, int]) -> bool:
    """True when the team stays within its guarantee on both resources after taking `charge`."""
    if quota is None:
        return charge == (0, 0)
    return (
        used[0] + charge[0] <= quota.guaranteed_gpu_memory_mib
        and used[1] + charge[1] <= quota.guaranteed_compute_milli
    )


def dominant_share(quota: Quota | None, used: list[int] | tuple[int, int]) -> float:
    """The larger of the team's memory and compute use relative to its guarantee (a team with no guarantee
    counts everything it uses against a guarantee of one MiB / one milli, i.e. it goes last)."""
    g_mem = max(1, quota.guaranteed_gpu_memory_mib) if quota else 1
    g_comp = max(1, quota.guaranteed_compute_milli) if quota else 1
    return max(used[0] / g_mem, used[1] / g_comp)


def history_share(quota: Quota | None, usage_milli_s: float, half_life_s: float) -> float:
    """Decayed past usage relative to what running exactly at the guarantee would have accumulated:
    a rate r decayed with half-life h sums to r * h / ln 2, so 1.0 means "used its guarantee on average"."""
    if usage_milli_s <= 0:
        return 0.0
    g_comp = max(1, quota.guaranteed_compute_milli) if quota else 1
    return usage_milli_s / (g_comp * half_life_s / math.log(2))


def job_charge_estimate(job: Job) -> tuple[int, int]:
    return min_charge(job.request)
