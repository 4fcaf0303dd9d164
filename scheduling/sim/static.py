"""Static packing replay of the openb trace through the production engine, following the FGD paper's protocol.

Pods only arrive (no departures), each gets one placement attempt, and the result is how much GPU is allocated as
the requested GPU grows to 1.3 x capacity. See docs/simulator.md and the trace README for the protocol.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from scheduling.engine import run_cycle as production_cycle
from scheduling.engine.fragmentation import (
    TaskClass,
    Workload,
    fragmentation_milli,
    typical_workload,
    workload_as_requests,
)
from scheduling.engine.framework import Profile
from scheduling.engine.plugins.gpuclustering import CLASSES_LABEL, request_class_tag
from scheduling.engine.types import WHOLE_GPU_MILLI, Gpu, Job, Node, Request, Sharing, Snapshot
from scheduling.sim.openb import TraceNode, TracePod

INFLATION = 1.3  # the workload is extended until it asks for this multiple of the cluster's GPU capacity
FRAG_AT_ARRIVAL_PCT = 90
# openb does not give GPU memory; slices ask for compute only, so any positive size works. Whole cards take it all.
NOMINAL_GPU_MEMORY_MIB = 16_384

RunCycle = Callable[[Snapshot, Profile], object]


@dataclass(frozen=True, slots=True)
class SeedResult:
    seed: int
    unallocated_pct_at_100: float
    frag_pct_at_90: float
    alloc_curve: dict[int, float]  # arrival % (rounded) -> mean allocation % over the events at that arrival
    frag_curve: dict[int, float]  # arrival % (rounded) -> mean fragmentation % of capacity
    pods: int
    placed: int
    failed: int
    runtime_s: float
    node_order: tuple[str, ...] = ()  # the run's fixed node order (ties go to the first)
    # Per arrival: (pod name, node it went to or None, GPU indexes it took).
    outcomes: tuple[tuple[str, str | None, tuple[int, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class StaticReport:
    policy: str
    nodes: int
    gpus: int
    original_pods: int
    seeds: tuple[SeedResult, ...]
    runtime_s: float
    typical_classes: int = 0

    @property
    def unallocated_pct_at_100(self) -> float:
        return statistics.fmean(result.unallocated_pct_at_100 for result in self.seeds)

    @property
    def unallocated_pct_at_100_sd(self) -> float:
        values = [result.unallocated_pct_at_100 for result in self.seeds]
        return statistics.stdev(values) if len(values) > 1 else 0.0

    @property
    def frag_pct_at_90(self) -> float:
        return statistics.fmean(result.frag_pct_at_90 for result in self.seeds)

    def alloc_curve(self) -> dict[int, float]:
        """Mean over seeds of allocation % at each arrival % that every seed reached."""
        common = set.intersection(*(set(result.alloc_curve) for result in self.seeds))
        return {
            pct: statistics.fmean(result.alloc_curve[pct] for result in self.seeds) for pct in sorted(common)
        }

    def as_dict(self) -> dict:
        return {
            "policy": self.policy,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "original_pods": self.original_pods,
            "typical_classes": self.typical_classes,
            "seeds": [result.seed for result in self.seeds],
            "unallocated_pct_at_100": round(self.unallocated_pct_at_100, 4),
            "unallocated_pct_at_100_sd": round(self.unallocated_pct_at_100_sd, 4),
            "frag_pct_at_90": round(self.frag_pct_at_90, 4),
            "alloc_curve": {str(pct): round(value, 4) for pct, value in self.alloc_curve().items()},
            "runtime_s": round(self.runtime_s, 3),
            "per_seed": [
                {
                    "seed": result.seed,
                    "unallocated_pct_at_100": round(result.unallocated_pct_at_100, 4),
                    "frag_pct_at_90": round(result.frag_pct_at_90, 4),
                    "pods": result.pods,
                    "placed": result.placed,
                    "failed": result.failed,
                    "runtime_s": round(result.runtime_s, 3),
                }
                for result in self.seeds
            ],
        }


def pod_request(pod: TracePod) -> Request:
    """An openb pod as an engine request: n whole GPUs, one slice of compute, or CPU only."""
    if pod.num_gpu >= 1 and pod.gpu_milli >= WHOLE_GPU_MILLI:
        return Request(
            gpus=pod.num_gpu, cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib, gpu_models=pod.gpu_spec
        )
    if pod.num_gpu == 1:
        return Request(
            gpu_compute_milli=pod.gpu_milli,
            cpu_milli=pod.cpu_milli,
            memory_mib=pod.memory_mib,
            gpu_models=pod.gpu_spec,
        )
    return Request(cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib, gpu_models=pod.gpu_spec)


def build_node(trace_node: TraceNode) -> Node:
    gpus = tuple(
        Gpu(
            index=index,
            uuid=f"{trace_node.name}-gpu{index}",
            model=trace_node.model,
            memory_mib=NOMINAL_GPU_MEMORY_MIB,
            sharing=Sharing.MPS,
        )
        for index in range(trace_node.gpus)
    )
    return Node(
        name=trace_node.name, cpu_milli=trace_node.cpu_milli, memory_mib=trace_node.memory_mib, gpus=gpus
    )


def pod_typical_workload(pods: Sequence[TracePod]) -> Workload:
    """The paper's typical workload: classes (cpu, gpu_milli, num_gpu, gpu_spec) counted on the ORIGINAL list."""
    return typical_workload(TaskClass(p.cpu_milli, p.gpu_milli, p.num_gpu, p.gpu_spec) for p in pods)


def inflated_workload(pods: Sequence[TracePod], capacity_milli: int, rng: random.Random) -> list[TracePod]:
    """Every pod once in shuffled order, then pods drawn with replacement until 1.3 x capacity is requested."""
    order = list(pods)
    rng.shuffle(order)
    requested = sum(pod.gpu_milli_total for pod in order)
    target = INFLATION * capacity_milli
    while requested < target:
        pod = pods[rng.randrange(len(pods))]
        order.append(pod)
        requested += pod.gpu_milli_total
    return order


def _round_half_up(value: float) -> int:
    return math.floor(value + 0.5)


def _apply(node: Node, request: Request, assignments, cpu: tuple[int, int], *, track_classes: bool) -> Node:
    gpus = list(node.gpus)
    for assignment in assignments:
        gpu = gpus[assignment.gpu_index]
        gpus[assignment.gpu_index] = replace(
            gpu,
            allocated_compute_milli=gpu.allocated_compute_milli + assignment.compute_milli,
            allocated_memory_mib=gpu.allocated_memory_mib + assignment.memory_mib,
            holders=gpu.holders + 1,
        )
    labels = node.labels
    # GpuClustering reads which GPU-request classes a node runs; other policies do not, and an extra label would
    # only split the engine's cache of identical nodes.
    tag = request_class_tag(request) if track_classes else None
    if tag is not None:
        classes = set(filter(None, labels.get(CLASSES_LABEL, "").split(",")))
        if tag not in classes:
            labels = {**labels, CLASSES_LABEL: ",".join(sorted(classes | {tag}))}
    return replace(
        node,
        gpus=tuple(gpus),
        allocated_cpu_milli=node.allocated_cpu_milli + cpu[0],
        allocated_memory_mib=node.allocated_memory_mib + cpu[1],
        labels=labels,
    )


def _gpu_milli_of(node: Node) -> tuple[int, ...]:
    return tuple(WHOLE_GPU_MILLI - gpu.allocated_compute_milli for gpu in node.gpus)


def run_static_seed(
    trace_nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    *,
    profile: Profile,
    seed: int,
    run_cycle: RunCycle | None = None,
    workload: Workload | None = None,
    on_pod: Callable[[], None] | None = None,
) -> SeedResult:
    """One run of the protocol: inflate and shuffle with `seed`, fix a random node order, one attempt per pod."""
    if run_cycle is None:
        run_cycle = production_cycle
    started = time.perf_counter()
    rng = random.Random(seed)
    capacity_milli = sum(node.gpus for node in trace_nodes) * WHOLE_GPU_MILLI
    if capacity_milli == 0:
        raise ValueError("the cluster has no GPU")
    arrivals = inflated_workload(pods, capacity_milli, rng)
    # The run's fixed node order: ties between equally scored nodes go to the first in it.
    order = list(trace_nodes)
    rng.shuffle(order)
    nodes = [build_node(node) for node in order]
    position_of = {node.name: position for position, node in enumerate(nodes)}
    if workload is None:
        workload = pod_typical_workload(pods)
    workload_requests = workload_as_requests(workload)

    frag_memo: dict[tuple, float] = {}

    def node_frag(node: Node) -> float:
        key = (node.gpus[0].model if node.gpus else "", node.free_cpu_milli, _gpu_milli_of(node))
        value = frag_memo.get(key)
        if value is None:
            value = fragmentation_milli(key[1], key[2], key[0], workload)
            frag_memo[key] = value
        return value

    track_classes = any(name == "gpuclustering" for name, _ in profile.node_scores)
    offered = tuple(nodes)
    node_frags = [node_frag(node) for node in nodes]
    cluster_frag = sum(node_frags)
    requested_milli = 0
    allocated_milli = 0
    placed = failed = 0
    outcomes: list[tuple[str, str | None, tuple[int, ...]]] = []
    alloc_sums: dict[int, list[float]] = {}
    frag_sums: dict[int, list[float]] = {}
    request_of: dict[tuple, Request] = {}
    for number, pod in enumerate(arrivals):
        key = pod.class_key + (pod.memory_mib,)
        request = request_of.get(key)
        if request is None:
            request = request_of[key] = pod_request(pod)
        job = Job(id=f"{pod.name}#{number}", team="openb", request=request)
        snapshot = Snapshot(
            now=0.0,
            nodes=offered,
            pending=(job,),
            workload=workload_requests,
            seed=seed * 1_000_003 + number,
        )
        decisions = run_cycle(snapshot, profile)
        requested_milli += pod.gpu_milli_total
        placement = decisions.placements[0] if decisions.placements else None
        if placement is None:
            failed += 1
            outcomes.append((pod.name, None, ()))
        else:
            placed += 1
            if placement.cpu:
                (node_name, cpu), *_ = placement.cpu.items()
            else:
                node_name = placement.assignments[0].node
                cpu = (request.cpu_milli, request.memory_mib)
            position = position_of[node_name]
            outcomes.append((pod.name, node_name, tuple(a.gpu_index for a in placement.assignments)))
            new_node = _apply(
                nodes[position], request, placement.assignments, cpu, track_classes=track_classes
            )
            nodes[position] = new_node
            # The engine keeps its node index between cycles and re-reads only the node objects that changed.
            offered = tuple(nodes)
            allocated_milli += sum(assignment.compute_milli for assignment in placement.assignments)
            new_frag = node_frag(new_node)
            cluster_frag += new_frag - node_frags[position]
            node_frags[position] = new_frag
        arrival = _round_half_up(100.0 * requested_milli / capacity_milli)
        entry = alloc_sums.setdefault(arrival, [0.0, 0])
        entry[0] += 100.0 * allocated_milli / capacity_milli
        entry[1] += 1
        frag_entry = frag_sums.setdefault(arrival, [0.0, 0])
        frag_entry[0] += 100.0 * cluster_frag / capacity_milli
        frag_entry[1] += 1
        if on_pod is not None:
            on_pod()
    alloc_curve = {pct: total / count for pct, (total, count) in sorted(alloc_sums.items())}
    frag_curve = {pct: total / count for pct, (total, count) in sorted(frag_sums.items())}
    return SeedResult(
        seed=seed,
        unallocated_pct_at_100=100.0 - _curve_at(alloc_curve, 100),
        frag_pct_at_90=_curve_at(frag_curve, FRAG_AT_ARRIVAL_PCT),
        alloc_curve=alloc_curve,
        frag_curve=frag_curve,
        pods=len(arrivals),
        placed=placed,
        failed=failed,
        runtime_s=time.perf_counter() - started,
        node_order=tuple(node.name for node in order),
        outcomes=tuple(outcomes),
    )


def _curve_at(curve: dict[int, float], pct: int) -> float:
    """The curve at `pct`; if no event rounded to it (a single huge pod can jump over it), the last one before."""
    if pct in curve:
        return curve[pct]
    before = [p for p in curve if p < pct]
    if not before:
        raise ValueError(f"the workload never reached {pct}% of capacity")
    return curve[max(before)]


def run_static(
    trace_nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    *,
    profile: Profile,
    seeds: Sequence[int],
    run_cycle: RunCycle | None = None,
    on_pod: Callable[[], None] | None = None,
) -> StaticReport:
    """The protocol over several seeds; the typical workload is learned once from the original pod list."""
    started = time.perf_counter()
    workload = pod_typical_workload(pods)
    results = tuple(
        run_static_seed(
            trace_nodes,
            pods,
            profile=profile,
            seed=seed,
            run_cycle=run_cycle,
            workload=workload,
            on_pod=on_pod,
        )
        for seed in seeds
    )
    return StaticReport(
        policy=profile.name,
        nodes=len(trace_nodes),
        gpus=sum(node.gpus for node in trace_nodes),
        original_pods=len(pods),
        seeds=results,
        runtime_s=time.perf_counter() - started,
        typical_classes=len(workload),
    )


def expected_pods(pods: Sequence[TracePod], capacity_milli: int) -> int:
    """A close estimate of the inflated workload's length, for progress bars."""
    mean_milli = statistics.fmean(pod.gpu_milli_total for pod in pods) or 1.0
    requested = sum(pod.gpu_milli_total for pod in pods)
    return len(pods) + max(0, math.ceil((INFLATION * capacity_milli - requested) / mean_milli))


__all__ = [
    "SeedResult",
    "StaticReport",
    "expected_pods",
    "inflated_workload",
    "pod_request",
    "pod_typical_workload",
    "run_static",
    "run_static_seed",
]
