"""Score: prefer the emptiest node and card, for availability (more fragments, fewer neighbours)."""

from __future__ import annotations

from scheduling.engine.framework import CycleContext
from scheduling.engine.plugins.binpack import gpu_utilization, node_utilization
from scheduling.engine.types import Gpu, Job, Node

NAME = "spread"


class Spread:
    NAME = NAME
    CACHEABLE = True

    def score_node(self, ctx: CycleContext, job: Job, node: Node) -> float:
        return 1.0 - node_utilization(job, node)

    def score_gpu(self, ctx: CycleContext, job: Job, node: Node, gpu: Gpu) -> float:
        return 1.0 - gpu_utilization(gpu)
