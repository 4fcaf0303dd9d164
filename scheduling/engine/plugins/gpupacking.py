"""GpuPacking baseline as the FGD paper's simulator codes it: fill partly used GPUs, then partly used nodes."""

from __future__ import annotations

from scheduling.engine.fragmentation import TaskClass, gpu_free_milli
from scheduling.engine.framework import CycleContext
from scheduling.engine.plugins.bestfit import tightest_gpu_score
from scheduling.engine.types import WHOLE_GPU_MILLI, Gpu, Job, Node

NAME = "gpupacking"


class GpuPackingScore:
    NAME = NAME

    def score_node(self, ctx: CycleContext, job: Job, node: Node) -> float:
        task_class = TaskClass.of_request(job.request)
        if task_class.num_gpu == 0:
            return 0.0  # CPU-only pods score 0 everywhere and go to the first node in order
        free = [gpu_free_milli(gpu) for gpu in node.gpus]
        fully_free = sum(1 for amount in free if amount == WHOLE_GPU_MILLI)
        if fully_free == len(free):  # an idle node: the bottom band
            return float(max(100 // 3 - fully_free, fully_free))
        need = task_class.num_gpu
        used_whole = 0
        chosen: list[int] = []
        for index in sorted(range(len(free)), key=lambda i: free[i]):  # least free first (stable)
            if need == 0:
                break
            if task_class.gpu_milli <= free[index]:
                need -= 1
                chosen.append(index)
                if free[index] == WHOLE_GPU_MILLI:
                    used_whole += 1
        if need:
            return 0.0
        if used_whole:  # must open fully free GPUs on a used node: the middle band
            return float(max(100 // 2 - used_whole, 100 // 3))
        free_pct = sum(free[index] * 100 // WHOLE_GPU_MILLI for index in chosen)
        return float(max(100 - free_pct // 10, 100 // 2))  # shares a used GPU: the top band

    def score_gpu(self, ctx: CycleContext, job: Job, node: Node, gpu: Gpu) -> float:
        return tightest_gpu_score(job, gpu)
