"""The engine's vocabulary: an immutable snapshot of the cluster and queue, and the decisions a cycle returns.

Everything here is a frozen dataclass so a snapshot can be shared by the production cycle, the simulator and
the benchmarks without copying, and so a cycle can never mutate its input. Units are in the names:
memory in MiB, compute in milli-GPU (1000 = one whole card), CPU in millicores, times in seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType

WHOLE_GPU_MILLI = 1000
EMPTY: Mapping = MappingProxyType({})


def _empty() -> Mapping:
    return EMPTY


class Sharing(StrEnum):
    EXCLUSIVE = "exclusive"  # whole jobs only
    MPS = "mps"  # slices; compute shares sum <= 100 %, memory sum <= capacity
    TIMESLICE = "timeslice"  # slices; memory sum <= capacity, compute may be oversubscribed
    MIG = "mig"  # slices only in the card's profile sizes


class NodeState(StrEnum):
    READY = "ready"
    CORDONED = "cordoned"
    DRAINING = "draining"
    LOST = "lost"


class Health(StrEnum):
    OK = "ok"
    DEGRADED = "degraded"
    FAILED = "failed"


class TopologyNeed(StrEnum):
    NONE = "none"
    NUMA = "numa"  # all GPUs of the job on one NUMA node
    NVLINK = "nvlink"  # all GPUs of the job pairwise NVLink-connected


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    model: str
    memory_mib: int
    compute_capability: tuple[int, int] = (8, 0)
    numa_node: int = 0
    sharing: Sharing = Sharing.EXCLUSIVE
    health: Health = Health.OK
    # MIG: the memory sizes (MiB) of the card's instance profiles; a slice must use one of them.
    mig_profiles_mib: tuple[int, ...] = ()
    # The ledger at snapshot time.
    allocated_memory_mib: int = 0
    allocated_compute_milli: int = 0
    holders: int = 0  # jobs holding a slice or the whole card

    @property
    def free_memory_mib(self) -> int:
        return self.memory_mib - self.allocated_memory_mib

    @property
    def free_compute_milli(self) -> int:
        return WHOLE_GPU_MILLI - self.allocated_compute_milli

    @property
    def is_idle(self) -> bool:
        return self.holders == 0


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[Gpu, ...] = ()
    state: NodeState = NodeState.READY
    allocated_cpu_milli: int = 0
    allocated_memory_mib: int = 0
    # Unordered pairs (i, j), i < j, of GPU indexes joined by NVLink.
    nvlink: frozenset[tuple[int, int]] = frozenset()
    labels: Mapping[str, str] = field(default_factory=_empty)

    @property
    def free_cpu_milli(self) -> int:
        return self.cpu_milli - self.allocated_cpu_milli

    @property
    def free_memory_mib(self) -> int:
        return self.memory_mib - self.allocated_memory_mib

    @property
    def schedulable(self) -> bool:
        return self.state is NodeState.READY


@dataclass(frozen=True, slots=True)
class Request:
    """What one job asks for. Either `gpus` whole GPUs per node, or (gpus == 0) one slice of one GPU."""

    gpus: int = 0  # whole GPUs on each node
    nodes: int = 1  # gang: this many nodes, all or nothing
    gpu_memory_mib: int = 0  # slice: memory on one GPU
    gpu_compute_milli: int = 0  # slice: compute share of one GPU
    gpu_models: tuple[str, ...] = ()  # allowed models; empty = any
    min_gpu_memory_mib: int = 0  # the card's total memory must be at least this
    min_compute_capability: tuple[int, int] = (0, 0)
    topology: TopologyNeed = TopologyNeed.NONE
    cpu_milli: int = 0  # per node
    memory_mib: int = 0  # host memory per node
    # Requests key many per-cycle caches: the hash is computed once (and again after unpickling, as string
    # hashes differ between processes).
    _hash: int = field(init=False, repr=False, compare=False, hash=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(self._values()))

    def _values(self) -> tuple:
        return (
            self.gpus,
            self.nodes,
            self.gpu_memory_mib,
            self.gpu_compute_milli,
            self.gpu_models,
            self.min_gpu_memory_mib,
            self.min_compute_capability,
            self.topology,
            self.cpu_milli,
            self.memory_mib,
        )

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        return (Request, self._values())

    @property
    def is_slice(self) -> bool:
        return self.gpus == 0 and (self.gpu_memory_mib > 0 or self.gpu_compute_milli > 0)

    @property
    def uses_gpu(self) -> bool:
        return self.gpus > 0 or self.is_slice


@dataclass(frozen=True, slots=True)
class Assignment:
    """One GPU (whole or a slice of it) held by a job. A whole GPU holds its full memory and 1000 milli."""

    node: str
    gpu_index: int
    memory_mib: int
    compute_milli: int


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    team: str
    request: Request
    priority: int = 0
    preemptible: bool = True
    grace_s: float = 30.0
    submit_time: float = 0.0
    max_runtime_s: float | None = None
    # Running jobs only: where they run, since when, and whether they run on borrowed capacity.
    assignments: tuple[Assignment, ...] = ()
    start_time: float | None = None
    borrowed: bool = False
    cpu_assignments: Mapping[str, tuple[int, int]] = field(
        default_factory=_empty
    )  # node -> (cpu_milli, memory_mib)
    # The priority class's name (per-class limits of a team count by it) and how often the job checkpoints
    # (None: an eviction throws away everything it did; eviction prefers victims that lose the least work).
    priority_class: str = ""
    checkpoint_interval_s: float | None = None
    # Pending jobs only: a job being moved (evicted to make room, its new place held for it) is listed pending
    # while it stops; it may not start before this time, and the engine holds its place until then.
    ready_at: float | None = None
    # Running jobs only: how often the job was evicted (reclaimed, preempted, moved) in the last hour. A job
    # evicted `evictions_per_hour_max` times is not evicted again (no thrash).
    recent_evictions: int = 0
    # Pending jobs only: the nodes the job's reservation held at the previous cycle (kept while it still makes
    # sense; the pending reason says why it was dropped).
    reserved_on: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelQuota:
    """A team's share of one GPU model (`model` as the cards name it, `Gpu.model`). It adds to the team's
    all-models `Quota`, never replaces it: what the team holds on cards of this model must stay within this
    limit and within the all-models one, and work on this model beyond this guarantee is borrowed."""

    model: str
    guaranteed_gpu_memory_mib: int = 0
    limit_gpu_memory_mib: int | None = None  # None = no limit
    guaranteed_compute_milli: int = 0
    limit_compute_milli: int | None = None


@dataclass(frozen=True, slots=True)
class ClassLimit:
    """How much compute (milli-GPU) a team may hold at one priority class, all its jobs of that class together."""

    priority_class: str
    limit_compute_milli: int


@dataclass(frozen=True, slots=True)
class Quota:
    """A team's share. Compute is in milli-GPU (whole-GPU equivalents x 1000).

    The fields are the all-models quota; `per_model` holds the team's per-GPU-model rows (at most one per
    model). A team with only per-model rows has a `Quota` with the all-models defaults: no guarantee (its GPU
    work counts as borrowed, as for a team with no quota) and no limit."""

    team: str
    guaranteed_gpu_memory_mib: int = 0
    limit_gpu_memory_mib: int | None = None  # None = no limit
    guaranteed_compute_milli: int = 0
    limit_compute_milli: int | None = None
    weight: float = 1.0
    per_model: tuple[ModelQuota, ...] = ()
    # Per priority class: the most compute (milli-GPU) the team may hold at that class (Slurm's QOS MaxTRES).
    class_limits: tuple[ClassLimit, ...] = ()

    def class_limit(self, priority_class: str) -> int | None:
        """The team's compute limit at this priority class (None: no per-class limit)."""
        for row in self.class_limits:
            if row.priority_class == priority_class:
                return row.limit_compute_milli
        return None

    def for_model(self, model: str) -> ModelQuota | None:
        """The per-model row for `model`, if the team has one (a linear scan: teams have a handful)."""
        for row in self.per_model:
            if row.model == model:
                return row
        return None


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: tuple[Node, ...]
    running: tuple[Job, ...] = ()
    pending: tuple[Job, ...] = ()
    quotas: Mapping[str, Quota] = field(default_factory=_empty)
    # Decayed past usage per team (GPU-milli-seconds), the fair-share input.
    usage: Mapping[str, float] = field(default_factory=_empty)
    # The typical workload (request, popularity) learned from the queue and recent history; FGD-style scorers use it.
    workload: tuple[tuple[Request, float], ...] = ()
    seed: int = 0
    # The pending jobs whose answers are wanted (a what-if asks about a few): when given, the decisions' pending
    # list holds only these, and reasons are worked out only as far down the queue as the last of them.
    # Placements, evictions and reservations are decided as always.
    focus: frozenset[str] = frozenset()

    def with_nodes(self, nodes: tuple[Node, ...]) -> Snapshot:
        return replace(self, nodes=nodes)


@dataclass(frozen=True, slots=True)
class Status:
    """Why a job is where it is. `reason` is a sentence shown verbatim to researchers."""

    code: str
    reason: str


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: str
    assignments: tuple[Assignment, ...]
    borrowed: bool = False  # beyond the team's guarantee: reclaimable
    cpu: Mapping[str, tuple[int, int]] = field(default_factory=_empty)  # node -> (cpu_milli, memory_mib)


@dataclass(frozen=True, slots=True)
class Eviction:
    job_id: str
    preemptor_id: str
    code: str  # "preempted" (priority), "reclaimed" (borrowed capacity) or "moved" (restarts elsewhere)
    grace_s: float
    # A move: the nodes the job restarts on (held for it until its grace ends) and why it moves, as a sentence.
    to_nodes: tuple[str, ...] = ()
    why: str = ""


@dataclass(frozen=True, slots=True)
class Pending:
    job_id: str
    status: Status
    position: int  # 1-based place in the queue order
    estimated_start: float | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: str
    assignments: tuple[Assignment, ...]
    estimated_start: float | None  # None: the running jobs it waits for declare no max runtime
    # The running job whose end (or preemption, `waits_how`) frees the last cards it needs ("" when none: the
    # cards are free, or a moved job's new place).
    waits_for: str = ""
    waits_how: str = ""  # "ends" or "can be preempted"


@dataclass(frozen=True, slots=True)
class Decisions:
    placements: tuple[Placement, ...] = ()
    evictions: tuple[Eviction, ...] = ()
    pending: tuple[Pending, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    # The running and placed jobs on borrowed capacity once these decisions are applied (their team holds more
    # than its guarantee and they are its last work in guarantee order): the label follows the team's standing.
    # For a snapshot with a `focus`, only the jobs of teams that placed something this cycle.
    borrowed: frozenset[str] = frozenset()
