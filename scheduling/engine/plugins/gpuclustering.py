"""GpuClustering baseline as the FGD paper's simulator codes it: keep pods of one GPU-request class together."""

from __future__ import annotations

from scheduling.engine.fragmentation import MAX_NODE_GPU_MILLI, TaskClass, gpu_free_milli
from scheduling.engine.framework import CycleContext
from scheduling.engine.plugins.bestfit import tightest_gpu_score
from scheduling.engine.types import WHOLE_GPU_MILLI, Gpu, Job, Node, Request

NAME = "gpuclustering"

# A simulator may keep each node's request classes in this label (comma-separated) instead of listing every running
# job in each snapshot; without it the classes are read from the snapshot's running jobs.
CLASSES_LABEL = "tessera.io/gpu-request-classes"


def request_class_tag(request: Request) -> str | None:
    """The reference's GPU affinity: 'share' for a slice, 'N-gpu' for N whole GPUs, None without GPU."""
    task_class = TaskClass.of_request(request)
    if task_class.num_gpu == 0:
        return None
    if task_class.num_gpu == 1 and task_class.gpu_milli < WHOLE_GPU_MILLI:
        return "share"
    return f"{task_class.num_gpu}-gpu"


def _classes_from_running(ctx: CycleContext) -> dict[str, set[str]]:
    by_node = ctx.cache.get("gpuclustering.classes")
    if by_node is None:
        by_node = {}
        for job in ctx.snapshot.running:
            tag = request_class_tag(job.request)
            if tag is None:
                continue
            for assignment in job.assignments:
                by_node.setdefault(assignment.node, set()).add(tag)
        ctx.cache["gpuclustering.classes"] = by_node
    return by_node


def node_classes(ctx: CycleContext, node: Node) -> set[str]:
    label = node.labels.get(CLASSES_LABEL)
    if label is not None:
        return {tag for tag in label.split(",") if tag}
    return _classes_from_running(ctx).get(node.name, set())


class GpuClusteringScore:
    NAME = NAME

    def score_node(self, ctx: CycleContext, job: Job, node: Node) -> float:
        tag = request_class_tag(job.request)
        if tag is None:
            return 0.0  # CPU-only pods score 0 everywhere and go to the first node in order
        classes = node_classes(ctx, node)
        gpu_free = sum(gpu_free_milli(gpu) for gpu in node.gpus)
        # Integer arithmetic as in the reference: four bands of 25, less free GPU scoring higher within a band.
        within = 100 // 4 * (MAX_NODE_GPU_MILLI - gpu_free) // MAX_NODE_GPU_MILLI
        if tag in classes:
            band = 3 if len(classes) == 1 else 2
        else:
            band = 1 if not classes else 0
        return float(within + 100 * band // 4)

    def score_gpu(self, ctx: CycleContext, job: Job, node: Node, gpu: Gpu) -> float:
        return tightest_gpu_score(job, gpu)
