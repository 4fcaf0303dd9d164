"""Team usage and quota arithmetic shared by the queue-order and admission plugins and the session ledger.

Usage is aggregated lazily (once per cycle, only when a plugin asks), so profiles without quota or fair share
pay nothing per running job.
"""

from __future__ import annotations

import math

from scheduling.engine.framework import CycleContext
from scheduling.engine.resources import charge_of
from scheduling.engine.types import WHOLE_GPU_MILLI, Assignment, Job, ModelQuota, Quota, Request

_USAGE_KEY = "accounting.team_usage"
_MODEL_USAGE_KEY = "accounting.team_model_usage"
_CARDS_KEY = "accounting.card_models"
_MODELS_KEY = "accounting.cluster_models"


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
    quota: Quota | ModelQuota | None, used: list[int] | tuple[int, int], charge: tuple[int, int]
) -> str | None:
    """Which limit the charge would break ('memory' / 'compute'), or None."""
    if quota is None:
        return None
    if quota.limit_gpu_memory_mib is not None and used[0] + charge[0] > quota.limit_gpu_memory_mib:
        return "memory"
    if quota.limit_compute_milli is not None and used[1] + charge[1] > quota.limit_compute_milli:
        return "compute"
    return None


def within_guarantee(
    quota: Quota | ModelQuota | None, used: list[int] | tuple[int, int], charge: tuple[int, int]
) -> bool:
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


# -- per-GPU-model accounting (only for teams that have per-model quota rows) ----------------------------------


def model_limited_teams(ctx: CycleContext) -> frozenset[str]:
    """Teams with at least one per-model quota row: the only ones whose usage is counted per model."""
    return frozenset(team for team, quota in ctx.snapshot.quotas.items() if quota.per_model)


def _card_models(ctx: CycleContext) -> dict[str, dict[int, str]]:
    """node name -> GPU index -> model, from the snapshot (a card's model never changes within a cycle)."""
    cards = ctx.cache.get(_CARDS_KEY)
    if cards is None:
        cards = ctx.cache[_CARDS_KEY] = {
            n.name: {g.index: g.model for g in n.gpus} for n in ctx.snapshot.nodes
        }
    return cards


def charges_by_model(ctx: CycleContext, assignments: tuple[Assignment, ...]) -> dict[str, tuple[int, int]]:
    """(gpu memory MiB, compute milli) the assignments count per GPU model, fractions exactly as `charge_of`
    counts them. A card the snapshot does not list (its node is gone) counts under no model."""
    cards = _card_models(ctx)
    out: dict[str, tuple[int, int]] = {}
    for a in assignments:
        model = cards.get(a.node, {}).get(a.gpu_index)
        if model is None:
            continue
        mem, comp = out.get(model, (0, 0))
        out[model] = (mem + a.memory_mib, comp + a.compute_milli)
    return out


def team_model_usage(ctx: CycleContext) -> dict[tuple[str, str], list[int]]:
    """(team, model) -> [gpu memory MiB, compute milli] held now, for teams with per-model quota rows, including
    this cycle's placements and evictions once built. Built on first use; the cycle asks for it before it places
    anything (through the plugin's `restricted_teams`), so no placement is missed."""
    usage = ctx.cache.get(_MODEL_USAGE_KEY)
    if usage is None:
        usage = {}
        teams = model_limited_teams(ctx)
        if teams:
            for job in ctx.snapshot.running:
                if job.team in teams:
                    for model, (mem, comp) in charges_by_model(ctx, job.assignments).items():
                        row = usage.setdefault((job.team, model), [0, 0])
                        row[0] += mem
                        row[1] += comp
        ctx.cache[_MODEL_USAGE_KEY] = usage
    return usage


def model_usage_add(ctx: CycleContext, team: str, assignments: tuple[Assignment, ...], sign: int) -> None:
    """Keep the per-model usage in step with a placement (sign +1) or eviction (-1), if it has been built and
    the team is counted per model."""
    usage = ctx.cache.get(_MODEL_USAGE_KEY)
    if usage is None or not assignments or ctx.snapshot.quotas.get(team) is None:
        return
    if not ctx.snapshot.quotas[team].per_model:
        return
    for model, (mem, comp) in charges_by_model(ctx, assignments).items():
        row = usage.setdefault((team, model), [0, 0])
        row[0] += sign * mem
        row[1] += sign * comp


def cluster_models(ctx: CycleContext) -> dict[str, tuple[int, int]]:
    """model -> (smallest, largest) card memory MiB among the snapshot's cards of that model."""
    models = ctx.cache.get(_MODELS_KEY)
    if models is None:
        models = {}
        for n in ctx.snapshot.nodes:
            for g in n.gpus:
                known = models.get(g.model)
                models[g.model] = (
                    (g.memory_mib, g.memory_mib)
                    if known is None
                    else (min(known[0], g.memory_mib), max(known[1], g.memory_mib))
                )
        ctx.cache[_MODELS_KEY] = models
    return models


def min_charge_on_model(req: Request, card_memory_mib: tuple[int, int]) -> tuple[int, int]:
    """A lower bound of what the request counts on cards of one model whose memory lies in `card_memory_mib`
    (smallest, largest): a whole card counts its full memory and 1000 milli; a memory-only slice its memory and
    the proportional compute share (smallest on the largest card). Only MIG rounding up can make the exact
    charge larger, which the exact check at placement catches. A gang counts all its cards on the model, which
    errs on the safe side: a gang that would stay within the limit only by splitting its nodes across models is
    kept off the model."""
    smallest, largest = card_memory_mib
    if req.gpus:
        cards = req.gpus * req.nodes
        return cards * max(smallest, req.min_gpu_memory_mib), cards * WHOLE_GPU_MILLI
    if req.is_slice:
        compute = req.gpu_compute_milli
        if compute == 0 and largest > 0:
            compute = -(-req.gpu_memory_mib * WHOLE_GPU_MILLI // largest)
        return req.gpu_memory_mib, compute
    return 0, 0
