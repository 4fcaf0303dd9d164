"""Tessera's packing policy: FGD's fragmentation score, with its ties settled by consolidation onto used nodes.

Rules, in order (docs/simulator.md says why each helps):
1. Node: the FGD integer score (least fragmentation of the typical workload).
2. Among nodes FGD cannot tell apart, a node already running GPU work beats an idle one, so idle nodes stay whole
   for the pods that need a whole node; then the first node in the snapshot's order (first-fit consolidation).
3. GPU, for a slice: the best FGD score, then the tightest GPU that fits, then the lowest index.
"""

from __future__ import annotations

from scheduling.engine.fragmentation import gpu_free_milli
from scheduling.engine.framework import CycleContext
from scheduling.engine.plugins.fgd import fgd_scores
from scheduling.engine.types import WHOLE_GPU_MILLI, Gpu, Job, Node

NAME = "tessera"

# Strictly below 1, so the preference never outweighs one point of the integer FGD score.
USED_NODE_BONUS = 0.5


def node_in_use(node: Node) -> bool:
    """Some GPU of the node is (partly) allocated."""
    return any(gpu.allocated_compute_milli > 0 for gpu in node.gpus)


class TesseraScore:
    NAME = NAME

    def score_node(self, ctx: CycleContext, job: Job, node: Node) -> float:
        primary = float(max(fgd_scores(ctx, job, node)))
        return primary + (USED_NODE_BONUS if node_in_use(node) else 0.0)

    def score_gpu(self, ctx: CycleContext, job: Job, node: Node, gpu: Gpu) -> float:
        scores = fgd_scores(ctx, job, node)
        if not job.request.is_slice:
            return -gpu.index / 1000.0  # whole cards: the lowest free indexes
        # Integer FGD score first; the free-share term (< 0.5 for 1000 milli) and the index term only break ties.
        return scores[gpu.index] - gpu_free_milli(gpu) / (2.0 * WHOLE_GPU_MILLI + 1) - gpu.index / 100000.0
