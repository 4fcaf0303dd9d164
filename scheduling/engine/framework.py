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
    """Refuses a job before allocation (`admit`). Optional hooks, looked up with getattr:

    - `admit_charge(ctx, job, (memory_mib, compute_milli)) -> Status | None` and
      `borrowed(ctx, job, charge) -> bool`: the exact charge of a placement, all models together;
    - `restricted_teams(ctx) -> frozenset[str]`, `restrict_models(ctx, job) -> ModelRestriction | None`,
      `admit_assignments(ctx, job, assignments) -> Status | None` and
      `borrowed_assignments(ctx, job, assignments) -> bool`: per-GPU-model rules. `restricted_teams` is asked
      once per cycle, before anything is placed, and the other three only for jobs of the teams it names (of any
      plugin defining both it and `restrict_models`); such a job is placed only on the models `restrict_models`
      allows (see docs/engine.md, "Quotas")."""

    NAME: str

    def admit(self, ctx: CycleContext, job: Job) -> Status | None: ...


@dataclass(frozen=True, slots=True)
class ModelRestriction:
    """GPU models a job may not use now, as an admit plugin's `restrict_models` says: the engine narrows the job's
    allowed models to `allowed` (empty: none is left, and the job waits with `status`) and names `status` in the
    job's pending reason. A narrowed request is a request of its own to the node index, so cached filter and
    score verdicts stay keyed by what they depend on."""

    allowed: tuple[str, ...]
    status: Status


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
    admit: tuple[str, ...] = ("quota", "modelquota")
    filters: tuple[str, ...] = ("fits",)
    node_scores: tuple[tuple[str, float], ...] = (("binpack", 1.0),)
    gpu_scores: tuple[tuple[str, float], ...] = (("binpack", 1.0),)
    actions: tuple[str, ...] = ("admit", "allocate", "backfill", "reclaim", "preempt")
    params: Mapping[str, Any] = field(default_factory=_empty)
