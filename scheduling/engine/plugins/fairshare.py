"""Queue order: among equal priorities, the team furthest below its fair share goes first.

Work within the team's guarantee (plugin `guarantee`) is ranked by the team's weighted dominant-resource share:
the largest of (GPU memory held / guaranteed memory, compute held / guaranteed compute, over the resources the
guarantee names, and decayed past compute usage / what its guarantee would have accumulated), divided by its
weight. Work that would borrow comes after it, ranked by the compute the team would then borrow beyond its
guarantee divided by its weight: idle capacity is lent by weighted max-min. Usage decays with the profile's `fairshare_half_life_s`. So that one cycle interleaves
teams instead of serving one team's whole backlog, each queued job is ranked as if the team's earlier queued
jobs (same priority, earlier submission) had already started.
"""

from __future__ import annotations

from scheduling.engine.accounting import (
    borrowed_per_weight,
    history_share,
    job_charge,
    pending_by_priority,
    team_usage,
)
from scheduling.engine.framework import CycleContext
from scheduling.engine.plugins.guarantee import within_guarantee_ids
from scheduling.engine.plugins.priority import queue_priority
from scheduling.engine.types import Job

NAME = "fairshare"
_KEY = "fairshare.virtual_share"


def _virtual_shares(ctx: CycleContext) -> dict[str, tuple[int, float]]:
    snap = ctx.snapshot
    half_life_s = ctx.param("fairshare_half_life_s", 7 * 24 * 3600.0)
    usage = team_usage(ctx)
    within = within_guarantee_ids(ctx)
    ordered = pending_by_priority(ctx, queue_priority)
    # Per team: [memory held, compute held, the guarantees it is measured against, its past share, its weight].
    teams: dict[str, list] = {}
    shares: dict[str, tuple[int, float]] = {}
    for job in ordered:
        row = teams.get(job.team)
        quota = snap.quotas.get(job.team)
        if row is None:
            mem, comp = usage.get(job.team, (0, 0))
            g_mem = quota.guaranteed_gpu_memory_mib if quota else 0
            g_comp = quota.guaranteed_compute_milli if quota else 0
            if g_mem <= 0 and g_comp <= 0:
                g_mem = g_comp = 1  # no guarantee: everything it holds counts, it goes last
            row = teams[job.team] = [
                mem,
                comp,
                g_mem,
                g_comp,
                history_share(quota, snap.usage.get(job.team, 0.0), half_life_s),
                quota.weight if quota and quota.weight > 0 else 1.0,
            ]
        held_mem, held_comp, g_mem, g_comp, past, weight = row
        charge = job_charge(ctx, job)
        if job.id in within:
            # dominant_share(quota, held) over the resources the guarantee names, at least the past share, over
            # the weight (spelt out: once per queued job).
            share = max(
                held_mem / g_mem if g_mem > 0 else 0.0, held_comp / g_comp if g_comp > 0 else 0.0, past
            )
            shares[job.id] = (0, share / weight)
        else:
            # Borrowing: weighted max-min of the capacity beyond the guarantees (what it would borrow, per weight).
            shares[job.id] = (1, borrowed_per_weight(quota, (held_mem + charge[0], held_comp + charge[1])))
        row[0] = held_mem + charge[0]
        row[1] = held_comp + charge[1]
    return shares


class FairShare:
    NAME = NAME

    def sort_key(self, ctx: CycleContext, job: Job) -> tuple:
        shares = ctx.cache.get(_KEY)
        if shares is None:
            shares = ctx.cache[_KEY] = _virtual_shares(ctx)
        return shares.get(job.id, (0, 0.0))
