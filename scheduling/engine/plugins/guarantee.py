"""Queue order: work within its team's guarantee goes before work that would borrow.

Pending jobs are walked in priority order (then submit time); a job whose team, with its running work of at
least the job's priority and the team's earlier queued jobs that fit its guarantee, would still be within the
guarantee is ranked 0, every other GPU job 1 (a job that does not fit is skipped, so a smaller one after it may
still fit). The team's lower-priority running work does not count: it gives way to the job within the team
(`accounting.guarantee_order`), so a team's high-priority training is owed its guarantee even while the team's
own batch work holds it. Priority and fair share order each rank. A team's guarantee is thus served before idle capacity is lent, and reclaim can take back what
was lent (actions/reclaim.py), so within-guarantee work neither waits behind borrowers nor is evicted for them.
"""

from __future__ import annotations

from scheduling.engine.accounting import job_charge, pending_by_priority, usage_at_or_above, within_guarantee
from scheduling.engine.framework import CycleContext
from scheduling.engine.plugins.priority import queue_priority
from scheduling.engine.types import Job

NAME = "guarantee"
_KEY = "guarantee.within"


def within_guarantee_ids(ctx: CycleContext) -> frozenset[str]:
    """The pending jobs that would run within their team's guarantee, taken in queue-priority order: what stands
    before each is its team's running work of at least its priority and the team's queued jobs counted before it."""
    known = ctx.cache.get(_KEY)
    if known is not None:
        return known
    snap = ctx.snapshot
    queued: dict[str, list[int]] = {}  # per team: the charge of its queued jobs counted so far
    within = set()
    for job in pending_by_priority(ctx, queue_priority):
        charge = job_charge(ctx, job)
        if charge == (0, 0):
            within.add(job.id)
            continue
        quota = snap.quotas.get(job.team)
        if quota is None:
            continue
        ahead = queued.setdefault(job.team, [0, 0])
        held = usage_at_or_above(ctx, job.team, job.priority)
        if within_guarantee(quota, (held[0] + ahead[0], held[1] + ahead[1]), charge):
            within.add(job.id)
            ahead[0] += charge[0]
            ahead[1] += charge[1]
    known = ctx.cache[_KEY] = frozenset(within)
    return known


class Guarantee:
    NAME = NAME

    def sort_key(self, ctx: CycleContext, job: Job) -> tuple:
        return (0 if job.id in within_guarantee_ids(ctx) else 1,)
