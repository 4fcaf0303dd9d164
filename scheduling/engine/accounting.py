"""Team usage and quota arithmetic shared by the queue-order and admission plugins and the session ledger.

Usage is aggregated lazily (once per cycle, only when a plugin asks), so profiles without quota or fair share
pay nothing per running job.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from scheduling.engine.framework import CycleContext
from scheduling.engine.resources import charge_of
from scheduling.engine.types import (
    WHOLE_GPU_MILLI,
    Assignment,
    Job,
    ModelQuota,
    Node,
    NodeState,
    Quota,
    Request,
)

_USAGE_KEY = "accounting.team_usage"
_MODEL_USAGE_KEY = "accounting.team_model_usage"
_CLASS_USAGE_KEY = "accounting.team_class_usage"
_PRIORITY_USAGE_KEY = "accounting.team_priority_usage"
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


def usage_add(
    ctx: CycleContext,
    team: str,
    memory_mib: int,
    compute_milli: int,
    priority_class: str = "",
    priority: int = 0,
) -> None:
    """Keep the live usage (and the team's per-class and per-priority usage) in step with a placement (+) or
    eviction (-) of a job of this class and priority, once anyone has asked for it."""
    usage = ctx.cache.get(_USAGE_KEY)
    if usage is not None:
        row = usage.setdefault(team, [0, 0])
        row[0] += memory_mib
        row[1] += compute_milli
    by_priority = ctx.cache.get(_PRIORITY_USAGE_KEY)
    if by_priority is not None:
        row = by_priority.setdefault(team, {}).setdefault(priority, [0, 0])
        row[0] += memory_mib
        row[1] += compute_milli
    by_class = ctx.cache.get(_CLASS_USAGE_KEY)
    if by_class is not None:
        key = (team, priority_class)
        by_class[key] = by_class.get(key, 0) + compute_milli


def usage_at_or_above(ctx: CycleContext, team: str, priority: int) -> tuple[int, int]:
    """(gpu memory MiB, compute milli) the team holds now in jobs of at least this priority, this cycle's
    placements and evictions included: what stands before a job of that priority in its team's guarantee (the
    team's lower-priority work gives way to it, `guarantee_order`)."""
    by_team = ctx.cache.get(_PRIORITY_USAGE_KEY)
    if by_team is None:
        by_team = {}
        for job in ctx.snapshot.running:
            mem, comp = charge_of(job.assignments)
            row = by_team.setdefault(job.team, {}).setdefault(job.priority, [0, 0])
            row[0] += mem
            row[1] += comp
        ctx.cache[_PRIORITY_USAGE_KEY] = by_team
    mem = comp = 0
    for level, row in by_team.get(team, {}).items():
        if level >= priority:
            mem += row[0]
            comp += row[1]
    return mem, comp


def class_usage(ctx: CycleContext) -> dict[tuple[str, str], int]:
    """(team, priority class) -> compute milli held now, for teams with per-class limits, kept live by
    `usage_add`."""
    usage = ctx.cache.get(_CLASS_USAGE_KEY)
    if usage is None:
        usage = {}
        limited = {team for team, q in ctx.snapshot.quotas.items() if q.class_limits}
        for job in ctx.snapshot.running:
            if job.team in limited:
                key = (job.team, job.priority_class)
                usage[key] = usage.get(key, 0) + charge_of(job.assignments)[1]
        ctx.cache[_CLASS_USAGE_KEY] = usage
    return usage


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


def has_guarantee(quota: Quota | ModelQuota | None) -> bool:
    """Whether the quota guarantees anything (memory, compute, or both)."""
    return quota is not None and (quota.guaranteed_gpu_memory_mib > 0 or quota.guaranteed_compute_milli > 0)


def within_guarantee(
    quota: Quota | ModelQuota | None, used: list[int] | tuple[int, int], charge: tuple[int, int]
) -> bool:
    """True when the team stays within its guarantee after taking `charge`, on each resource the guarantee names.

    A guarantee may name GPU memory, compute, or both: one stated in GPUs only (compute) holds that many cards of
    any model, whatever their memory; one stated in memory only holds that much memory on any cards. A team with
    no guarantee is within it only for work that holds no GPU."""
    if not has_guarantee(quota):
        return charge[0] <= 0 and charge[1] <= 0
    g_mem, g_comp = quota.guaranteed_gpu_memory_mib, quota.guaranteed_compute_milli
    if g_mem > 0 and used[0] + charge[0] > g_mem:
        return False
    return not (g_comp > 0 and used[1] + charge[1] > g_comp)


def beyond_guarantee(quota: Quota | ModelQuota | None, used: list[int] | tuple[int, int]) -> tuple[int, int]:
    """What the team holds beyond its guarantee (memory MiB, compute milli): its borrowed part. On a resource the
    guarantee does not name, all of it counts when the team is beyond on the one it names (and none otherwise)."""
    if not has_guarantee(quota):
        return max(0, used[0]), max(0, used[1])
    g_mem, g_comp = quota.guaranteed_gpu_memory_mib, quota.guaranteed_compute_milli
    over_mem = max(0, used[0] - g_mem) if g_mem > 0 else 0
    over_comp = max(0, used[1] - g_comp) if g_comp > 0 else 0
    if g_mem <= 0 and over_comp:
        # Compute-only guarantee: the borrowed memory is the same share of the team's memory.
        over_mem = used[0] * over_comp // max(1, used[1])
    if g_comp <= 0 and over_mem:
        over_comp = used[1] * over_mem // max(1, used[0])
    return over_mem, over_comp


def is_borrowing(quota: Quota | ModelQuota | None, used: list[int] | tuple[int, int]) -> bool:
    """Whether the team holds anything beyond its guarantee (a team with no guarantee: any GPU at all)."""
    over = beyond_guarantee(quota, used)
    return over[0] > 0 or over[1] > 0


def borrowed_per_weight(quota: Quota | None, used: list[int] | tuple[int, int]) -> float:
    """The team's borrowed compute (milli-GPU) over its fair-share weight: what weighted max-min sharing of the
    capacity beyond the guarantees evens out."""
    weight = quota.weight if quota is not None and quota.weight > 0 else 1.0
    return beyond_guarantee(quota, used)[1] / weight


def dominant_share(quota: Quota | None, used: list[int] | tuple[int, int]) -> float:
    """The larger of the team's memory and compute use relative to its guarantee, over the resources the guarantee
    names (a team with no guarantee counts everything it uses against a guarantee of one MiB / one milli, i.e. it
    goes last)."""
    if not has_guarantee(quota):
        return max(used[0], used[1]) * 1.0
    g_mem, g_comp = quota.guaranteed_gpu_memory_mib, quota.guaranteed_compute_milli
    return max(used[0] / g_mem if g_mem > 0 else 0.0, used[1] / g_comp if g_comp > 0 else 0.0)


def guarantee_order(job: Job) -> tuple:
    """The order in which a team's running jobs fill its guarantee: never-preempted work first, then higher
    priority, then the jobs already within it (the label is kept while it can be: a job placed within its
    team's guarantee does not become borrowed because a later job of the same class and priority sorts before
    it), then the longest running. What is left over is the team's borrowed work, reclaimed first."""
    started = job.start_time if job.start_time is not None else math.inf
    return (job.preemptible, -job.priority, job.borrowed, started, job.id)


def borrowed_ids(
    quotas: Mapping[str, Quota], jobs: Iterable[Job], charges: Mapping[str, tuple[int, int]]
) -> set[str]:
    """The jobs on borrowed capacity: per team, jobs in `guarantee_order` fill the guarantee, each one that still
    fits within it is within; a job that would take the team beyond it is borrowed (a smaller job after it may
    still fit). `charges` is each job's (memory MiB, compute milli); jobs holding no GPU are never borrowed."""
    by_team: dict[str, list[Job]] = {}
    for job in jobs:
        by_team.setdefault(job.team, []).append(job)
    out: set[str] = set()
    for team, members in by_team.items():
        quota = quotas.get(team)
        used = [0, 0]
        for job in sorted(members, key=guarantee_order):
            charge = charges.get(job.id, (0, 0))
            if charge[0] <= 0 and charge[1] <= 0:
                continue
            if within_guarantee(quota, used, charge):
                used[0] += charge[0]
                used[1] += charge[1]
            else:
                out.add(job.id)
    return out


def history_share(quota: Quota | None, usage_milli_s: float, half_life_s: float) -> float:
    """Decayed past usage relative to what running exactly at the guarantee would have accumulated:
    a rate r decayed with half-life h sums to r * h / ln 2, so 1.0 means "used its guarantee on average"."""
    if usage_milli_s <= 0:
        return 0.0
    g_comp = max(1, quota.guaranteed_compute_milli) if quota else 1
    return usage_milli_s / (g_comp * half_life_s / math.log(2))


def effective_quotas(quotas: Mapping[str, Quota], nodes: Iterable[Node]) -> Mapping[str, Quota]:
    """The quotas as the engine applies them: a guarantee stated in GPU memory only also guarantees the same
    share of the cluster's compute (a team guaranteed a fifth of the GPU memory is guaranteed a fifth of the
    cards' compute too), so memory-light slices cannot hold cards' compute beyond the team's share unseen.
    A guarantee stated in GPUs holds that many cards whatever their memory, and is left as it is. The
    cluster is the snapshot's nodes that are not lost."""
    if not any(_memory_only(q) for q in quotas.values()):
        return quotas
    known = _EFFECTIVE.get(id(quotas))
    if known is not None and known[0] is quotas and known[1] is nodes:
        return known[2]
    mem = comp = 0
    for n in nodes:
        if n.state is not NodeState.LOST:
            for g in n.gpus:
                mem += g.memory_mib
                comp += WHOLE_GPU_MILLI
    out = quotas_on_capacity(quotas, mem, comp)
    if len(_EFFECTIVE) > 8:
        _EFFECTIVE.clear()
    _EFFECTIVE[id(quotas)] = (quotas, nodes, out)
    return out


# The last answers of `effective_quotas`, by the identity of the quotas (and nodes) asked about: a what-if asks
# again and again about one snapshot.
_EFFECTIVE: dict[int, tuple] = {}


def _memory_only(quota: Quota) -> bool:
    return quota.guaranteed_gpu_memory_mib > 0 and quota.guaranteed_compute_milli <= 0


def quotas_on_capacity(
    quotas: Mapping[str, Quota], memory_mib: int, compute_milli: int
) -> Mapping[str, Quota]:
    """`effective_quotas` for a cluster of this much GPU memory and compute."""
    if memory_mib <= 0 or not any(_memory_only(q) for q in quotas.values()):
        return quotas
    out = dict(quotas)
    for team, q in quotas.items():
        if _memory_only(q):
            out[team] = replace(
                q, guaranteed_compute_milli=q.guaranteed_gpu_memory_mib * compute_milli // memory_mib
            )
    return MappingProxyType(out)


def estimated_charge(req: Request, models: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
    """What the request will count against quota wherever it lands, as far as can be known before it is placed:
    a whole card counts the memory of the smallest card it may get (of the models it may use, at least its
    `min_gpu_memory_mib`), a slice its memory and compute (a memory-only slice the proportional share of the
    largest card it may get). `models` is model -> (smallest, largest) card memory MiB (`cluster_models`).
    Never more than any placement's exact charge, except that a MIG instance may round a slice up."""
    if not req.uses_gpu:
        return 0, 0
    eligible = [
        mem
        for model, mem in models.items()
        if (not req.gpu_models or model in req.gpu_models) and mem[1] >= req.min_gpu_memory_mib
    ]
    if req.gpus:
        cards = req.gpus * req.nodes
        smallest = min(
            (max(lo, req.min_gpu_memory_mib) for lo, _ in eligible), default=req.min_gpu_memory_mib
        )
        return cards * smallest, cards * WHOLE_GPU_MILLI
    compute = req.gpu_compute_milli
    if compute == 0:
        largest = max((hi for _, hi in eligible), default=0)
        if largest > 0:
            compute = -(-req.gpu_memory_mib * WHOLE_GPU_MILLI // largest)
    return req.gpu_memory_mib, compute


def job_charge(ctx: CycleContext, job: Job) -> tuple[int, int]:
    """`estimated_charge` of a job's request on this snapshot's cards (cached per request for the cycle)."""
    cache = ctx.cache.setdefault("accounting.estimated_charge", {})
    charge = cache.get(job.request)
    if charge is None:
        charge = cache[job.request] = estimated_charge(job.request, cluster_models(ctx))
    return charge


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


# Where the session keeps what follows from the snapshot's nodes, running jobs and time alone (`Session.running_memo`),
# across cycles on the same snapshot: what-ifs asked on one snapshot share it.
RUNNING_MEMO_KEY = "session.running_memo"


def running_charges(ctx: CycleContext) -> dict[str, tuple[int, int]]:
    """job id -> (gpu memory MiB, compute milli) each running job of the snapshot holds (built once a snapshot)."""
    charges = ctx.cache.get("accounting.running_charges")
    if charges is None:
        kept = ctx.cache.get(RUNNING_MEMO_KEY, {})
        charges = kept.get("charges")
        if charges is None:
            charges = {job.id: charge_of(job.assignments) for job in ctx.snapshot.running}
            kept["charges"] = charges
        ctx.cache["accounting.running_charges"] = charges
    return charges


def standing(
    ctx: CycleContext, jobs: Iterable[Job], assignments: Mapping[str, tuple[Assignment, ...]]
) -> set[str]:
    """Which of these jobs run on borrowed capacity, holding these assignments: per team, jobs in guarantee order
    fill the all-models guarantee (`borrowed_ids`); for a team with per-GPU-model rows, they also fill each
    model's guarantee with what they hold on that model, and a job beyond one of those is borrowed too."""
    jobs = list(jobs)
    charges = {job.id: charge_of(assignments.get(job.id, ())) for job in jobs}
    borrowed = borrowed_ids(ctx.snapshot.quotas, jobs, charges)
    limited = model_limited_teams(ctx)
    if not limited:
        return borrowed
    per_model: dict[tuple[str, str], dict[str, tuple[int, int]]] = {}
    for job in jobs:
        if job.team in limited:
            for model, charge in charges_by_model(ctx, assignments.get(job.id, ())).items():
                per_model.setdefault((job.team, model), {})[job.id] = charge
    by_id = {job.id: job for job in jobs}
    for (team, model), model_charges in per_model.items():
        row = ctx.snapshot.quotas[team].for_model(model)
        if row is not None:
            holders = [by_id[job_id] for job_id in model_charges]
            borrowed |= borrowed_ids({team: row}, holders, model_charges)
    return borrowed


def running_borrowed(ctx: CycleContext) -> set[str]:
    """The snapshot's running jobs on borrowed capacity, as the teams stand at the start of the cycle
    (`standing`). Do not change the set returned."""
    known = ctx.cache.get("accounting.running_borrowed")
    if known is None:
        snap = ctx.snapshot
        kept = ctx.cache.get(RUNNING_MEMO_KEY, {})
        memo = kept.get("borrowed")
        if memo is not None and memo[0] is snap.quotas:
            known = memo[1]
        else:
            known = standing(ctx, snap.running, {job.id: job.assignments for job in snap.running})
            kept["borrowed"] = (snap.quotas, known)
        ctx.cache["accounting.running_borrowed"] = known
    return known


def pending_by_priority(ctx: CycleContext, priority: Callable[[CycleContext, Job], float]) -> list[Job]:
    """The pending jobs by queue priority (highest first), then submit time and id: the order in which plugins
    count a team's queued jobs as if they had started. Sorted once a cycle; do not change the list."""
    ordered = ctx.cache.get("accounting.pending_by_priority")
    if ordered is None:
        ordered = ctx.cache["accounting.pending_by_priority"] = sorted(
            ctx.snapshot.pending, key=lambda j: (-priority(ctx, j), j.submit_time, j.id)
        )
    return ordered


def keeps_guarantee(
    quota: Quota | None, used: list[int] | tuple[int, int], removed: list[int] | tuple[int, int]
) -> bool:
    """Whether the team still holds its guarantee once `removed` is taken from what it holds: it still holds at
    least the guarantee on some resource the guarantee names, so no more work of its own would fit within its
    guarantee than before (a team with no guarantee always does). A team over its compute guarantee with
    memory-light slices keeps it while its compute does, even below its memory guarantee. Eviction for another
    team's work is allowed only then: what a team holds up to its guarantee is never taken for another team."""
    if not has_guarantee(quota):
        return True
    g_mem, g_comp = quota.guaranteed_gpu_memory_mib, quota.guaranteed_compute_milli
    if g_mem > 0 and used[0] - removed[0] >= g_mem:
        return True
    return g_comp > 0 and used[1] - removed[1] >= g_comp


def others_keep_guarantees(ctx: CycleContext, team: str, victims: Iterable[Job]) -> bool:
    """Whether every team other than `team` keeps its guarantee when all these victims are evicted together."""
    taken: dict[str, list[int]] = {}
    charges = running_charges(ctx)
    for v in victims:
        if v.team == team:
            continue
        row = taken.setdefault(v.team, [0, 0])
        mem, comp = charges.get(v.id, (0, 0))
        row[0] += mem
        row[1] += comp
    quotas, usage = ctx.snapshot.quotas, team_usage(ctx)
    return all(keeps_guarantee(quotas.get(t), usage.get(t, (0, 0)), row) for t, row in taken.items())
