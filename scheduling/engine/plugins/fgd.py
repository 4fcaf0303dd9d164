"""FGD: place where the typical workload loses the least usable GPU (Weng et al., ATC'23), scored as the paper's code does."""

from __future__ import annotations

import itertools
import math

from scheduling.engine.fragmentation import (
    NodeShape,
    TaskClass,
    Workload,
    fragmentation_milli,
    node_shape,
    node_state_key,
    take_gpus,
    workload_from_requests,
)
from scheduling.engine.framework import CycleContext
from scheduling.engine.types import WHOLE_GPU_MILLI, Gpu, Job, Node

NAME = "fgd"

# Scores are pure functions of (workload, task class, node state); a simulator asks the same questions thousands of
# times, so answers are kept across cycles. Bounded: cleared when it grows past this many entries.
_MAX_MEMO = 500_000
# Each snapshot's workload object, with its task classes and key: the memos below are keyed by a number given once
# per distinct workload (by its content), never by an object's id, which Python gives again once that object is
# freed; an id as key let a later workload read answers computed for an earlier one (a simulated day then came out
# differently when run twice).
_workloads: dict[int, tuple[object, int, Workload]] = {}
_workload_keys: dict[Workload, int] = {}
_workload_serial = itertools.count(1)
_frag_memo: dict[tuple, float] = {}
_score_memo: dict[tuple, tuple[int, ...]] = {}


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def workload_of(ctx: CycleContext) -> tuple[int, Workload]:
    """The snapshot's typical workload as task classes, with the memos' key for it: converted once per workload
    object, and the same key for workloads of the same content."""
    pairs = ctx.snapshot.workload
    entry = _workloads.get(id(pairs))
    if entry is None or entry[0] is not pairs:
        workload = workload_from_requests(pairs)
        key = _workload_keys.get(workload)
        if key is None:
            if len(_workload_keys) > 1024:
                _workload_keys.clear()  # keys are never given twice, so forgetting one only costs a recomputation
            key = _workload_keys[workload] = next(_workload_serial)
        if len(_workloads) > 64:
            _workloads.clear()
        entry = _workloads[id(pairs)] = (pairs, key, workload)
    return entry[1], entry[2]


def frag(
    wkey: int,
    workload: Workload,
    model: str,
    cpu_free: int,
    gpu_free: tuple[int, ...],
    shape: NodeShape = (frozenset(), 0),
) -> float:
    key = (wkey, model, cpu_free, gpu_free, shape)
    value = _frag_memo.get(key)
    if value is None:
        if len(_frag_memo) > _MAX_MEMO:
            _frag_memo.clear()
        value = fragmentation_milli(cpu_free, gpu_free, model, workload, shape)
        _frag_memo[key] = value
    return value


_NO_SHAPE: NodeShape = (frozenset(), 0)
_shaped_memo: dict[int, tuple[object, bool]] = {}


def _shaped(workload: Workload) -> bool:
    """Whether any class needs NVLink or a card size (then the node's links and card memory count)."""
    entry = _shaped_memo.get(id(workload))
    if entry is None or entry[0] is not workload:
        if len(_shaped_memo) > 64:
            _shaped_memo.clear()
        entry = _shaped_memo[id(workload)] = (
            workload,
            any(c.nvlink or c.min_memory_mib for c, _ in workload),
        )
    return entry[1]


def fgd_scores(ctx: CycleContext, job: Job, node: Node, resolution: int = 100) -> tuple[int, ...]:
    """Per-GPU integer scores for a slice (-1 where it does not fit), or a one-element tuple for anything else.

    Scores are int(resolution * sigmoid(drop in fragmentation / 1000)); the paper's code uses resolution 100."""
    wkey, workload = workload_of(ctx)
    task_class = TaskClass.of_request(job.request)
    model, cpu_free, gpu_free = node_state_key(node)
    shape = node_shape(node) if _shaped(workload) else _NO_SHAPE
    key = (wkey, resolution, task_class, model, cpu_free, gpu_free, shape)
    scores = _score_memo.get(key)
    if scores is not None:
        return scores
    before = frag(wkey, workload, model, cpu_free, gpu_free, shape)
    cpu_after = cpu_free - task_class.cpu_milli
    if task_class.num_gpu == 1 and task_class.gpu_milli < WHOLE_GPU_MILLI:
        per_gpu = []
        for index, free in enumerate(gpu_free):
            if free < task_class.gpu_milli:
                per_gpu.append(-1)
                continue
            after = frag(wkey, workload, model, cpu_after, take_gpus(gpu_free, task_class, index), shape)
            per_gpu.append(int(_sigmoid((before - after) / 1000.0) * resolution))
        scores = tuple(per_gpu)
    else:
        after = frag(wkey, workload, model, cpu_after, take_gpus(gpu_free, task_class), shape)
        scores = (int(_sigmoid((before - after) / 1000.0) * resolution),)
    if len(_score_memo) > _MAX_MEMO:
        _score_memo.clear()
    _score_memo[key] = scores
    return scores


class FgdScore:
    """Node: the integer FGD score of the best GPU (slices) or of the placement (whole GPUs, CPU only).
    GPU: the slice goes to the GPU with the best integer score; ties to the lowest index."""

    NAME = NAME

    def score_node(self, ctx: CycleContext, job: Job, node: Node) -> float:
        return float(max(fgd_scores(ctx, job, node)))

    def score_gpu(self, ctx: CycleContext, job: Job, node: Node, gpu: Gpu) -> float:
        scores = fgd_scores(ctx, job, node)
        own = scores[gpu.index] if job.request.is_slice else scores[0]
        # The index term only breaks ties (scores are integers), towards the lowest index as the paper's code does.
        return own - gpu.index / 1000.0
