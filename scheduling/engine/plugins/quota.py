"""Admission: a team runs freely within its guarantee, borrows idle capacity up to its limit, never beyond.

Quota counts fractions exactly: a slice counts its memory and its compute share, a whole card its full memory
and 1000 milli. `admit` rejects early with a lower bound; `admit_charge` checks the exact charge of a placement.
"""

from __future__ import annotations

from scheduling.engine.accounting import exceeds_limit, min_charge, team_usage, within_guarantee
from scheduling.engine.framework import CycleContext
from scheduling.engine.reasons import QUOTA_LIMIT, gib
from scheduling.engine.types import Job, Status

NAME = "quota"


class QuotaAdmit:
    NAME = NAME

    def admit(self, ctx: CycleContext, job: Job) -> Status | None:
        return self.admit_charge(ctx, job, min_charge(job.request))

    def admit_charge(self, ctx: CycleContext, job: Job, charge: tuple[int, int]) -> Status | None:
        quota = ctx.snapshot.quotas.get(job.team)
        used = team_usage(ctx).get(job.team, (0, 0))
        broken = exceeds_limit(quota, used, charge)
        if broken is None:
            return None
        if broken == "memory":
            return Status(
                QUOTA_LIMIT,
                f"team {job.team} would exceed its GPU memory limit: it holds {gib(used[0])} of "
                f"{gib(quota.limit_gpu_memory_mib)} and this job needs {gib(charge[0])} more",
            )
        return Status(
            QUOTA_LIMIT,
            f"team {job.team} would exceed its GPU compute limit: it holds {used[1] / 1000:g} of "
            f"{quota.limit_compute_milli / 1000:g} GPUs and this job needs {charge[1] / 1000:g} more",
        )

    def borrowed(self, ctx: CycleContext, job: Job, charge: tuple[int, int]) -> bool:
        quota = ctx.snapshot.quotas.get(job.team)
        return not within_guarantee(quota, team_usage(ctx).get(job.team, (0, 0)), charge)
