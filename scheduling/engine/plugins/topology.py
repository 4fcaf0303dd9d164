"""Score: take the tightest NVLink island that fits and keep large islands whole for large jobs.

Node level, whole-card jobs: an NVLink job scores n / size of the island it lands in (1.0 = exact fit); other
jobs score the share of the node's largest free island that survives them (1.0 = untouched). Slices score 1.0
where a card already shared can take them (no idle card is broken) and 0.5 otherwise.
GPU level (slices): a shared card scores 1.0; an idle card scores lower the larger its free island is.
Cards (whole-GPU jobs, `CardChooser`): in a profile listing it among its GPU scores, a whole-GPU job takes the
tightest NVLink island that holds it, so large islands stay whole for large jobs.
"""

from __future__ import annotations

from scheduling.engine.framework import CycleContext
from scheduling.engine.resources import (
    DEFAULT_TIMESLICE_FACTOR,
    choose_whole,
    components,
    free_whole_positions,
    gpu_is_free,
    nvlink_neighbours,
    slice_fits_gpu,
)
from scheduling.engine.types import Gpu, Job, Node, TopologyNeed

NAME = "topology"


class Topology:
    NAME = NAME
    CACHEABLE = True

    def score_node(self, ctx: CycleContext, job: Job, node: Node) -> float:
        req = job.request
        if req.gpus:
            chosen = choose_whole(req, node, topology_aware=True)
            if chosen is None:
                return 0.0
            nbrs = nvlink_neighbours(node)
            islands = components(free_whole_positions(req, node), nbrs)
            if req.topology is TopologyNeed.NVLINK:
                home = next(c for c in islands if chosen[0] in c)
                return req.gpus / len(home)
            before = max((len(c) for c in islands), default=0)
            if before <= 1:
                return 1.0
            taken = set(chosen)
            after = max((len([p for p in c if p not in taken]) for c in islands), default=0)
            return after / before
        if req.is_slice:
            factor = ctx.param("timeslice_oversubscription", DEFAULT_TIMESLICE_FACTOR)
            for g in node.gpus:
                if not gpu_is_free(g) and slice_fits_gpu(req, g, factor) is not None:
                    return 1.0
            return 0.5
        return 1.0

    def choose_cards(self, ctx: CycleContext, job: Job, node: Node) -> tuple[int, ...] | None:
        return choose_whole(job.request, node, topology_aware=True)

    def score_gpu(self, ctx: CycleContext, job: Job, node: Node, gpu: Gpu) -> float:
        if not gpu_is_free(gpu):
            return 1.0
        nbrs = nvlink_neighbours(node)
        free = [i for i, g in enumerate(node.gpus) if gpu_is_free(g)]
        mine = next((c for c in components(free, nbrs) if node.gpus.index(gpu) in c), [])
        return 1.0 - len(mine) / max(1, len(node.gpus))
