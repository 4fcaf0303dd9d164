"""Queue order: among equal priorities, the team furthest below its fair share goes first.

A team's share is its weighted dominant-resource share: the largest of (GPU memory held / guaranteed memory,
compute held / guaranteed compute, decayed past compute usage / what its guarantee would have accumulated),
divided by its weight. Usage decays with the profile's `fairshare_half_life_s`. So that one cycle interleaves
teams instead of serving one team's whole backlog, each queued job is ranked as if the team's earlier queued
jobs (same priority, earlier submission) had already started.
"""

from __future__ import annotations

from scheduling.engine.accounting import dominant_share, history_share, min_charge, team_usage
from scheduling.engine.framework import CycleContext
from scheduling.engine.plugins.priority import queue_priority
from scheduling.engine.types import Job

NAME = "fairshare"
_KEY = "fairshare.virtual_share"


def _virtual_shares(ctx: CycleContext) -> dict[str, float]:
    snap = ctx.snapshot
    half_life_s = ctx.param("fairshare_half_life_s", 7 * 24 * 3600.0)
    usage = team_usage(ctx)
    ordered = sorted(snap.pending, key=lambda j: (-queue_priority(ctx, j), j.submit_time, j.id))
    held: dict[str, list[int]] = {}
    past: dict[str, float] = {}
    shares: dict[str, float] = {}
    for job in ordered:
        team = job.team
        quota = snap.quotas.get(team)
        if team not in held:
            held[team] = list(usage.get(team, (0, 0)))
            past[team] = history_share(quota, snap.usage.get(team, 0.0), half_life_s)
        weight = quota.weight if quota and quota.weight > 0 else 1.0
        shares[job.id] = max(dominant_share(quota, held[team]), past[team]) / weight
        mem, comp = min_charge(job.request)
        held[team][0] += mem
        held[team][1] += comp
    return shares


class FairShare:
    NAME = NAME

    def sort_key(self, ctx: CycleContext, job: Job) -> tuple:
        shares = ctx.cache.get(_KEY)
        if shares is None:
            shares = ctx.cache[_KEY] = _virtual_shares(ctx)
        return (shares.get(job.id, 0.0),)
