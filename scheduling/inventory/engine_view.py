"""The inventory as the engine sees it: GPU and node rows converted to `scheduling.engine.types`.

The scheduling cycle's snapshot and submit validation both convert through here, so they agree on what a card is:
model instances through `engine_gpu` / `engine_node`, plain row fields (the snapshot's `values_list` rows)
through `gpu_of` / `node_of`, which the former call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal

from scheduling.engine import types as eng
from scheduling.inventory.models import Gpu, Node

# What a GPU model row gives each of its cards: (name, compute capability, MIG profile sizes in MiB).
GpuModelView = tuple[str, tuple[int, int], tuple[int, ...]]


def capability(value: Decimal | str | float) -> tuple[int, int]:
    """A compute capability as the engine compares it: Decimal("8.6") -> (8, 6)."""
    major, _, minor = str(value).partition(".")
    return int(major or 0), int((minor or "0")[:1])


def engine_gpu(g: Gpu, *, holders: int = 0) -> eng.Gpu:
    """One GPU row (its `model` loaded) with its ledger; `holders` counts the jobs holding part of it."""
    return gpu_of(
        index=g.index,
        uuid=g.uuid,
        model=model_of(
            name=g.model.name,
            compute_capability=g.model.compute_capability,
            mig_profiles=g.model.mig_profiles,
        ),
        memory_mib=g.memory_mib,
        numa_node=g.numa_node,
        sharing_mode=g.sharing_mode,
        health=g.health,
        allocated_memory_mib=g.allocated_memory_mib,
        allocated_compute_pct=g.allocated_compute_pct,
        holders=holders,
    )


def model_of(*, name: str, compute_capability: Decimal | str, mig_profiles: list | None) -> GpuModelView:
    """What the engine reads of a GPU model row: its name, compute capability and MIG profile sizes (MiB)."""
    return name, capability(compute_capability), tuple(int(p["memory_mib"]) for p in mig_profiles or ())


def gpu_of(
    *,
    index: int,
    uuid: str,
    model: GpuModelView,
    memory_mib: int,
    numa_node: int,
    sharing_mode: str,
    health: str,
    allocated_memory_mib: int,
    allocated_compute_pct: int,
    holders: int = 0,
) -> eng.Gpu:
    """A GPU from its row's fields (a model instance's or a `values_list` row's: both read through here)."""
    model_name, compute_capability, mig_profiles_mib = model
    return eng.Gpu(
        index=index,
        uuid=uuid,
        model=model_name,
        memory_mib=memory_mib,
        compute_capability=compute_capability,
        numa_node=numa_node,
        sharing=eng.Sharing(sharing_mode),
        health=eng.Health(health),
        mig_profiles_mib=mig_profiles_mib,
        allocated_memory_mib=allocated_memory_mib,
        allocated_compute_milli=allocated_compute_pct * 10,
        holders=holders,
    )


def engine_node(
    n: Node,
    *,
    gpus: Iterable[eng.Gpu],
    nvlink: Iterable[tuple[int, int]] = (),
    allocated_cpu_milli: int = 0,
    allocated_memory_mib: int = 0,
) -> eng.Node:
    return node_of(
        name=n.name,
        cpu_milli=n.cpu_milli,
        memory_mib=n.memory_mib,
        state=n.state,
        labels=n.labels,
        gpus=gpus,
        nvlink=nvlink,
        allocated_cpu_milli=allocated_cpu_milli,
        allocated_memory_mib=allocated_memory_mib,
    )


def node_of(
    *,
    name: str,
    cpu_milli: int,
    memory_mib: int,
    state: str,
    labels: Mapping | None,
    gpus: Iterable[eng.Gpu],
    nvlink: Iterable[tuple[int, int]] = (),
    allocated_cpu_milli: int = 0,
    allocated_memory_mib: int = 0,
) -> eng.Node:
    """A node from its row's fields, with its GPUs and what the jobs there hold of its CPU and memory."""
    return eng.Node(
        name=name,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpus=tuple(gpus),
        state=eng.NodeState(state),
        allocated_cpu_milli=min(cpu_milli, allocated_cpu_milli),
        allocated_memory_mib=min(memory_mib, allocated_memory_mib),
        nvlink=frozenset(nvlink),
        labels={str(k): str(v) for k, v in (labels or {}).items()},
    )
