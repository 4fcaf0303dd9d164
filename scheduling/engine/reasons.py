"""Pending reasons: a code and a sentence a researcher understands, naming what is missing and the closest fit.

The codes are stable (UI, API and CLI match on them); the sentences are shown verbatim. docs/engine.md lists them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from scheduling.engine.resources import (
    free_whole_positions,
    gpu_matches,
    largest_clique,
    nvlink_neighbours,
    slice_charge,
    slice_fits_gpu,
)
from scheduling.engine.types import WHOLE_GPU_MILLI, Node, Request, Sharing, Status, TopologyNeed

if TYPE_CHECKING:
    from scheduling.engine.index import NodeIndex

NODE_UNAVAILABLE = "node-unavailable"
NO_MATCHING_GPU = "no-matching-gpu"
INSUFFICIENT_HOST = "insufficient-host"
INSUFFICIENT_GPUS = "insufficient-gpus"
NO_NVLINK_GROUP = "no-nvlink-group"
NO_NUMA_GROUP = "no-numa-group"
NO_SLICE = "no-slice"
NO_FIT = "no-fit"
GANG_INCOMPLETE = "gang-incomplete"
RESERVED = "reserved"
WAITING_FOR_RESERVATION = "waiting-for-capacity"
MOVING = "moving"
BEING_FREED = "capacity-being-freed"
QUOTA_LIMIT = "quota-limit"
NEVER_FITS_QUOTA = "quota-never"
MODEL_QUOTA_LIMIT = "model-quota-limit"
FILTERED = "filtered"
NOT_REACHED = "not-reached"

CODES = {
    NODE_UNAVAILABLE: "no node is ready (all cordoned, draining or lost)",
    NO_MATCHING_GPU: "no ready node has a GPU of the allowed model / memory / compute capability",
    INSUFFICIENT_HOST: "no node has the CPU or host memory free",
    INSUFFICIENT_GPUS: "no node has enough free whole GPUs",
    NO_NVLINK_GROUP: "no node has enough free GPUs that are all NVLink-connected",
    NO_NUMA_GROUP: "no node has enough free GPUs on one NUMA node",
    NO_SLICE: "no GPU has a free slice that large",
    NO_FIT: "each need is met somewhere, but never all on one node",
    GANG_INCOMPLETE: "fewer nodes than the gang needs can host it at once",
    RESERVED: "it fits only into capacity reserved for an earlier job",
    WAITING_FOR_RESERVATION: "capacity is reserved for this job; it starts when running jobs end",
    MOVING: "it was moved to make room: it stops where it ran and restarts where its place is held",
    BEING_FREED: "this cycle's evictions free room it fits; it should start next cycle",
    QUOTA_LIMIT: "the team would exceed its quota limit",
    NEVER_FITS_QUOTA: "the job alone needs more than its team's limit: it can never start as asked",
    MODEL_QUOTA_LIMIT: "the team would exceed its quota limit on a GPU model this job could otherwise use now",
    FILTERED: "a policy filter refused every node that had room",
    NOT_REACHED: "the cycle's attempt budget ran out before this job's turn",
}


def gib(mib: float | None) -> str:
    if mib is None:
        return "unlimited"
    value = mib / 1024
    return f"{value:.0f} GiB" if abs(value - round(value)) < 0.05 else f"{value:.1f} GiB"


def cores(milli: int) -> str:
    return f"{milli / 1000:g} CPU cores"


def describe_gpu(req: Request) -> str:
    parts = []
    if req.gpu_models:
        parts.append("/".join(req.gpu_models))
    if req.min_gpu_memory_mib:
        parts.append(f"with at least {gib(req.min_gpu_memory_mib)}")
    if req.min_compute_capability > (0, 0):
        parts.append("compute capability {}.{}+".format(*req.min_compute_capability))
    return " ".join(parts)


def describe_slice(req: Request) -> str:
    parts = []
    if req.gpu_memory_mib:
        parts.append(gib(req.gpu_memory_mib))
    if req.gpu_compute_milli:
        parts.append(f"{req.gpu_compute_milli / 10:g}% compute")
    return " / ".join(parts)


def _whole_phrase(n: int, req: Request) -> str:
    model = describe_gpu(req)
    noun = "GPU" if n == 1 else "GPUs"
    return f"{n} free {model + ' ' if model else ''}{noun}"


def explain_node(req: Request, node: Node, factor: float) -> Status:
    """Why one node cannot host the request (the filter's answer)."""
    if not node.schedulable:
        return Status(NODE_UNAVAILABLE, f"node {node.name} is {node.state.value}")
    if node.free_cpu_milli < req.cpu_milli or node.free_memory_mib < req.memory_mib:
        return Status(
            INSUFFICIENT_HOST,
            f"needs {cores(req.cpu_milli)} and {gib(req.memory_mib)} host memory; {node.name} has "
            f"{cores(node.free_cpu_milli)} and {gib(node.free_memory_mib)} free",
        )
    if req.gpus:
        free = free_whole_positions(req, node)
        if len(free) < req.gpus:
            return Status(
                INSUFFICIENT_GPUS, f"needs {_whole_phrase(req.gpus, req)}; {node.name} has {len(free)}"
            )
        if req.topology is TopologyNeed.NVLINK:
            best = largest_clique(free, nvlink_neighbours(node))
            return Status(
                NO_NVLINK_GROUP,
                f"needs {req.gpus} NVLink-connected GPUs; the largest free group on {node.name} is {best}",
            )
        return Status(NO_NUMA_GROUP, f"needs {req.gpus} free GPUs on one NUMA node of {node.name}")
    if req.is_slice:
        return Status(NO_SLICE, f"no GPU on {node.name} has a free {describe_slice(req)} slice")
    return Status(NO_FIT, f"{node.name} cannot host it")


def _largest_free_slice(req: Request, node: Node, factor: float) -> tuple[int, int]:
    """(free memory MiB, free compute milli) of the roomiest matching sliceable card on the node."""
    best = (-1, -1)
    for g in node.gpus:
        if not gpu_matches(req, g) or g.sharing is Sharing.EXCLUSIVE:
            continue
        cap = WHOLE_GPU_MILLI * (factor if g.sharing is Sharing.TIMESLICE else 1)
        best = max(best, (g.memory_mib - g.allocated_memory_mib, int(cap - g.allocated_compute_milli)))
    return best


def explain_cluster(req: Request, index: NodeIndex, fits_now: np.ndarray, factor: float) -> Status:
    """Why no node (or too few, for a gang) can host the request now, naming the closest fit.

    `fits_now` marks positions where one node's worth of the request fits (from the request's memo). The work is
    done on the index's arrays; only a handful of nodes are inspected card by card."""
    names = index.names
    if not index.ready.any():
        return Status(NODE_UNAVAILABLE, CODES[NODE_UNAVAILABLE].capitalize())
    static = index.static(req)
    if not static.any():
        return Status(NO_MATCHING_GPU, f"needs a {describe_gpu(req) or 'GPU'}; no ready node has one")
    host = static & (index.free_cpu >= req.cpu_milli) & (index.free_mem >= req.memory_mib)
    if not host.any():
        pos = int(np.argmax(np.where(static, index.free_cpu, -1)))
        return Status(
            INSUFFICIENT_HOST,
            f"needs {cores(req.cpu_milli)} and {gib(req.memory_mib)} host memory on one node; the most free "
            f"is {cores(int(index.free_cpu[pos]))} and {gib(int(index.free_mem[pos]))} on {names[pos]}",
        )
    n_fit = int(fits_now.sum())
    if req.nodes > 1 and n_fit > 0:
        some = ", ".join(names[p] for p in np.flatnonzero(fits_now)[:3].tolist())
        return Status(
            GANG_INCOMPLETE,
            f"needs {req.nodes} nodes that can each host its share at once; {n_fit} can now ({some})",
        )
    if req.gpus:
        return _explain_whole(req, index, static, host)
    if req.is_slice:
        return _explain_slice(req, index, static, host, factor)
    return Status(NO_FIT, "no node has room for it")


def _explain_whole(req: Request, index: NodeIndex, static: np.ndarray, host: np.ndarray) -> Status:
    names, nodes, n = index.names, index.nodes, req.gpus
    idle = np.where(static, index.n_idle, -1)
    best_pos = int(np.argmax(idle))
    most = len(free_whole_positions(req, nodes[best_pos])) if idle[best_pos] > 0 else 0
    if idle[best_pos] < n or most < n:
        where = f" on {names[best_pos]}" if most else ""
        return Status(
            INSUFFICIENT_GPUS, f"needs {_whole_phrase(n, req)} on one node; the most free is {most}{where}"
        )
    enough = [p for p in np.flatnonzero(idle >= n).tolist() if len(free_whole_positions(req, nodes[p])) >= n]
    if not enough:
        return Status(INSUFFICIENT_GPUS, f"needs {_whole_phrase(n, req)} on one node; no node has them free")
    phrase = _whole_phrase(n, req)
    if req.topology is TopologyNeed.NVLINK:
        groups = {
            p: largest_clique(free_whole_positions(req, nodes[p]), nvlink_neighbours(nodes[p]))
            for p in enough
        }
        best = max(groups, key=lambda q: (groups[q], -q))
        if groups[best] < n:
            return Status(
                NO_NVLINK_GROUP,
                f"needs {n} NVLink-connected GPUs on one node; the largest free group is {groups[best]} "
                f"on {names[best]}",
            )
        enough = [p for p in enough if groups[p] >= n]
        phrase = f"{n} free NVLink-connected GPUs"
    elif req.topology is TopologyNeed.NUMA:
        numa = {}
        for p in enough:
            per: dict[int, int] = {}
            for q in free_whole_positions(req, nodes[p]):
                per[nodes[p].gpus[q].numa_node] = per.get(nodes[p].gpus[q].numa_node, 0) + 1
            numa[p] = max(per.values(), default=0)
        best = max(numa, key=lambda q: (numa[q], -q))
        if numa[best] < n:
            return Status(
                NO_NUMA_GROUP,
                f"needs {n} free GPUs on one NUMA node; the most on one NUMA node is {numa[best]} on {names[best]}",
            )
        enough = [p for p in enough if numa[p] >= n]
        phrase = f"{n} free GPUs on one NUMA node"
    if not any(host[p] for p in enough):
        p = max(enough, key=lambda q: (int(index.free_cpu[q]), -q))
        return Status(
            NO_FIT,
            f"no node has both {phrase} and {cores(req.cpu_milli)} / {gib(req.memory_mib)} host memory free; "
            f"closest: {names[p]} has the GPUs but {cores(int(index.free_cpu[p]))} and "
            f"{gib(int(index.free_mem[p]))} free",
        )
    return Status(NO_FIT, f"needs {phrase} on one node; none can host it with its other needs")


def _explain_slice(
    req: Request, index: NodeIndex, static: np.ndarray, host: np.ndarray, factor: float
) -> Status:
    names, nodes = index.names, index.nodes
    sliceable = static & (index.slice_mem >= 0)
    if not sliceable.any():
        return Status(
            NO_SLICE,
            f"needs a {describe_slice(req)} slice; no ready node with a matching GPU shares its GPUs "
            "(MPS, time-slicing or MIG)",
        )
    roomy = sliceable & (index.slice_mem >= req.gpu_memory_mib) & (index.slice_comp >= req.gpu_compute_milli)
    for q in np.flatnonzero(roomy).tolist():
        if any(slice_fits_gpu(req, g, factor) for g in nodes[q].gpus):
            return Status(
                NO_FIT,
                f"a {describe_slice(req)} slice is free on {names[q]}, but it has only "
                f"{cores(int(index.free_cpu[q]))} and {gib(int(index.free_mem[q]))} host memory free "
                f"(needs {cores(req.cpu_milli)} and {gib(req.memory_mib)})",
            )
    p = int(np.argmax(np.where(sliceable, index.slice_mem * 4096 + np.maximum(index.slice_comp, 0), -1)))
    mem, comp = _largest_free_slice(req, nodes[p], factor)
    mig = any(g.sharing is Sharing.MIG and slice_charge(req, g) is None for g in nodes[p].gpus)
    extra = " (MIG slices come only in the card's profile sizes)" if mig else ""
    return Status(
        NO_SLICE,
        f"needs a {describe_slice(req)} slice of one GPU; the largest free slice is {gib(max(0, mem))} / "
        f"{max(0, comp) / 10:g}% compute on {names[p]}{extra}",
    )


def duration_words(seconds: float) -> str:
    """A span as reasons say it: "45 s", "12 min", "2.5 h"."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
