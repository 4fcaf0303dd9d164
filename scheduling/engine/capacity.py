"""What a request could ever get: the most whole GPUs one node gives it with every card idle.

Submit validation asks this (on the inventory as the engine sees it) whether a job can ever run, so "can never
run" means what the allocator means: NVLink groups are exact cliques (`resources.largest_clique`), NUMA groups
are a NUMA node's cards.
"""

from __future__ import annotations

from scheduling.engine.resources import gpu_matches, largest_clique, nvlink_neighbours
from scheduling.engine.types import Node, Request, TopologyNeed


def most_whole_gpus(req: Request, node: Node) -> int:
    """The most cards of the request's kind (healthy, allowed model, memory, architecture) that the node could
    give one job at once under the request's topology need, were every card idle."""
    cards = [i for i, g in enumerate(node.gpus) if gpu_matches(req, g)]
    if not cards:
        return 0
    if req.topology is TopologyNeed.NUMA:
        per_numa: dict[int, int] = {}
        for i in cards:
            numa = node.gpus[i].numa_node
            per_numa[numa] = per_numa.get(numa, 0) + 1
        return max(per_numa.values())
    if req.topology is TopologyNeed.NVLINK:
        return largest_clique(cards, nvlink_neighbours(node))
    return len(cards)
