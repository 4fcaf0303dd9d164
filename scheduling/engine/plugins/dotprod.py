"""DotProd (Tetris) baseline as the FGD paper's simulator codes it: least aligned free (CPU, GPU) and request."""

from __future__ import annotations

from scheduling.engine.fragmentation import MAX_NODE_CPU_MILLI, MAX_NODE_GPU_MILLI, TaskClass, gpu_free_milli
from scheduling.engine.framework import CycleContext
from scheduling.engine.plugins.bestfit import tightest_gpu_score
from scheduling.engine.types import Gpu, Job, Node

NAME = "dotprod"


class DotProdScore:
    NAME = NAME

    def score_node(self, ctx: CycleContext, job: Job, node: Node) -> float:
        task_class = TaskClass.of_request(job.request)
        gpu_free = sum(gpu_free_milli(gpu) for gpu in node.gpus)
        dot = 0.0
        dot += (node.free_cpu_milli / MAX_NODE_CPU_MILLI) * (task_class.cpu_milli / MAX_NODE_CPU_MILLI)
        dot += (gpu_free / MAX_NODE_GPU_MILLI) * (
            task_class.num_gpu * task_class.gpu_milli / MAX_NODE_GPU_MILLI
        )
        return float(int(100 * (1 - dot / 2)))

    def score_gpu(self, ctx: CycleContext, job: Job, node: Node, gpu: Gpu) -> float:
        return tightest_gpu_score(job, gpu)
