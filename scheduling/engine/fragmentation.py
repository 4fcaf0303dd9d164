"""GPU fragmentation against a typical workload (Weng et al., ATC'23), shared by the FGD scorer and the simulator.

A node's fragmentation is the GPU share a typical task could not use there, weighted by how common each task is.
All amounts are in milli-GPU (1000 = one whole card).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from scheduling.engine.resources import largest_clique
from scheduling.engine.types import WHOLE_GPU_MILLI, Gpu, Node, Request, TopologyNeed

DEFAULT_COVERAGE = 0.95


@dataclass(frozen=True, slots=True)
class TaskClass:
    """One class of the typical workload: what a task asks of a single node."""

    cpu_milli: int
    gpu_milli: int  # per GPU: a share (< 1000) for one GPU, or 1000 per whole GPU
    num_gpu: int
    models: tuple[str, ...] = ()  # allowed GPU models; empty = any
    # Beyond the published measure (the openb trace has neither): whole cards that must be pairwise NVLink-joined,
    # and the least card memory the task may use. A node whose cards cannot serve them counts as fragmented for it.
    nvlink: bool = False
    min_memory_mib: int = 0

    @classmethod
    def of_request(cls, request: Request) -> TaskClass:
        models = tuple(request.gpu_models)
        if request.gpus > 0:
            nvlink = request.topology is TopologyNeed.NVLINK and request.gpus > 1
            return cls(
                request.cpu_milli, WHOLE_GPU_MILLI, request.gpus, models, nvlink, request.min_gpu_memory_mib
            )
        if request.is_slice:
            return cls(
                request.cpu_milli, request.gpu_compute_milli, 1, models, False, request.min_gpu_memory_mib
            )
        return cls(request.cpu_milli, 0, 0, models)

    def to_request(self) -> Request:
        if self.num_gpu == 0:
            return Request(cpu_milli=self.cpu_milli, gpu_models=self.models)
        if self.num_gpu == 1 and self.gpu_milli < WHOLE_GPU_MILLI:
            return Request(
                gpu_compute_milli=self.gpu_milli,
                cpu_milli=self.cpu_milli,
                gpu_models=self.models,
                min_gpu_memory_mib=self.min_memory_mib,
            )
        return Request(
            gpus=self.num_gpu,
            cpu_milli=self.cpu_milli,
            gpu_models=self.models,
            min_gpu_memory_mib=self.min_memory_mib,
            topology=TopologyNeed.NVLINK if self.nvlink else TopologyNeed.NONE,
        )


Workload = tuple[tuple[TaskClass, float], ...]


def typical_workload(classes: Iterable[TaskClass], *, coverage: float = DEFAULT_COVERAGE) -> Workload:
    """The most common classes, in descending count, until `coverage` of the tasks is covered (the crossing class
    included); popularity renormalised over the classes kept. Ties in count keep first-seen order."""
    counts = Counter(classes)
    total = sum(counts.values())
    if total == 0:
        return ()
    kept: list[tuple[TaskClass, int]] = []
    covered = 0
    for task_class, count in sorted(counts.items(), key=lambda item: -item[1]):
        kept.append((task_class, count))
        covered += count
        if covered >= coverage * total:
            break
    kept_total = sum(count for _, count in kept)
    return tuple((task_class, count / kept_total) for task_class, count in kept)


def workload_as_requests(workload: Workload) -> tuple[tuple[Request, float], ...]:
    """The typical workload in the shape `Snapshot.workload` carries."""
    return tuple((task_class.to_request(), share) for task_class, share in workload)


def workload_from_requests(pairs: Sequence[tuple[Request, float]]) -> Workload:
    return tuple((TaskClass.of_request(request), share) for request, share in pairs)


def fragmentation_milli(
    cpu_free_milli: int,
    gpu_free_milli: Sequence[int],
    model: str,
    workload: Workload,
    shape: NodeShape = (frozenset(), 0),
) -> float:
    """Expected GPU share (milli) the typical task cannot use on a node with this free CPU and free GPU shares.

    For each class: all the node's free GPU share if the class needs no GPU, may not use this model or cards this
    small (`shape`: the node's NVLink pairs by card position and its card memory), or does not fit (CPU, or fewer
    than num_gpu GPUs with gpu_milli free, or for an NVLink class fewer whole free cards pairwise joined);
    otherwise the free share of the GPUs too full for it.
    """
    total_free = sum(gpu_free_milli)
    if total_free == 0:
        return 0.0
    links, card_memory_mib = shape
    fragmented = 0.0
    for task_class, share in workload:
        need = task_class.gpu_milli
        if (
            task_class.num_gpu == 0
            or cpu_free_milli < task_class.cpu_milli
            or (task_class.models and model not in task_class.models)
            or (task_class.min_memory_mib and card_memory_mib and card_memory_mib < task_class.min_memory_mib)
        ):
            fragmented += share * total_free
            continue
        usable = 0
        stranded = 0
        for free in gpu_free_milli:
            if free >= need:
                usable += 1
            else:
                stranded += free
        if task_class.nvlink and usable >= task_class.num_gpu:
            usable = joined_free(gpu_free_milli, links)
        fragmented += share * (total_free if usable < task_class.num_gpu else stranded)
    return fragmented


# What fragmentation reads of a node beyond its free shares: its NVLink pairs (card positions) and card memory.
NodeShape = tuple[frozenset[tuple[int, int]], int]


def node_shape(node: Node) -> NodeShape:
    """The node's NVLink pairs by card position, and its largest card's memory."""
    pos = {g.index: i for i, g in enumerate(node.gpus)}
    links = frozenset(
        (min(pos[a], pos[b]), max(pos[a], pos[b])) for a, b in node.nvlink if a in pos and b in pos
    )
    return links, max((g.memory_mib for g in node.gpus), default=0)


@lru_cache(maxsize=65536)
def _joined(free_positions: tuple[int, ...], links: frozenset[tuple[int, int]]) -> int:
    nbrs: dict[int, frozenset[int]] = {}
    for p in free_positions:
        nbrs[p] = frozenset(q for q in free_positions if (min(p, q), max(p, q)) in links)
    return largest_clique(list(free_positions), nbrs)


def joined_free(gpu_free_milli: Sequence[int], links: frozenset[tuple[int, int]]) -> int:
    """The most wholly free cards that are pairwise NVLink-joined (positions in `links`)."""
    free = tuple(i for i, f in enumerate(gpu_free_milli) if f >= WHOLE_GPU_MILLI)
    if len(free) <= 1:
        return len(free)
    return _joined(free, links)


def gpu_free_milli(gpu: Gpu) -> int:
    """Free compute share of one GPU: what a slice could still take (0 for a card held whole)."""
    return WHOLE_GPU_MILLI - gpu.allocated_compute_milli


def node_model(node: Node) -> str:
    return node.gpus[0].model if node.gpus else ""


def node_fragmentation_milli(node: Node, workload: Workload) -> float:
    return fragmentation_milli(
        node.free_cpu_milli,
        [gpu_free_milli(gpu) for gpu in node.gpus],
        node_model(node),
        workload,
        node_shape(node),
    )


def node_state_key(node: Node) -> tuple[str, int, tuple[int, ...]]:
    """What the fragmentation scorers read from a node: its GPU model, free CPU and each GPU's free share."""
    return (
        node_model(node),
        node.free_cpu_milli,
        tuple(WHOLE_GPU_MILLI - gpu.allocated_compute_milli for gpu in node.gpus),
    )


def take_gpus(
    gpu_free: tuple[int, ...], task_class: TaskClass, gpu_index: int | None = None
) -> tuple[int, ...]:
    """The free shares after placing the task: on `gpu_index` for a slice, else on the lowest fully free GPUs."""
    free = list(gpu_free)
    if task_class.num_gpu == 0:
        return gpu_free
    if task_class.num_gpu == 1 and task_class.gpu_milli < WHOLE_GPU_MILLI:
        if gpu_index is None:
            raise ValueError("a slice needs the GPU it goes to")
        free[gpu_index] -= task_class.gpu_milli
        return tuple(free)
    left = task_class.num_gpu
    for index, amount in enumerate(free):
        if left == 0:
            break
        if amount == WHOLE_GPU_MILLI:
            free[index] = 0
            left -= 1
    return tuple(free)


# The normalising constants of the reference simulator's BestFit and DotProd scores: the largest node's CPU and GPU.
MAX_NODE_CPU_MILLI = 128_000
MAX_NODE_GPU_MILLI = 8_000
