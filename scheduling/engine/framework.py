"""Extension points and profiles, in the shape of kube-scheduler's framework.

A plugin is one class in one module under `plugins/`, with a `NAME`; `plugins.REGISTRY` maps names to classes.
Each hook it may implement is a `Protocol` here; `hooks.py` checks plugin classes against them.
A `Profile` names which plugins run at each extension point, with weights for scores.
Scores are plain numbers, higher is better; a profile's score for a candidate is the weighted sum.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from scheduling.engine.types import Assignment, Gpu, Job, Node, Snapshot, Status, _empty

# Parameters every profile understands (docs/engine.md explains each); a profile overrides what it needs.
DEFAULT_PARAMS = MappingProxyType(
    {
        "timeslice_oversubscription": 4.0,  # time-sliced cards hand out up to 4 cards' worth of compute shares
        "age_boost_interval_s": 3600.0,  # one queue-priority level per hour waited ...
        "age_boost_max": 10,  # ... at most ten levels
        "fairshare_half_life_s": 7 * 24 * 3600.0,
        "reservations_max": 2,  # the first blocked jobs that get a reservation
        "reservations_within_max": 8,  # ... and the first blocked jobs within their team's guarantee besides
        "reservation_min_priority": 0,
        "reserve_unknown_start": True,  # reserve even when no running job's end is known (start unknown)
        "reservation_candidates": 32,  # nodes examined for such a reservation (those with the most room)
        "reservation_switch_s": 600.0,  # a kept reservation moves only for a start this much sooner (or 1/4 wait)
        "estimate_starts": True,  # project an estimated start for every pending job from declared runtimes
        "min_runtime_s": 300.0,  # younger jobs are never preempted
        "reclaim_min_runtime_s": 0.0,  # borrowed work is reclaimable at once: the guarantee comes back in its grace
        "preempt_max_attempts": 16,  # evicting jobs considered per cycle (each may scan every node)
        "reclaim_max_attempts": 16,
        "share_max_attempts": 8,  # borrowing jobs that may take borrowed work from teams borrowing more per weight
        "share_min_runtime_s": 1800.0,  # ... only work that has run this long (sharing by weight is not urgent)
        "explain": True,  # compute reason sentences for pending jobs
        "evictions_per_hour_max": 2,  # a job evicted this often in the last hour is not evicted again
        "move_max_attempts": 4,  # blocked jobs that may move work to make room, per cycle
        "moves_per_job_max": 16,  # jobs one of them may move
    }
)


@dataclass(slots=True)
class CycleContext:
    """What plugins may read during one cycle. `cache` lives for the cycle only."""

    snapshot: Snapshot
    profile: Profile
    rng: random.Random
    cache: dict[Any, Any] = field(default_factory=dict)

    def param(self, name: str, default: Any = None) -> Any:
        return self.profile.params.get(name, default)


# -- extension points ------------------------------------------------------------------------------------------
# Every hook the engine calls is a method of one of these protocols. `hooks.check_plugin_class` holds a plugin
# class to them when it is registered (a public method that is no hook, or a hook with the wrong arguments, is
# refused) and `hooks.check_extension_point` when a profile names it (it must implement that point's protocol).
# The engine sorts a profile's plugins by the protocols they implement once, when the profile is loaded.


@runtime_checkable
class QueueOrderPlugin(Protocol):
    """Queue order (`queue_order`): jobs are sorted by the concatenated keys of the profile's plugins."""

    NAME: str

    def sort_key(self, ctx: CycleContext, job: Job) -> tuple: ...


@runtime_checkable
class AdmitPlugin(Protocol):
    """Refuses a job before allocation (`admit`). An admit plugin may implement the optional hooks below as well:
    `AdmitChargeHook` and `BorrowedHook` (the exact charge of a placement, all models together), and
    `ModelRestrictionHook`, `ModelAdmitHook` and `ModelBorrowedHook` (per-GPU-model rules; see docs/engine.md,
    "Quotas")."""

    NAME: str

    def admit(self, ctx: CycleContext, job: Job) -> Status | None: ...


@runtime_checkable
class AdmitChargeHook(Protocol):
    """The exact charge of a placement, `(memory_mib, compute_milli)` all models together: None to admit it."""

    def admit_charge(self, ctx: CycleContext, job: Job, charge: tuple[int, int]) -> Status | None: ...


@runtime_checkable
class BorrowedHook(Protocol):
    """True when a placement at this exact charge is beyond the team's guarantee (reclaimable)."""

    def borrowed(self, ctx: CycleContext, job: Job, charge: tuple[int, int]) -> bool: ...


@runtime_checkable
class ModelRestrictionHook(Protocol):
    """Per-GPU-model rules. `restricted_teams` is asked once per cycle, before anything is placed; the engine asks
    `restrict_models` (and the plugins' `ModelAdmitHook` / `ModelBorrowedHook`) only for jobs of the teams it
    names, and places such a job only on the models `restrict_models` allows. A plugin implements both or
    neither."""

    def restricted_teams(self, ctx: CycleContext) -> frozenset[str]: ...

    def restrict_models(self, ctx: CycleContext, job: Job) -> ModelRestriction | None: ...


@runtime_checkable
class ModelAdmitHook(Protocol):
    """The exact check of a placement model by model: None to admit it."""

    def admit_assignments(
        self, ctx: CycleContext, job: Job, assignments: tuple[Assignment, ...]
    ) -> Status | None: ...


@runtime_checkable
class ModelBorrowedHook(Protocol):
    """True when a placement is beyond a per-model guarantee on a model it lands on (reclaimable)."""

    def borrowed_assignments(
        self, ctx: CycleContext, job: Job, assignments: tuple[Assignment, ...]
    ) -> bool: ...


@dataclass(frozen=True, slots=True)
class ModelRestriction:
    """GPU models a job may not use now, as an admit plugin's `restrict_models` says: the engine narrows the job's
    allowed models to `allowed` (empty: none is left, and the job waits with `status`) and names `status` in the
    job's pending reason. A narrowed request is a request of its own to the node index, so cached filter and
    score verdicts stay keyed by what they depend on."""

    allowed: tuple[str, ...]
    status: Status


@runtime_checkable
class FilterPlugin(Protocol):
    """None when the node can host the job (ignoring other jobs' reservations), else why not.

    Filters and node scores are cached per (request, node shape) across cycles unless the class sets
    `CACHEABLE = False` (see docs/engine.md, "Adding a plugin"). A filter that sets `NODE_FIT = True` says its
    verdict is the engine's own node-fit rule (`resources.node_fits`), which the node index always applies:
    the engine then does not call it a second time."""

    NAME: str

    def filter(self, ctx: CycleContext, job: Job, node: Node) -> Status | None: ...


@runtime_checkable
class NodeScorePlugin(Protocol):
    """Higher is better."""

    NAME: str

    def score_node(self, ctx: CycleContext, job: Job, node: Node) -> float: ...


@runtime_checkable
class BatchNodeScorer(Protocol):
    """A non-cacheable node score may score many nodes in one call; the engine then uses it instead of one
    `score_node` call per node."""

    def score_nodes(self, ctx: CycleContext, job: Job, nodes: Sequence[Node]) -> Sequence[float]: ...


@runtime_checkable
class GpuScorePlugin(Protocol):
    """Ranks the GPUs of the chosen node for a slice request (the highest-scoring feasible GPU wins)."""

    NAME: str

    def score_gpu(self, ctx: CycleContext, job: Job, node: Node, gpu: Gpu) -> float: ...


@runtime_checkable
class CardChooser(Protocol):
    """Chooses the whole cards a whole-GPU job takes on its node (card positions in `node.gpus`, or None when
    the node cannot host it). The first GPU-score plugin of a profile implementing it replaces the engine's
    default (the lowest-index free cards that meet the request's topology)."""

    def choose_cards(self, ctx: CycleContext, job: Job, node: Node) -> tuple[int, ...] | None: ...


@dataclass(frozen=True, slots=True)
class Profile:
    """Which plugins run at each extension point. Unknown names fail when the profile is built."""

    name: str
    queue_order: tuple[str, ...] = ("guarantee", "priority", "fairshare", "fifo")
    admit: tuple[str, ...] = ("quota", "modelquota")
    filters: tuple[str, ...] = ("fits",)
    node_scores: tuple[tuple[str, float], ...] = (("binpack", 1.0),)
    gpu_scores: tuple[tuple[str, float], ...] = (("binpack", 1.0),)
    actions: tuple[str, ...] = ("admit", "allocate", "backfill", "reclaim", "preempt")
    params: Mapping[str, Any] = field(default_factory=_empty)
