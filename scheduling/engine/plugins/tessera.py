"""Tessera's packing policy: FGD's fragmentation score, with ties settled by consolidation and CPU awareness."""

from __future__ import annotations

from scheduling.engine.fragmentation import TaskClass, node_state_key
from scheduling.engine.framework import CycleContext
from scheduling.engine.plugins.fgd import fgd_scores
from scheduling.engine.types import WHOLE_GPU_MILLI, Gpu, Job, Node

NAME = "tessera"


def secondary(ctx: CycleContext, task_class: TaskClass, node: Node) -> float:
    """In [0, 1): how good the node is among those FGD cannot tell apart. Higher is better."""
    model, cpu_free, gpu_free = node_state_key(node)
    mode = ctx.param("tessera.tiebreak", "none")
    total_gpu = max(1, len(gpu_free)) * WHOLE_GPU_MILLI
    gpu_left = sum(gpu_free) - task_class.num_gpu * task_class.gpu_milli
    cpu_left = cpu_free - task_class.cpu_milli
    if mode == "none":
        return 0.0
    if mode == "gpu_tight":
        return 0.999 * (1.0 - gpu_left / 8000.0)
    if mode == "bestfit":
        return 0.999 * (1.0 - 0.5 * gpu_left / 8000.0 - 0.5 * cpu_left / 128000.0)
    if mode == "used":
        return 0.5 if sum(gpu_free) < total_gpu else 0.0
    if mode == "cpu_aware":
        if task_class.num_gpu == 0:
            # CPU-only: where no GPU is left to strand, else where CPU is most plentiful per free GPU.
            if sum(gpu_free) == 0:
                return 0.999
            return 0.9 * min(1.0, (cpu_left / max(1, sum(gpu_free))) / 128.0)
        return 0.999 * (1.0 - gpu_left / 8000.0)
    raise ValueError(f"unknown tessera.tiebreak {mode!r}")


class TesseraScore:
    NAME = NAME

    def score_node(self, ctx: CycleContext, job: Job, node: Node) -> float:
        task_class = TaskClass.of_request(job.request)
        return float(max(fgd_scores(ctx, job, node))) + secondary(ctx, task_class, node)

    def score_gpu(self, ctx: CycleContext, job: Job, node: Node, gpu: Gpu) -> float:
        scores = fgd_scores(ctx, job, node)
        own = scores[gpu.index] if job.request.is_slice else scores[0]
        free = WHOLE_GPU_MILLI - gpu.allocated_compute_milli if job.request.is_slice else 0
        # Within FGD's integer ties: the tightest GPU, then the lowest index.
        return own - free / 2000.0 - gpu.index / 100000.0
