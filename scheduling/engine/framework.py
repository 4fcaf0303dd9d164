"""Extension points and profiles, in the shape of kube-scheduler's framework.

A plugin is one class in one module under `plugins/`, with a `NAME`; `plugins.REGISTRY` maps names to classes.
A `Profile` names which plugins run at each extension point, with weights for scores.
Scores are plain numbers, higher is better; a profile's score for a candidate is the weighted sum.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from scheduling.engine.types import Gpu, Job, Node, Snapshot, Status, _empty


@dataclass(slots=True)
class CycleContext:
    """What plugins may read during one cycle. `cache` lives for the cycle only."""

    snapshot: Snapshot
    profile: Profile
    rng: random.Random
    cache: dict[Any, Any] = field(default_factory=dict)

    def param(self, name: str, default: Any = None) -> Any:
        return self.profile.params.get(name, default)


class QueueOrderPlugin(Protocol):
    NAME: str

    def sort_key(self, ctx: CycleContext, job: Job) -> tuple: ...


class AdmitPlugin(Protocol):
    NAME: str

    def admit(self, ctx: CycleContext, job: Job) -> Status | None: ...


class FilterPlugin(Protocol):
    """None when the node can host the job (ignoring other jobs' reservations), else why not.

    Filters and node scores are cached per (request, node shape) across cycles unless the class sets
    `CACHEABLE = False` (see docs/engine.md, "Adding a plugin")."""

    NAME: str

    def filter(self, ctx: CycleContext, job: Job, node: Node) -> Status | None: ...


class NodeScorePlugin(Protocol):
    """Higher is better. A non-cacheable plugin may also define `score_nodes(ctx, job, nodes) -> Sequence[float]`
    to score many nodes in one call; the engine then uses it instead of one `score_node` call per node."""

    NAME: str

    def score_node(self, ctx: CycleContext, job: Job, node: Node) -> float: ...


class GpuScorePlugin(Protocol):
    """Ranks the GPUs of the chosen node for a slice request (the highest-scoring feasible GPU wins)."""

    NAME: str

    def score_gpu(self, ctx: CycleContext, job: Job, node: Node, gpu: Gpu) -> float: ...


@dataclass(frozen=True, slots=True)
class Profile:
    """Which plugins run at each extension point. Unknown names fail when the profile is built."""

    name: str
    queue_order: tuple[str, ...] = ("priority", "fairshare", "fifo")
    admit: tuple[str, ...] = ("quota",)
    filters: tuple[str, ...] = ("fits",)
    node_scores: tuple[tuple[str, float], ...] = (("binpack", 1.0),)
    gpu_scores: tuple[tuple[str, float], ...] = (("binpack", 1.0),)
    actions: tuple[str, ...] = ("admit", "allocate", "backfill", "reclaim", "preempt")
    params: Mapping[str, Any] = field(default_factory=_empty)
