"""Random baseline: any feasible node, any fitting GPU, drawn from the cycle's seeded generator."""

from __future__ import annotations

from scheduling.engine.framework import CycleContext
from scheduling.engine.types import Gpu, Job, Node

NAME = "random"


class RandomScore:
    NAME = NAME
    # Scores depend on the draw, not on the node's state: an engine must not reuse them across nodes of one shape.
    CACHEABLE = False

    def score_node(self, ctx: CycleContext, job: Job, node: Node) -> float:
        return ctx.rng.random()

    def score_gpu(self, ctx: CycleContext, job: Job, node: Node, gpu: Gpu) -> float:
        return ctx.rng.random()
