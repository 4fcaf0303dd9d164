"""What a simulator scenario is: a cluster of node groups, teams with quotas, job streams and the policies to
compare (read from YAML by scheduling/sim/scenario.py), and the error that names the offending field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from scheduling.engine.types import Node, Quota, Sharing
from scheduling.sim.des import SimConfig
from scheduling.sim.synthetic import Stream, generate, with_whole_cards
from scheduling.sim.workload import NodeFailure, SimJob


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message starts with the offending field's path."""


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    memory_mib: int
    compute_capability: tuple[int, int] = (8, 0)
    mig_profiles_mib: tuple[int, ...] = ()


# Card memory as the driver reports it (MiB). Scenarios may add their own under `models:`.
MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("A100-40GB", 40_960, (8, 0), (4_864, 9_856, 19_968, 40_960)),
        GpuModel("A100-80GB", 81_920, (8, 0), (9_856, 19_968, 40_192, 81_920)),
        GpuModel("H100-80GB", 81_559, (9, 0), (10_240, 20_480, 40_448, 81_559)),
        GpuModel("H200", 143_771, (9, 0), (17_920, 35_840, 71_680, 143_771)),
        GpuModel("L40S", 46_068, (8, 9)),
        GpuModel("L4", 23_034, (8, 9)),
        GpuModel("A10", 23_028, (8, 6)),
        GpuModel("T4", 15_360, (7, 5)),
        GpuModel("V100-16GB", 16_384, (7, 0)),
        GpuModel("V100-32GB", 32_768, (7, 0)),
    )
}


@dataclass(frozen=True, slots=True)
class NodeGroup:
    name: str
    count: int
    model: str
    gpus: int
    memory_mib: int
    cpu_milli: int
    nvlink: str  # all | pairs | none
    sharing: Sharing
    numa_nodes: int = 2


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """One way of running the cluster: an engine profile plus how the cluster is offered to it."""

    name: str
    profile: Any  # a profile name, or a mapping {base: NAME, <Profile fields>}
    whole_cards: bool = False  # every slice request becomes a whole card (no slicing)
    sharing: Sharing | None = None  # force every GPU into this sharing mode
    description: str = ""
    idle_reclaim: bool = (
        True  # idle sessions stopped at their class's idle_timeout (false: they hold their cards)
    )


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    groups: tuple[NodeGroup, ...]
    nodes: tuple[Node, ...]
    quotas: Mapping[str, Quota]
    streams: tuple[Stream, ...]
    policies: tuple[PolicySpec, ...]
    config: SimConfig
    failures: tuple[NodeFailure, ...] = ()
    models: Mapping[str, GpuModel] = field(default_factory=dict)
    source: str = ""

    def jobs(self, *, seed: int | None = None) -> list[SimJob]:
        return generate(self.streams, self.config.seed if seed is None else seed)

    def nodes_for(self, policy: PolicySpec) -> tuple[Node, ...]:
        if policy.sharing is None:
            return self.nodes
        return tuple(
            replace(n, gpus=tuple(replace(g, sharing=policy.sharing) for g in n.gpus)) for n in self.nodes
        )

    def jobs_for(self, policy: PolicySpec, *, seed: int | None = None) -> list[SimJob]:
        jobs = self.jobs(seed=seed)
        return [with_whole_cards(j) for j in jobs] if policy.whole_cards else jobs
