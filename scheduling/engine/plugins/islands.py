"""Score: work goes where it breaks no room that bigger work of the typical workload needs (a whole NVLink island, a
whole node), weighed by the share of the GPU demand that bigger work is.

The bigger work is read from the snapshot's typical workload (what is queued and was recently submitted): every
class asking for more whole cards on one node than the job does (or as many under a stricter rule: NVLink where
the job needs none, larger cards, fewer models; `outranks`), with its share of the GPUs asked for (a class's
popularity x the cards it asks for on all its nodes, over the whole workload's). A placement that leaves a node
unable to host such a class, which it could host before, loses that class's share; the score is 1 minus the
loss. So slices and single cards go first to cards already broken and to nodes no bigger class can use (cards
joined only in pairs, PCIe cards, models or memory sizes no big job asks for), pairs to nodes where a bigger
island is already broken, and the last whole NVLink nodes stay whole for the 8-GPU trainings and gangs that use
them. With no bigger work in the workload every node scores 1 and the other scores decide.

The answer depends only on the request, the node's shape and the typical workload (cacheable).
"""

from __future__ import annotations

from scheduling.engine.framework import CycleContext
from scheduling.engine.resources import (
    DEFAULT_TIMESLICE_FACTOR,
    allocate_on_node,
    choose_whole,
    gpu_is_free,
    node_fits,
    slice_fits_gpu,
    whole_assignments,
)
from scheduling.engine.types import WHOLE_GPU_MILLI, Assignment, Job, Node, Request, TopologyNeed

NAME = "islands"

# Losses are counted in steps of this share of the demand: a smaller difference is no reason to pack worse.
LOSS_QUANTUM = 0.01

_classes: dict[int, tuple[object, tuple[tuple[Request, int, float], ...]]] = {}


def bigger_work(workload: tuple[tuple[Request, float], ...]) -> tuple[tuple[Request, int, float], ...]:
    """The multi-card classes of a typical workload as (one node's request, cards per node, share of the GPU
    demand), largest first. Each class is asked of one node: a gang needs that much room on each of its nodes."""
    demand = 0.0
    multi: dict[Request, float] = {}
    for req, popularity in workload:
        if req.gpus:
            gpus = req.gpus * max(1, req.nodes)
        elif req.is_slice:
            gpus = max(req.gpu_compute_milli, 1) / WHOLE_GPU_MILLI
        else:
            continue
        demand += popularity * gpus
        if req.gpus >= 2:
            one = Request(
                gpus=req.gpus,
                gpu_models=req.gpu_models,
                min_gpu_memory_mib=req.min_gpu_memory_mib,
                min_compute_capability=req.min_compute_capability,
                topology=req.topology,
                cpu_milli=req.cpu_milli,
                memory_mib=req.memory_mib,
            )
            multi[one] = multi.get(one, 0.0) + popularity * gpus
    if demand <= 0:
        return ()
    return tuple(
        sorted(((r, r.gpus, w / demand) for r, w in multi.items()), key=lambda t: (-t[1], -t[2], repr(t[0])))
    )


def _bigger_work(ctx: CycleContext) -> tuple[tuple[Request, int, float], ...]:
    workload = ctx.snapshot.workload
    entry = _classes.get(id(workload))
    if entry is None or entry[0] is not workload:
        if len(_classes) > 64:
            _classes.clear()
        entry = _classes[id(workload)] = (workload, bigger_work(workload))
    return entry[1]


def _afters(req: Request, node: Node, factor: float) -> list[Node]:
    """The node once the job is placed as the card choosers would place it: whole cards on the tightest island
    that holds them; a slice on a card already shared where one holds it, else on one of the idle cards (each is
    a candidate: the card scores prefer the one in the smallest free island)."""
    if req.gpus:
        cards = choose_whole(req, node, topology_aware=True)
        if cards is None:
            return []
        return [allocate_on_node(node, whole_assignments(node, cards), req.cpu_milli, req.memory_mib)]
    fits = [(i, c) for i, g in enumerate(node.gpus) if (c := slice_fits_gpu(req, g, factor)) is not None]
    shared = [(i, c) for i, c in fits if not gpu_is_free(node.gpus[i])]
    return [
        allocate_on_node(
            node, (Assignment(node.name, node.gpus[i].index, mem, comp),), req.cpu_milli, req.memory_mib
        )
        for i, (mem, comp) in (shared[:1] or fits)
    ]


_TOPOLOGY_RANK = {TopologyNeed.NONE: 0, TopologyNeed.NUMA: 1, TopologyNeed.NVLINK: 2}


def outranks(c: Request, req: Request) -> bool:
    """Whether class `c` needs room `req` could do without: more cards on a node, or as many under a stricter
    rule (NVLink or NUMA where `req` needs none, larger cards, fewer allowed models), so that `req` taking the room
    `c` needs is a loss (work of its own kind or smaller can go anywhere it can)."""
    own = req.gpus if req.gpus else 0
    if c.gpus != own:
        return c.gpus > own
    if _TOPOLOGY_RANK[c.topology] != _TOPOLOGY_RANK[req.topology]:
        return _TOPOLOGY_RANK[c.topology] > _TOPOLOGY_RANK[req.topology]
    if c.min_gpu_memory_mib != req.min_gpu_memory_mib:
        return c.min_gpu_memory_mib > req.min_gpu_memory_mib
    if c.gpu_models and set(c.gpu_models) != set(req.gpu_models):
        return not req.gpu_models or set(c.gpu_models) < set(req.gpu_models)
    return False


def room_lost(
    req: Request, node: Node, classes: tuple[tuple[Request, int, float], ...], factor: float
) -> float:
    """The share of the demand, among classes that outrank the request (`outranks`), that the node could host
    before the placement and not after (0 when the request does not fit)."""
    hosted = [(c, w) for c, _, w in classes if outranks(c, req) and node_fits(c, node, factor)]
    if not hosted:
        return 0.0
    afters = _afters(req, node, factor)
    if not afters:
        return 0.0
    return min(sum(w for c, w in hosted if not node_fits(c, after, factor)) for after in afters)


class Islands:
    NAME = NAME
    CACHEABLE = True

    def score_node(self, ctx: CycleContext, job: Job, node: Node) -> float:
        req = job.request
        if not req.uses_gpu:
            return 1.0
        classes = _bigger_work(ctx)
        if not classes:
            return 1.0
        factor = ctx.param("timeslice_oversubscription", DEFAULT_TIMESLICE_FACTOR)
        lost = room_lost(req, node, classes, factor)
        return 1.0 - round(lost / LOSS_QUANTUM) * LOSS_QUANTUM
