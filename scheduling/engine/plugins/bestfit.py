"""BestFit baseline as the FGD paper's simulator codes it: least CPU and GPU left on the node after placing."""

from __future__ import annotations

from scheduling.engine.fragmentation import MAX_NODE_CPU_MILLI, MAX_NODE_GPU_MILLI, TaskClass, gpu_free_milli
from scheduling.engine.framework import CycleContext
from scheduling.engine.types import Gpu, Job, Node

NAME = "bestfit"


def tightest_gpu_score(job: Job, gpu: Gpu) -> float:
    """A slice goes to the GPU with the least free share that fits; ties (and whole GPUs) to the lowest index."""
    free = gpu_free_milli(gpu) if job.request.is_slice else 0
    return -float(free) - gpu.index / 1000.0


class BestFitScore:
    NAME = NAME

    def score_node(self, ctx: CycleContext, job: Job, node: Node) -> float:
        task_class = TaskClass.of_request(job.request)
        gpu_free = sum(gpu_free_milli(gpu) for gpu in node.gpus)
        # Same operation order as the reference (Go float64), so the integer truncation matches it exactly.
        left = 0.0
        left += (node.free_cpu_milli - task_class.cpu_milli) / MAX_NODE_CPU_MILLI * 0.5
        left += (gpu_free - task_class.num_gpu * task_class.gpu_milli) / MAX_NODE_GPU_MILLI * 0.5
        return float(int((1.0 - left) * 100))

    def score_gpu(self, ctx: CycleContext, job: Job, node: Node, gpu: Gpu) -> float:
        return tightest_gpu_score(job, gpu)
