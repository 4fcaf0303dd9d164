"""Queue order: higher priority first, with an age boost so that nothing waits forever."""

from __future__ import annotations

from scheduling.engine.framework import CycleContext
from scheduling.engine.types import Job

NAME = "priority"
_KEY = "priority.age_boost"


def queue_priority(ctx: CycleContext, job: Job) -> float:
    """The job's priority plus one level per `age_boost_interval_s` waited, at most `age_boost_max` levels.
    The boost orders the queue only; preemption compares real priorities."""
    known = ctx.cache.get(_KEY)
    if known is None:
        known = ctx.cache[_KEY] = (
            {},
            ctx.param("age_boost_interval_s", 3600.0),
            ctx.param("age_boost_max", 10),
        )
    values, interval, cap = known
    value = values.get(job.id)
    if value is None:
        if not interval or not cap:
            value = job.priority
        else:
            waited = max(0.0, ctx.snapshot.now - job.submit_time)
            value = job.priority + min(cap, int(waited // interval))
        values[job.id] = value
    return value


class Priority:
    NAME = NAME

    def sort_key(self, ctx: CycleContext, job: Job) -> tuple:
        return (-queue_priority(ctx, job),)
