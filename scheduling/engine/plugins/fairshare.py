"""Queue order: among equal priorities, the team furthest below its fair share goes first.

A team's share is its weighted dominant-resource share: the largest of (GPU memory held / guaranteed memory,
compute held / guaranteed compute, decayed past compute usage / what its guarantee would have accumulated),
divided by its weight. Usage decays with the profile's `fairshare_half_life_s`. So that one cycle interleaves
teams instead of serving one team's whole backlog, each queued job is ranked as if the team's earlier queued
jobs (same priority, earlier submission) had already started.
"""

from __future__ import annotations

from scheduling.engine.accounting import history_share, min_charge, team_usage
from scheduling.engine.framework import CycleContext
from scheduling.engine.plugins.priority import queue_priority
from scheduling.engine.types import Job, Request

NAME = "fairshare"
_KEY = "fairshare.virtual_share"


def _virtual_shares(ctx: CycleContext) -> dict[str, float]:
    snap = ctx.snapshot
    half_life_s = ctx.param("fairshare_half_life_s", 7 * 24 * 3600.0)
    usage = team_usage(ctx)
    ordered = sorted(snap.pending, key=lambda j: (-queue_priority(ctx, j), j.submit_time, j.id))
    # Per team: [memory held, compute held, the guarantees it is measured against, its past share, its weight].
    teams: dict[str, list] = {}
    charges: dict[Request, tuple[int, int]] = {}
    shares: dict[str, float] = {}
    for job in ordered:
        row = teams.get(job.team)
        if row is None:
            quota = snap.quotas.get(job.team)
            mem, comp = usage.get(job.team, (0, 0))
            row = teams[job.team] = [
                mem,
                comp,
                max(1, quota.guaranteed_gpu_memory_mib) if quota else 1,
                max(1, quota.guaranteed_compute_milli) if quota else 1,
                history_share(quota, snap.usage.get(job.team, 0.0), half_life_s),
                quota.weight if quota and quota.weight > 0 else 1.0,
            ]
        held_mem, held_comp, g_mem, g_comp, past, weight = row
        # dominant_share(quota, held), at least the past share, over the weight (spelt out: once per queued job).
        shares[job.id] = max(held_mem / g_mem, held_comp / g_comp, past) / weight
        charge = charges.get(job.request)
        if charge is None:
            charge = charges[job.request] = min_charge(job.request)
        row[0] = held_mem + charge[0]
        row[1] = held_comp + charge[1]
    return shares


class FairShare:
    NAME = NAME

    def sort_key(self, ctx: CycleContext, job: Job) -> tuple:
        shares = ctx.cache.get(_KEY)
        if shares is None:
            shares = ctx.cache[_KEY] = _virtual_shares(ctx)
        return (shares.get(job.id, 0.0),)
