"""Queue order: earlier submissions first."""

from __future__ import annotations

from scheduling.engine.framework import CycleContext
from scheduling.engine.types import Job

NAME = "fifo"


class Fifo:
    NAME = NAME

    def sort_key(self, ctx: CycleContext, job: Job) -> tuple:
        return (job.submit_time,)
