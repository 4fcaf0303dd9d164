"""The inventory as the engine sees it: GPU and node rows converted to `scheduling.engine.types`.

The scheduling cycle's snapshot and submit validation both convert through here, so they agree on what a card is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal

from scheduling.engine import types as eng
from scheduling.inventory.models import Gpu, Node


def capability(value: Decimal | str | float) -> tuple[int, int]:
    """A compute capability as the engine compares it: Decimal("8.6") -> (8, 6)."""
    major, _, minor = str(value).partition(".")
    return int(major or 0), int((minor or "0")[:1])


def engine_gpu(g: Gpu, *, holders: int = 0) -> eng.Gpu:
    """One GPU row (its `model` loaded) with its ledger; `holders` counts the jobs holding part of it."""
    return eng.Gpu(
        index=g.index,
        uuid=g.uuid,
        model=g.model.name,
        memory_mib=g.memory_mib,
        compute_capability=capability(g.model.compute_capability),
        numa_node=g.numa_node,
        sharing=eng.Sharing(g.sharing_mode),
        health=eng.Health(g.health),
        mig_profiles_mib=tuple(int(p["memory_mib"]) for p in g.model.mig_profiles or ()),
        allocated_memory_mib=g.allocated_memory_mib,
        allocated_compute_milli=g.allocated_compute_pct * 10,
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
    labels: Mapping = n.labels or {}
    return eng.Node(
        name=n.name,
        cpu_milli=n.cpu_milli,
        memory_mib=n.memory_mib,
        gpus=tuple(gpus),
        state=eng.NodeState(n.state),
        allocated_cpu_milli=min(n.cpu_milli, allocated_cpu_milli),
        allocated_memory_mib=min(n.memory_mib, allocated_memory_mib),
        nvlink=frozenset(nvlink),
        labels={str(k): str(v) for k, v in labels.items()},
    )
