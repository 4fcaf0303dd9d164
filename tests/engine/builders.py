"""Build engine clusters, jobs and snapshots from plain dicts, so scenario tests read as tables."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from scheduling.engine.framework import Profile
from scheduling.engine.profiles import get_profile
from scheduling.engine.resources import allocate_on_node
from scheduling.engine.types import (
    Assignment,
    ClassLimit,
    Gpu,
    Health,
    Job,
    ModelQuota,
    Node,
    NodeState,
    Quota,
    Request,
    Sharing,
    Snapshot,
    TopologyNeed,
)

GIB = 1024


def node(
    name: str,
    *,
    gpus: int = 8,
    model: str = "A100",
    memory_gib: int = 80,
    sharing: str | list[str] = "exclusive",
    nvlink: str | list[int] = "all",
    numa: int | None = None,
    cpu: int = 128,
    host_memory_gib: int = 1024,
    state: str = "ready",
    failed: Iterable[int] = (),
    mig_profiles_gib: Iterable[float] = (),
    cc: tuple[int, int] = (8, 0),
) -> Node:
    """A node. `nvlink`: "all" (one NVSwitch island), "none", or island sizes such as [4, 4].
    `numa`: GPUs per NUMA node (default: all on NUMA 0)."""
    modes = sharing if isinstance(sharing, list) else [sharing] * gpus
    failed = set(failed)
    cards = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{name}-{i}",
            model=model,
            memory_mib=memory_gib * GIB,
            compute_capability=cc,
            numa_node=(i // numa) if numa else 0,
            sharing=Sharing(modes[i]),
            health=Health.FAILED if i in failed else Health.OK,
            mig_profiles_mib=tuple(int(p * GIB) for p in mig_profiles_gib),
        )
        for i in range(gpus)
    )
    if nvlink == "all":
        islands = [gpus]
    elif nvlink == "none":
        islands = [1] * gpus
    else:
        islands = list(nvlink)
    links = set()
    start = 0
    for size in islands:
        links |= {(i, j) for i in range(start, start + size) for j in range(i + 1, start + size)}
        start += size
    return Node(
        name=name,
        cpu_milli=cpu * 1000,
        memory_mib=host_memory_gib * GIB,
        gpus=cards,
        state=NodeState(state),
        nvlink=frozenset(links),
    )


def request(
    *,
    gpus: int = 0,
    nodes: int = 1,
    memory_gib: float = 0,
    compute_pct: float = 0,
    models: Iterable[str] = (),
    min_memory_gib: int = 0,
    min_cc: tuple[int, int] = (0, 0),
    topology: str = "none",
    cpu: int = 0,
    host_memory_gib: int = 0,
) -> Request:
    return Request(
        gpus=gpus,
        nodes=nodes,
        gpu_memory_mib=int(memory_gib * GIB),
        gpu_compute_milli=int(compute_pct * 10),
        gpu_models=tuple(models),
        min_gpu_memory_mib=min_memory_gib * GIB,
        min_compute_capability=min_cc,
        topology=TopologyNeed(topology),
        cpu_milli=cpu * 1000,
        memory_mib=host_memory_gib * GIB,
    )


def job(
    id: str,
    *,
    team: str = "t",
    priority: int = 0,
    preemptible: bool = True,
    submit: float = 0.0,
    max_runtime_s: float | None = None,
    grace_s: float = 30.0,
    priority_class: str = "",
    checkpoint_s: float | None = None,
    **req: Any,
) -> Job:
    return Job(
        id=id,
        team=team,
        request=request(**req),
        priority=priority,
        preemptible=preemptible,
        submit_time=submit,
        max_runtime_s=max_runtime_s,
        grace_s=grace_s,
        priority_class=priority_class,
        checkpoint_interval_s=checkpoint_s,
    )


def running(
    base: Job,
    on: Mapping[str, Iterable[int]],
    *,
    nodes: Iterable[Node],
    start: float = 0.0,
    borrowed: bool = False,
) -> Job:
    """A running job holding the given cards: whole cards, or for a slice request its slice of one card."""
    by_name = {n.name: n for n in nodes}
    req = base.request
    assignments = []
    for node_name, cards in on.items():
        for i in cards:
            gpu = by_name[node_name].gpus[i]
            if req.gpus:
                assignments.append(Assignment(node_name, i, gpu.memory_mib, 1000))
            else:
                comp = req.gpu_compute_milli or -(-req.gpu_memory_mib * 1000 // gpu.memory_mib)
                assignments.append(Assignment(node_name, i, req.gpu_memory_mib, comp))
    cpu = {name: (req.cpu_milli, req.memory_mib) for name in on}
    return replace(
        base,
        assignments=tuple(assignments),
        start_time=start,
        borrowed=borrowed,
        cpu_assignments=MappingProxyType(cpu),
    )


def with_ledger(nodes: Iterable[Node], jobs: Iterable[Job]) -> tuple[Node, ...]:
    """The nodes with the running jobs' holdings recorded on them, as a snapshot would show."""
    out = {n.name: n for n in nodes}
    order = list(out)
    for j in jobs:
        per_node: dict[str, list[Assignment]] = {}
        for a in j.assignments:
            per_node.setdefault(a.node, []).append(a)
        for name in set(per_node) | set(j.cpu_assignments):
            cpu, mem = j.cpu_assignments.get(name, (0, 0))
            out[name] = allocate_on_node(out[name], tuple(per_node.get(name, ())), cpu, mem)
    return tuple(out[n] for n in order)


def quota(
    team: str,
    *,
    guaranteed_gib: float = 0,
    limit_gib: float | None = None,
    guaranteed_gpus: float = 0,
    limit_gpus: float | None = None,
    weight: float = 1.0,
    per_model: Iterable[ModelQuota] = (),
    class_limits_gpus: Mapping[str, float] | None = None,
) -> Quota:
    return Quota(
        team=team,
        guaranteed_gpu_memory_mib=int(guaranteed_gib * GIB),
        limit_gpu_memory_mib=None if limit_gib is None else int(limit_gib * GIB),
        guaranteed_compute_milli=int(guaranteed_gpus * 1000),
        limit_compute_milli=None if limit_gpus is None else int(limit_gpus * 1000),
        weight=weight,
        per_model=tuple(per_model),
        class_limits=tuple(
            ClassLimit(name, int(gpus * 1000)) for name, gpus in (class_limits_gpus or {}).items()
        ),
    )


def model_quota(
    model: str,
    *,
    guaranteed_gib: float = 0,
    limit_gib: float | None = None,
    guaranteed_gpus: float = 0,
    limit_gpus: float | None = None,
) -> ModelQuota:
    """A team's row for one GPU model (pass it to `quota(..., per_model=[...])`)."""
    return ModelQuota(
        model=model,
        guaranteed_gpu_memory_mib=int(guaranteed_gib * GIB),
        limit_gpu_memory_mib=None if limit_gib is None else int(limit_gib * GIB),
        guaranteed_compute_milli=int(guaranteed_gpus * 1000),
        limit_compute_milli=None if limit_gpus is None else int(limit_gpus * 1000),
    )


def snapshot(
    nodes: Iterable[Node],
    *,
    pending: Iterable[Job] = (),
    running_jobs: Iterable[Job] = (),
    quotas: Iterable[Quota] = (),
    usage: Mapping[str, float] | None = None,
    now: float = 10_000.0,
    seed: int = 0,
) -> Snapshot:
    running_jobs = tuple(running_jobs)
    return Snapshot(
        now=now,
        nodes=with_ledger(nodes, running_jobs),
        running=running_jobs,
        pending=tuple(pending),
        quotas=MappingProxyType({q.team: q for q in quotas}),
        usage=MappingProxyType(dict(usage or {})),
        seed=seed,
    )


def profile(base: str = "default", *, fields: Mapping[str, Any] | None = None, **params: Any) -> Profile:
    """A named profile with some fields and parameters overridden (a fresh object, so engine caches start cold)."""
    p = get_profile(base)
    return replace(p, **dict(fields or {}), params=MappingProxyType({**p.params, **params}))
