"""Queue order: work within its team's guarantee goes before work that would borrow.

Pending jobs are walked in priority order (then submit time); a job whose team, with the running work and the
team's earlier queued jobs that fit its guarantee, would still be within the guarantee is ranked 0, every other
GPU job 1 (a job that does not fit is skipped, so a smaller one after it may still fit). Priority and fair share
order each rank. A team's guarantee is thus served before idle capacity is lent, and reclaim can take back what
was lent (actions/reclaim.py), so within-guarantee work neither waits behind borrowers nor is evicted for them.
"""

from __future__ import annotations

from scheduling.engine.accounting import job_charge, pending_by_priority, team_usage, within_guarantee
from scheduling.engine.framework import CycleContext
from scheduling.engine.plugins.priority import queue_priority
from scheduling.engine.types import Job

NAME = "guarantee"
_KEY = "guarantee.within"


def within_guarantee_ids(ctx: CycleContext) -> frozenset[str]:
    """The pending jobs that would run within their team's guarantee, taken in queue-priority order."""
    known = ctx.cache.get(_KEY)
    if known is not None:
        return known
    snap = ctx.snapshot
    usage = team_usage(ctx)
    held: dict[str, list[int]] = {}
    within = set()
    for job in pending_by_priority(ctx, queue_priority):
        charge = job_charge(ctx, job)
        if charge == (0, 0):
            within.add(job.id)
            continue
        quota = snap.quotas.get(job.team)
        if quota is None:
            continue
        row = held.get(job.team)
        if row is None:
            row = held[job.team] = list(usage.get(job.team, (0, 0)))
        if within_guarantee(quota, row, charge):
            within.add(job.id)
            row[0] += charge[0]
            row[1] += charge[1]
    known = ctx.cache[_KEY] = frozenset(within)
    return known


class Guarantee:
    NAME = NAME

    def sort_key(self, ctx: CycleContext, job: Job) -> tuple:
        return (0 if job.id in within_guarantee_ids(ctx) else 1,)
