"""Resource arithmetic: what a request charges on a GPU, whether it fits a node, and which GPUs it takes.

Every filter, score, the session ledger and the pending reasons use these functions, so "fits" means one thing.
"""

from __future__ import annotations

from dataclasses import fields
from functools import lru_cache
from operator import attrgetter

from scheduling.engine.types import (
    WHOLE_GPU_MILLI,
    Assignment,
    Gpu,
    Health,
    Job,
    Node,
    Request,
    Sharing,
    TopologyNeed,
)

# Time-sliced GPUs may hand out this many whole cards' worth of compute shares (profile param
# "timeslice_oversubscription"); memory is never oversubscribed.
DEFAULT_TIMESLICE_FACTOR = 4.0


def gpu_matches(req: Request, gpu: Gpu) -> bool:
    """The static part of a fit: healthy card, allowed model, enough total memory, new enough architecture."""
    if gpu.health is Health.FAILED:
        return False
    if req.gpu_models and gpu.model not in req.gpu_models:
        return False
    if gpu.memory_mib < req.min_gpu_memory_mib:
        return False
    return gpu.compute_capability >= req.min_compute_capability


def gpu_is_free(gpu: Gpu) -> bool:
    return gpu.holders == 0 and gpu.allocated_memory_mib == 0 and gpu.allocated_compute_milli == 0


def mig_profile_for(req: Request, gpu: Gpu) -> int | None:
    """The smallest MIG instance (MiB) that holds the slice: memory rounds up to a profile size and a
    compute-only slice takes the smallest profile whose proportional compute share covers it."""
    for size in sorted(gpu.mig_profiles_mib):
        if size < req.gpu_memory_mib:
            continue
        if req.gpu_compute_milli and mig_compute_milli(size, gpu) < req.gpu_compute_milli:
            continue
        return size
    return None


def mig_compute_milli(size_mib: int, gpu: Gpu) -> int:
    return min(WHOLE_GPU_MILLI, -(-size_mib * WHOLE_GPU_MILLI // gpu.memory_mib))


def slice_charge(req: Request, gpu: Gpu) -> tuple[int, int] | None:
    """(memory_mib, compute_milli) a slice request holds on this card, or None if the card takes no slices.

    A memory-only slice holds the compute share proportional to its memory (10 GiB of an 80 GiB card = 125 milli),
    so quota counts it exactly; a compute-only slice holds no memory. MIG slices hold a whole instance."""
    if gpu.sharing is Sharing.EXCLUSIVE:
        return None
    if gpu.sharing is Sharing.MIG:
        size = mig_profile_for(req, gpu)
        if size is None:
            return None
        return size, mig_compute_milli(size, gpu)
    compute = req.gpu_compute_milli
    if compute == 0:
        compute = -(-req.gpu_memory_mib * WHOLE_GPU_MILLI // gpu.memory_mib)
    return req.gpu_memory_mib, compute


def compute_cap_milli(gpu: Gpu, timeslice_factor: float) -> int:
    if gpu.sharing is Sharing.TIMESLICE:
        return int(WHOLE_GPU_MILLI * timeslice_factor)
    return WHOLE_GPU_MILLI


def slice_fits_gpu(req: Request, gpu: Gpu, timeslice_factor: float) -> tuple[int, int] | None:
    """The charge if the slice fits on this card now, else None."""
    if not gpu_matches(req, gpu):
        return None
    if gpu.allocated_memory_mib >= gpu.memory_mib:
        # A card with no free memory (e.g. held whole) takes no one else, not even a compute-only slice.
        return None
    charge = slice_charge(req, gpu)
    if charge is None:
        return None
    memory_mib, compute_milli = charge
    if gpu.allocated_memory_mib + memory_mib > gpu.memory_mib:
        return None
    if gpu.allocated_compute_milli + compute_milli > compute_cap_milli(gpu, timeslice_factor):
        return None
    return charge


def host_fits(req: Request, node: Node) -> bool:
    return node.free_cpu_milli >= req.cpu_milli and node.free_memory_mib >= req.memory_mib


def free_whole_positions(req: Request, node: Node) -> list[int]:
    """Positions (in node.gpus) of the idle cards this request may take whole."""
    return [i for i, g in enumerate(node.gpus) if gpu_is_free(g) and gpu_matches(req, g)]


def nvlink_neighbours(node: Node) -> dict[int, frozenset[int]]:
    """GPU position -> positions it has an NVLink to."""
    return _neighbours(node.nvlink, tuple(g.index for g in node.gpus))


@lru_cache(maxsize=4096)
def _neighbours(nvlink: frozenset[tuple[int, int]], indexes: tuple[int, ...]) -> dict[int, frozenset[int]]:
    pos = {index: i for i, index in enumerate(indexes)}
    nbrs: dict[int, set[int]] = {i: set() for i in range(len(indexes))}
    for a, b in nvlink:
        if a in pos and b in pos:
            nbrs[pos[a]].add(pos[b])
            nbrs[pos[b]].add(pos[a])
    return {i: frozenset(v) for i, v in nbrs.items()}


def components(positions: list[int], nbrs: dict[int, frozenset[int]]) -> list[list[int]]:
    """Connected NVLink islands among the given cards, each sorted, in order of their lowest card."""
    left = set(positions)
    out: list[list[int]] = []
    for p in positions:
        if p not in left:
            continue
        stack, comp = [p], []
        left.discard(p)
        while stack:
            q = stack.pop()
            comp.append(q)
            for r in nbrs[q]:
                if r in left:
                    left.discard(r)
                    stack.append(r)
        out.append(sorted(comp))
    return out


def _first_clique(cands: list[int], n: int, nbrs: dict[int, frozenset[int]]) -> tuple[int, ...] | None:
    """The lexicographically first set of n cards that are pairwise NVLink-connected."""
    if n <= 1:
        return tuple(cands[:n]) if len(cands) >= n else None

    def extend(chosen: list[int], rest: list[int]) -> tuple[int, ...] | None:
        if len(chosen) == n:
            return tuple(chosen)
        for k, c in enumerate(rest):
            if len(chosen) + len(rest) - k < n:
                return None
            if all(c in nbrs[x] for x in chosen):
                found = extend([*chosen, c], rest[k + 1 :])
                if found:
                    return found
        return None

    return extend([], cands)


def largest_clique(cands: list[int], nbrs: dict[int, frozenset[int]]) -> int:
    """Size of the largest all-pairwise NVLink set among the cards (cards are few per node)."""
    best = min(1, len(cands))
    for size in range(len(cands), 1, -1):
        if size <= best:
            break
        if _first_clique(cands, size, nbrs):
            return size
    return best


def choose_whole(req: Request, node: Node, *, topology_aware: bool) -> tuple[int, ...] | None:
    """Card positions for `req.gpus` whole cards on this node, or None when the node cannot host them.

    Without topology awareness: the lowest-index free cards (the first NUMA node / NVLink set that fits).
    With it: the tightest NVLink island that holds the job, so large islands stay whole for large jobs."""
    n = req.gpus
    free = free_whole_positions(req, node)
    if len(free) < n:
        return None
    need = req.topology
    if need is TopologyNeed.NONE and not topology_aware:
        return tuple(free[:n])
    nbrs = nvlink_neighbours(node) if (topology_aware or need is TopologyNeed.NVLINK) else {}
    groups: list[list[int]]
    if need is TopologyNeed.NUMA:
        by_numa: dict[int, list[int]] = {}
        for p in free:
            by_numa.setdefault(node.gpus[p].numa_node, []).append(p)
        groups = [g for g in by_numa.values() if len(g) >= n]
        if not groups:
            return None
        if topology_aware:
            groups.sort(key=lambda g: (len(g), g[0]))
        groups = groups[:1]
    else:
        groups = [free]
    if need is TopologyNeed.NVLINK:
        islands = components(groups[0], nbrs)
        if topology_aware:
            islands.sort(key=lambda c: (len(c), c[0]))
        for island in islands:
            if len(island) >= n:
                found = _first_clique(island, n, nbrs)
                if found:
                    return found
        return None
    chosen = groups[0]
    if topology_aware and nbrs:
        # Take cards from the smallest islands first so the big ones stay whole.
        islands = components(chosen, nbrs)
        islands.sort(key=lambda c: (len(c), c[0]))
        chosen = [p for island in islands for p in island]
        return tuple(sorted(chosen[:n]))
    return tuple(chosen[:n])


def node_fits(req: Request, node: Node, timeslice_factor: float) -> bool:
    """Can this node host one node's worth of the request right now (ignoring reservations)?"""
    if not node.schedulable or not host_fits(req, node):
        return False
    if req.gpus > 0:
        if req.topology is TopologyNeed.NONE:
            count = 0
            for g in node.gpus:
                if gpu_is_free(g) and gpu_matches(req, g):
                    count += 1
                    if count >= req.gpus:
                        return True
            return False
        return choose_whole(req, node, topology_aware=False) is not None
    if req.is_slice:
        for g in node.gpus:
            if slice_fits_gpu(req, g, timeslice_factor) is not None:
                return True
        return False
    return True  # CPU-only


def whole_assignments(node: Node, positions: tuple[int, ...]) -> tuple[Assignment, ...]:
    return tuple(
        Assignment(node.name, node.gpus[p].index, node.gpus[p].memory_mib, WHOLE_GPU_MILLI) for p in positions
    )


# Fast copies with a few fields changed: dataclasses.replace is the engine's hottest call otherwise.
_GPU_FIELDS = tuple(f.name for f in fields(Gpu))
_NODE_FIELDS = tuple(f.name for f in fields(Node))
_gpu_values = attrgetter(*_GPU_FIELDS)
_node_values = attrgetter(*_NODE_FIELDS)
_G_MEM, _G_COMP, _G_HOLDERS = (
    _GPU_FIELDS.index("allocated_memory_mib"),
    _GPU_FIELDS.index("allocated_compute_milli"),
    _GPU_FIELDS.index("holders"),
)
_N_GPUS, _N_CPU, _N_MEM = (
    _NODE_FIELDS.index("gpus"),
    _NODE_FIELDS.index("allocated_cpu_milli"),
    _NODE_FIELDS.index("allocated_memory_mib"),
)


def gpu_with(gpu: Gpu, memory_mib: int, compute_milli: int, holders: int) -> Gpu:
    """The card with a different ledger."""
    values = list(_gpu_values(gpu))
    values[_G_MEM], values[_G_COMP], values[_G_HOLDERS] = memory_mib, compute_milli, holders
    return Gpu(*values)


def node_with(node: Node, gpus: tuple[Gpu, ...], cpu_milli: int, memory_mib: int) -> Node:
    """The node with other cards and a different host ledger."""
    values = list(_node_values(node))
    values[_N_GPUS], values[_N_CPU], values[_N_MEM] = gpus, cpu_milli, memory_mib
    return Node(*values)


def _card_positions(node: Node) -> dict[int, int]:
    return {g.index: i for i, g in enumerate(node.gpus)}


def allocate_on_node(
    node: Node, assignments: tuple[Assignment, ...], cpu_milli: int, memory_mib: int
) -> Node:
    """The node after a job takes these GPUs (whole or slices) and host resources."""
    gpus = list(node.gpus)
    pos = _card_positions(node)
    for a in assignments:
        i = pos[a.gpu_index]
        g = gpus[i]
        gpus[i] = gpu_with(
            g,
            g.allocated_memory_mib + a.memory_mib,
            g.allocated_compute_milli + a.compute_milli,
            g.holders + 1,
        )
    return node_with(
        node, tuple(gpus), node.allocated_cpu_milli + cpu_milli, node.allocated_memory_mib + memory_mib
    )


def release_on_node(node: Node, assignments: tuple[Assignment, ...], cpu_milli: int, memory_mib: int) -> Node:
    """The node after one job gives back what it held on it."""
    return release_many(node, [(assignments, cpu_milli, memory_mib)])


def release_many(node: Node, holdings: list[tuple[tuple[Assignment, ...], int, int]]) -> Node:
    """The node after several jobs give back (assignments, cpu_milli, memory_mib) each, in one copy.

    Never below zero: host CPU and memory are counted from the running jobs, not kept in a ledger, so a job whose
    recorded share is stale must not drive a node negative and make it look larger than it is.
    """
    if not holdings:
        return node
    gpus = list(node.gpus)
    pos = _card_positions(node)
    cpu = node.allocated_cpu_milli
    mem = node.allocated_memory_mib
    for assignments, cpu_milli, memory_mib in holdings:
        cpu -= cpu_milli
        mem -= memory_mib
        for a in assignments:
            i = pos.get(a.gpu_index)
            if i is None:
                continue
            g = gpus[i]
            gpus[i] = gpu_with(
                g,
                max(0, g.allocated_memory_mib - a.memory_mib),
                max(0, g.allocated_compute_milli - a.compute_milli),
                max(0, g.holders - 1),
            )
    return node_with(node, tuple(gpus), max(0, cpu), max(0, mem))


def job_host_on(job: Job, node_name: str) -> tuple[int, int]:
    """(cpu_milli, memory_mib) a running job holds on a node: its recorded host share, else its request."""
    held = job.cpu_assignments.get(node_name)
    if held is not None:
        return held
    return job.request.cpu_milli, job.request.memory_mib


def charge_of(assignments: tuple[Assignment, ...]) -> tuple[int, int]:
    """(gpu memory MiB, compute milli) a set of assignments counts against quota: fractions exactly."""
    mem = 0
    comp = 0
    for a in assignments:
        mem += a.memory_mib
        comp += a.compute_milli
    return mem, comp
