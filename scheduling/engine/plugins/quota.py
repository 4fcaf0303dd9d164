"""Admission: a team runs freely within its guarantee, borrows idle capacity up to its limit, never beyond.

Quota counts fractions exactly: a slice counts its memory and its compute share, a whole card its full memory
and 1000 milli. `admit` refuses early with the job's estimated charge (`accounting.job_charge`: a whole card
counts the memory of the smallest card it may get); `admit_charge` checks the exact charge of a placement.
A team's per-priority-class limits (`Quota.class_limits`) count the compute its jobs of that class hold.
"""

from __future__ import annotations

from scheduling.engine.accounting import class_usage, exceeds_limit, job_charge, team_usage, within_guarantee
from scheduling.engine.framework import CycleContext
from scheduling.engine.reasons import NEVER_FITS_QUOTA, QUOTA_LIMIT, gib
from scheduling.engine.types import Job, Quota, Status

NAME = "quota"


def _gpus(milli: int) -> str:
    value = milli / 1000
    return f"{value:g} GPU" if value == 1 else f"{value:g} GPUs"


def never_fits(quota: Quota | None, job: Job, charge: tuple[int, int]) -> Status | None:
    """Why the job can never start under its team's limits, whatever else runs (None: it can, some day)."""
    if quota is None:
        return None
    team = job.team
    if quota.limit_compute_milli is not None and charge[1] > quota.limit_compute_milli:
        return Status(
            NEVER_FITS_QUOTA,
            f"this job needs {_gpus(charge[1])} but team {team} may hold at most "
            f"{_gpus(quota.limit_compute_milli)} (its limit): it can never start; ask for less or for a "
            f"higher limit",
        )
    if quota.limit_gpu_memory_mib is not None and charge[0] > quota.limit_gpu_memory_mib:
        return Status(
            NEVER_FITS_QUOTA,
            f"this job needs {gib(charge[0])} of GPU memory but team {team} may hold at most "
            f"{gib(quota.limit_gpu_memory_mib)} (its limit): it can never start; ask for less or for a "
            f"higher limit",
        )
    limit = quota.class_limit(job.priority_class) if job.priority_class else None
    if limit is not None and charge[1] > limit:
        return Status(
            NEVER_FITS_QUOTA,
            f"this job needs {_gpus(charge[1])} but team {team} may hold at most {_gpus(limit)} at priority "
            f"class {job.priority_class}: it can never start at this class",
        )
    return None


class QuotaAdmit:
    NAME = NAME

    def admit(self, ctx: CycleContext, job: Job) -> Status | None:
        charge = job_charge(ctx, job)
        return never_fits(ctx.snapshot.quotas.get(job.team), job, charge) or self.admit_charge(
            ctx, job, charge
        )

    def admit_charge(self, ctx: CycleContext, job: Job, charge: tuple[int, int]) -> Status | None:
        quota = ctx.snapshot.quotas.get(job.team)
        if quota is None:
            return None
        used = team_usage(ctx).get(job.team, (0, 0))
        broken = exceeds_limit(quota, used, charge)
        if broken == "memory":
            return Status(
                QUOTA_LIMIT,
                f"team {job.team} would exceed its GPU memory limit: it holds {gib(used[0])} of "
                f"{gib(quota.limit_gpu_memory_mib)} and this job needs {gib(charge[0])} more",
            )
        if broken == "compute":
            return Status(
                QUOTA_LIMIT,
                f"team {job.team} would exceed its GPU compute limit: it holds {used[1] / 1000:g} of "
                f"{quota.limit_compute_milli / 1000:g} GPUs and this job needs {charge[1] / 1000:g} more",
            )
        limit = quota.class_limit(job.priority_class) if job.priority_class else None
        if limit is not None:
            held = class_usage(ctx).get((job.team, job.priority_class), 0)
            if held + charge[1] > limit:
                return Status(
                    QUOTA_LIMIT,
                    f"team {job.team} would exceed its limit at priority class {job.priority_class}: it "
                    f"holds {held / 1000:g} of {limit / 1000:g} GPUs at that class and this job needs "
                    f"{charge[1] / 1000:g} more",
                )
        return None

    def borrowed(self, ctx: CycleContext, job: Job, charge: tuple[int, int]) -> bool:
        quota = ctx.snapshot.quotas.get(job.team)
        return not within_guarantee(quota, team_usage(ctx).get(job.team, (0, 0)), charge)
