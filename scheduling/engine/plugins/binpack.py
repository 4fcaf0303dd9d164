"""Score: fill what is already in use, so whole nodes and whole cards stay free for big jobs."""

from __future__ import annotations

from scheduling.engine.framework import CycleContext
from scheduling.engine.types import WHOLE_GPU_MILLI, Gpu, Job, Node

NAME = "binpack"


def node_utilization(job: Job, node: Node) -> float:
    """0..1: how full the node already is in what the job uses (GPU compute and memory, else CPU)."""
    if job.request.uses_gpu and node.gpus:
        comp = mem = cap_mem = 0
        for g in node.gpus:
            comp += g.allocated_compute_milli
            mem += g.allocated_memory_mib
            cap_mem += g.memory_mib
        comp_frac = min(1.0, comp / (WHOLE_GPU_MILLI * len(node.gpus)))
        mem_frac = mem / cap_mem if cap_mem else 0.0
        return (comp_frac + mem_frac) / 2
    return node.allocated_cpu_milli / node.cpu_milli if node.cpu_milli else 0.0


def gpu_utilization(gpu: Gpu) -> float:
    comp = min(1.0, gpu.allocated_compute_milli / WHOLE_GPU_MILLI)
    mem = gpu.allocated_memory_mib / gpu.memory_mib if gpu.memory_mib else 0.0
    return (comp + mem) / 2


class Binpack:
    NAME = NAME
    CACHEABLE = True

    def score_node(self, ctx: CycleContext, job: Job, node: Node) -> float:
        return node_utilization(job, node)

    def score_gpu(self, ctx: CycleContext, job: Job, node: Node, gpu: Gpu) -> float:
        return gpu_utilization(gpu)
