"""Discrete-event simulator: replays jobs through the production scheduling cycle on a virtual clock.

Arrivals, completions, scheduling cycles at a fixed cadence, preemptions with grace periods and lost work since
the last checkpoint, and node failures. Every placement and eviction comes from `scheduling.engine.run_cycle`.
"""

from __future__ import annotations

import heapq
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum

from scheduling.engine import run_cycle
from scheduling.engine.types import (
    WHOLE_GPU_MILLI,
    Assignment,
    Decisions,
    Job,
    Node,
    NodeState,
    Quota,
    Request,
    Sharing,
    Snapshot,
)
from scheduling.sim.guarantees import GuaranteeFigures, GuaranteeTracker
from scheduling.sim.workload import NodeFailure, SimJob

# Anything with this shape: the production `run_cycle`, or a test double inside tests.
Scheduler = Callable[[Snapshot, object], Decisions]


DEFAULT_USAGE_HALF_LIFE_S = 7 * 24 * 3600.0


class SimulationError(RuntimeError):
    """The scheduler returned a decision the cluster cannot honour (a double booking, an unknown job...)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    cycle_interval_s: float = 10.0
    # With jobs pending but nothing changed, re-run the cycle this often anyway (ageing, minimum runtimes).
    idle_recheck_s: float = 300.0
    horizon_s: float | None = None  # metrics window [0, horizon]; None: until the workload drains
    seed: int = 0
    # Decay of the per-team usage fed to fair share; None: the profile's `fairshare_half_life_s` (as the engine
    # reads the usage with that half-life), else a week.
    usage_half_life_s: float | None = None
    workload_window: int = 1000  # recent arrivals that make up the typical workload
    # Random node failures: mean time between failures per node (None: none) and repair time.
    node_mtbf_s: float | None = None
    node_repair_s: float = 3600.0
    progress: bool = False
    progress_label: str = "simulate"
    # Idle sessions (SimJob.idle_timeout_s) stopped when idle that long; False: they keep their cards.
    idle_reclaim: bool = True
    max_series_points: int = 20000


class JobState(IntEnum):
    WAITING = 0  # not arrived yet
    PENDING = 1
    RUNNING = 2
    TERMINATING = 3  # evicted, inside its grace period
    DONE = 4
    TIMED_OUT = 5
    BOUND = 6  # placed by a preemption, waiting for its victims to leave
    IDLE_STOPPED = 7  # a session stopped because its cards sat idle for its class's idle timeout


@dataclass(slots=True)
class JobRecord:
    """What happened to one job; the per-job rows of the report."""

    spec: SimJob
    state: JobState = JobState.WAITING
    first_start_s: float | None = None
    finish_s: float | None = None
    run_start_s: float | None = None
    progress_s: float = 0.0  # checkpointed work carried into the current run
    epoch: int = 0  # bumps on every start/stop so stale completion events are ignored
    assignments: tuple[Assignment, ...] = ()
    cpu: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    borrowed: bool = False
    preemptions: int = 0
    failures: int = 0
    lost_work_s: float = 0.0
    lost_gpu_s: float = 0.0
    lost_gpu_failure_s: float = 0.0  # the part of lost_gpu_s thrown away by node failures
    alloc_milli: int = 0
    used_milli: int = 0
    last_alloc_milli: int = 0
    # Evicted and already out of the ledger (its cards went to the preemptor) but still inside its grace period:
    # it keeps computing, so its use still counts until it is gone.
    transferred: bool = False
    ghost_used_milli: int = 0
    # Times this job was evicted (reclaimed, preempted, moved), for the engine's "evicted in the last hour".
    evicted_at: list[float] = field(default_factory=list)
    # A move in progress: it stops where it ran until this time, then restarts where its place is held.
    moving_until_s: float | None = None
    moves: int = 0
    lost_gpu_move_s: float = 0.0  # the part of lost_gpu_s thrown away by moves
    idle_gpu_s: float = 0.0  # card-seconds it held while its cards sat idle (its usage pattern)
    idle_reclaimed_gpu_s: float = 0.0  # card-seconds given back by stopping it idle, before its natural end

    @property
    def wait_s(self) -> float | None:
        return None if self.first_start_s is None else self.first_start_s - self.spec.submit_time_s

    @property
    def jct_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.spec.submit_time_s


class _Ev(IntEnum):
    # Order at equal times: the cluster changes first, then new work arrives, then the cycle sees it all.
    FAIL = 0
    REPAIR = 1
    COMPLETE = 2
    IDLE = 3
    EVICT_END = 4
    ARRIVAL = 5
    CYCLE = 6
    END = 7


@dataclass(slots=True)
class _NodeLedger:
    base: Node
    state: NodeState
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_memory_mib: list[int] = field(default_factory=list)
    gpu_compute_milli: list[int] = field(default_factory=list)
    gpu_holders: list[int] = field(default_factory=list)
    gpu_used_milli: list[int] = field(default_factory=list)
    cached: Node | None = None


@dataclass(slots=True)
class _Binding:
    """A preemptor's placement held for it while its victims use up their grace period."""

    rec: JobRecord
    assignments: tuple[Assignment, ...]
    cpu: Mapping[str, tuple[int, int]]
    borrowed: bool
    hold: JobRecord
    waiting: set[str]
    job: Job  # the engine's view: it holds its cards already, as a placed job does in production


@dataclass(slots=True)
class SeriesPoint:
    time_s: float
    allocated_milli: int
    used_milli: int
    queue_len: int
    running: int
    fragment_milli: int
    whole_nvlink_free: int = 0  # nodes whose cards are all NVLink-joined and all idle


@dataclass(slots=True)
class SimResult:
    """Everything a run produced; `metrics.summarize` turns it into figures."""

    jobs: list[JobRecord]
    series: list[SeriesPoint]
    capacity_milli: int
    start_s: float
    end_s: float
    cycles: int
    cycle_wall_s: float
    quotas: Mapping[str, Quota]
    # Time integrals over [start, end]: milli-GPU seconds.
    allocated_milli_s: float
    used_milli_s: float
    fragment_milli_s: float
    queue_len_s: float
    # team -> (seconds the team held or wanted any GPU, integral of its satisfaction over them), teams with a
    # guarantee (`GuaranteeTracker`)
    quota_satisfaction: Mapping[str, tuple[float, float]]
    node_failures: int = 0
    guarantees: GuaranteeFigures | None = None
    # Integral of the whole NVLink nodes free (node-seconds), and how many such nodes the cluster has.
    whole_nvlink_free_s: float = 0.0
    nvlink_nodes: int = 0
    # Reservations: made (a job holding cards on a set of nodes), kept (it started there), started elsewhere
    # (room freed sooner on other nodes), moved (to other nodes while it waited) and dropped (while it waited).
    reservations: Mapping[str, int] = field(default_factory=dict)


def _alloc_share_milli(assignment: Assignment, card_memory_mib: int) -> int:
    """The share of a card an assignment makes unavailable: the larger of its compute and memory shares."""
    mem_share = assignment.memory_mib * WHOLE_GPU_MILLI // card_memory_mib if card_memory_mib else 0
    return min(WHOLE_GPU_MILLI, max(assignment.compute_milli, mem_share))


def _engine_job(spec: SimJob, **running) -> Job:
    """The engine's view of a simulated job; `running` adds where and since when it runs."""
    return Job(
        id=spec.id,
        team=spec.team,
        request=spec.request,
        priority=spec.priority,
        preemptible=spec.preemptible,
        grace_s=spec.grace_s,
        submit_time=spec.submit_time_s,
        max_runtime_s=spec.max_runtime_s,
        priority_class=spec.priority_class,
        checkpoint_interval_s=spec.checkpoint_interval_s,
        **running,
    )


class Simulator:
    """Runs one workload on one cluster under one profile. Build, then call `run()` once."""

    def __init__(
        self,
        *,
        nodes: Sequence[Node],
        jobs: Iterable[SimJob],
        profile: object,
        quotas: Mapping[str, Quota] | None = None,
        config: SimConfig | None = None,
        failures: Sequence[NodeFailure] = (),
        scheduler: Scheduler | None = None,
    ) -> None:
        if scheduler is None:
            scheduler = run_cycle  # the production cycle (tests pass a double)
        self.scheduler = scheduler
        self.profile = profile
        self.config = config or SimConfig()
        self.quotas = dict(quotas or {})
        self.now = 0.0
        self._seq = 0
        self._heap: list[tuple[float, int, int, object]] = []
        self.ledger: dict[str, _NodeLedger] = {}
        for node in nodes:
            n = len(node.gpus)
            led = _NodeLedger(
                base=node,
                state=node.state,
                cpu_milli=node.allocated_cpu_milli,
                memory_mib=node.allocated_memory_mib,
                gpu_memory_mib=[g.allocated_memory_mib for g in node.gpus],
                gpu_compute_milli=[g.allocated_compute_milli for g in node.gpus],
                gpu_holders=[g.holders for g in node.gpus],
                gpu_used_milli=[0] * n,
            )
            self.ledger[node.name] = led
        self.capacity_milli = sum(len(n.gpus) for n in nodes) * WHOLE_GPU_MILLI
        self.records: dict[str, JobRecord] = {}
        for spec in jobs:
            if spec.id in self.records:
                raise ValueError(f"duplicate job id {spec.id!r}")
            self.records[spec.id] = JobRecord(spec=spec)
        self.pending: dict[str, Job] = {}
        self.running: dict[str, Job] = {}
        self.failures = list(failures)
        self._bindings: dict[str, _Binding] = {}
        # Running totals and their time integrals.
        self._alloc = 0
        self._used = 0
        self._frag = 0
        self._last_t = 0.0
        self._int_alloc = 0.0
        self._int_used = 0.0
        self._int_frag = 0.0
        self._int_queue = 0.0
        self._int_whole_free = 0.0
        # Nodes whose cards are all pairwise NVLink-joined: a whole one free is what big trainings need.
        self._nvlink_nodes = [
            n.name
            for n in nodes
            if len(n.gpus) >= 2 and len(n.nvlink) >= len(n.gpus) * (len(n.gpus) - 1) // 2
        ]
        self._whole_free = 0
        # Reservations held at the last cycle: job id -> the nodes.
        self._reserved: dict[str, frozenset[str]] = {}
        self._reservations: Counter[str] = Counter()
        self._team_alloc_milli: Counter[str] = Counter()
        self.guarantees = GuaranteeTracker(nodes=nodes, quotas=self.quotas)
        self._usage: dict[str, float] = {}
        params = getattr(profile, "params", None) or {}
        self._half_life_s = float(
            self.config.usage_half_life_s or params.get("fairshare_half_life_s") or DEFAULT_USAGE_HALF_LIFE_S
        )
        self._recent: list[Request] = []
        self._recent_counts: Counter[Request] = Counter()
        self._workload: tuple[tuple[Request, float], ...] = ()
        self._workload_dirty = False
        self.series: list[SeriesPoint] = []
        self.cycles = 0
        self.cycle_wall_s = 0.0
        self._dirty = True
        self._next_cycle_at: float | None = None
        self._last_cycle_at = -math.inf
        self._node_failures = 0
        self._ran = False
        self._evicted_recently: set[str] = set()
        self._moves: dict[str, None] = {}  # jobs being moved, in the order they were moved

    # ----------------------------------------------------------------------------------------------- events
    def _push(self, time_s: float, kind: _Ev, payload: object = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time_s, int(kind), self._seq, payload))

    def _request_cycle(self) -> None:
        """Schedule the next cycle on the cadence grid, unless one is already due."""
        step = self.config.cycle_interval_s
        at = math.ceil(self.now / step - 1e-9) * step if step > 0 else self.now
        if self._next_cycle_at is None or at < self._next_cycle_at:
            self._next_cycle_at = at
            self._push(at, _Ev.CYCLE, at)

    # ------------------------------------------------------------------------------------------- accounting
    def _advance(self, t: float) -> None:
        end = self.config.horizon_s
        t_eff = t if end is None else min(t, end)
        dt = t_eff - self._last_t
        if dt > 0:
            self._int_alloc += self._alloc * dt
            self._int_used += self._used_now() * dt
            self._int_frag += self._frag * dt
            self._int_queue += len(self.pending) * dt
            self._int_whole_free += self._whole_free * dt
            self.guarantees.advance(self._last_t, dt)
            self._integrate_usage(dt)
            self._last_t = t_eff
        self.now = t

    def _used_now(self) -> int:
        """Real use, never above what is handed out: a victim still inside its grace period keeps its card busy
        while the card already counts as its preemptor's."""
        return min(self._used, self._alloc)

    def _integrate_usage(self, dt: float) -> None:
        h = self._half_life_s
        decay = 0.5 ** (dt / h) if h > 0 else 0.0
        gain = h / math.log(2) * (1 - decay) if h > 0 else dt
        teams = set(self._usage) | {t for t, v in self._team_alloc_milli.items() if v}
        for team in teams:
            self._usage[team] = self._usage.get(team, 0.0) * decay + self._team_alloc_milli[team] * gain

    def _count_whole_free(self) -> int:
        free = 0
        for name in self._nvlink_nodes:
            led = self.ledger[name]
            if led.state is NodeState.READY and not any(led.gpu_holders):
                free += 1
        return free

    def _sample(self) -> None:
        self._whole_free = self._count_whole_free()
        p = SeriesPoint(
            self.now,
            self._alloc,
            self._used_now(),
            len(self.pending),
            len(self.running),
            self._frag,
            self._whole_free,
        )
        if self.series and self.series[-1].time_s == self.now:
            self.series[-1] = p
        else:
            self.series.append(p)

    # ---------------------------------------------------------------------------------------- job movement
    def _enqueue(self, rec: JobRecord) -> None:
        s = rec.spec
        rec.state = JobState.PENDING
        rec.assignments = ()
        rec.cpu = {}
        self.pending[s.id] = _engine_job(s)
        self.guarantees.job_waiting(s)
        self._dirty = True

    def _dequeue(self, rec: JobRecord) -> None:
        s = rec.spec
        del self.pending[s.id]
        self.guarantees.job_placed(s, self.now)

    def _take(
        self, rec: JobRecord, assignments: tuple[Assignment, ...], cpu: Mapping[str, tuple[int, int]]
    ) -> None:
        """Book a job's GPUs, CPU and memory in the ledger, refusing anything over capacity."""
        s = rec.spec
        alloc = used = 0
        touched: set[str] = set()
        for a in assignments:
            led = self.ledger.get(a.node)
            if led is None or led.state is not NodeState.READY:
                raise SimulationError(f"{s.id}: placed on {a.node!r}, which is unknown or not ready")
            if not 0 <= a.gpu_index < len(led.base.gpus):
                raise SimulationError(f"{s.id}: {a.node} has no GPU {a.gpu_index}")
            gpu = led.base.gpus[a.gpu_index]
            i = a.gpu_index
            if led.gpu_memory_mib[i] + a.memory_mib > gpu.memory_mib:
                raise SimulationError(f"{s.id}: {a.node}/gpu{i} memory over capacity")
            if (
                gpu.sharing is not Sharing.TIMESLICE
                and led.gpu_compute_milli[i] + a.compute_milli > WHOLE_GPU_MILLI
            ):
                raise SimulationError(f"{s.id}: {a.node}/gpu{i} compute over capacity")
            share = _alloc_share_milli(a, gpu.memory_mib)
            before = min(WHOLE_GPU_MILLI, led.gpu_used_milli[i])
            self._frag -= self._gpu_fragment_milli(led, i)
            led.gpu_memory_mib[i] += a.memory_mib
            led.gpu_compute_milli[i] += a.compute_milli
            led.gpu_holders[i] += 1
            led.gpu_used_milli[i] += min(s.usage_milli, share)
            self._frag += self._gpu_fragment_milli(led, i)
            used += min(WHOLE_GPU_MILLI, led.gpu_used_milli[i]) - before
            alloc += share
            touched.add(a.node)
        if not cpu and (s.request.cpu_milli or s.request.memory_mib):
            cpu = {n: (s.request.cpu_milli, s.request.memory_mib) for n in sorted(touched)}
        for node, (c, m) in cpu.items():
            led = self.ledger.get(node)
            if led is None or led.state is not NodeState.READY:
                raise SimulationError(f"{s.id}: CPU placed on {node!r}, which is unknown or not ready")
            if led.cpu_milli + c > led.base.cpu_milli or led.memory_mib + m > led.base.memory_mib:
                raise SimulationError(f"{s.id}: {node} CPU or host memory over capacity")
            led.cpu_milli += c
            led.memory_mib += m
            touched.add(node)
        for node in touched:
            self.ledger[node].cached = None
        rec.assignments = assignments
        rec.cpu = dict(cpu)
        rec.alloc_milli = alloc
        rec.last_alloc_milli = alloc
        rec.used_milli = used
        self._alloc += alloc
        self._used += used
        self._team_alloc_milli[s.team] += sum(a.compute_milli for a in assignments)

    def _release(self, rec: JobRecord) -> None:
        s = rec.spec
        touched: set[str] = set()
        used_delta = 0
        for a in rec.assignments:
            led = self.ledger[a.node]
            gpu = led.base.gpus[a.gpu_index]
            i = a.gpu_index
            before = min(WHOLE_GPU_MILLI, led.gpu_used_milli[i])
            self._frag -= self._gpu_fragment_milli(led, i)
            led.gpu_memory_mib[i] -= a.memory_mib
            led.gpu_compute_milli[i] -= a.compute_milli
            led.gpu_holders[i] -= 1
            led.gpu_used_milli[i] -= min(s.usage_milli, _alloc_share_milli(a, gpu.memory_mib))
            self._frag += self._gpu_fragment_milli(led, i)
            used_delta += before - min(WHOLE_GPU_MILLI, led.gpu_used_milli[i])
            touched.add(a.node)
        for node, (c, m) in rec.cpu.items():
            led = self.ledger[node]
            led.cpu_milli -= c
            led.memory_mib -= m
            touched.add(node)
        for node in touched:
            self.ledger[node].cached = None
        self._alloc -= rec.alloc_milli
        self._used -= used_delta
        self._team_alloc_milli[s.team] -= sum(a.compute_milli for a in rec.assignments)
        rec.alloc_milli = rec.used_milli = 0
        self._forget_running(rec)
        self._dirty = True

    def _forget_running(self, rec: JobRecord) -> None:
        """The job is no longer among the running jobs the engine sees (a preemptor's held cards never were)."""
        if self.running.pop(rec.spec.id, None) is not None:
            self.guarantees.job_stopped(rec.spec, rec.assignments)

    def _start(
        self,
        rec: JobRecord,
        assignments: tuple[Assignment, ...],
        cpu,
        borrowed: bool,
        *,
        from_pending: bool = True,
    ) -> None:
        s = rec.spec
        if from_pending:
            self._dequeue(rec)
        self._take(rec, assignments, cpu)
        self.guarantees.job_started(s, assignments)
        rec.state = JobState.RUNNING
        rec.borrowed = borrowed
        rec.run_start_s = self.now
        rec.epoch += 1
        if rec.first_start_s is None:
            rec.first_start_s = self.now
        self.running[s.id] = _engine_job(
            s,
            assignments=assignments,
            start_time=self.now,
            borrowed=borrowed,
            cpu_assignments=dict(rec.cpu),
        )
        remaining = max(0.0, s.runtime_s - rec.progress_s)
        run_for = remaining
        if s.max_runtime_s is not None:
            run_for = min(run_for, s.max_runtime_s)
        self._push(self.now + run_for, _Ev.COMPLETE, (s.id, rec.epoch))
        idle_after = s.idle_stop_after_s() if self.config.idle_reclaim else None
        if idle_after is not None and idle_after < run_for:
            self._push(self.now + idle_after, _Ev.IDLE, (s.id, rec.epoch, self.now + run_for))

    def _stop(self, rec: JobRecord, *, failed: bool) -> None:
        """Kill a running job: keep the work up to its last checkpoint, lose the rest, requeue it."""
        s = rec.spec
        self._count_idle(rec)
        self._moves.pop(s.id, None)
        total = rec.progress_s + (self.now - (self.now if rec.run_start_s is None else rec.run_start_s))
        ci = s.checkpoint_interval_s
        kept = math.floor(total / ci) * ci if ci else 0.0
        kept = min(kept, total)
        lost = total - kept
        rec.lost_work_s += lost
        lost_gpu_s = lost * rec.last_alloc_milli / WHOLE_GPU_MILLI
        rec.lost_gpu_s += lost_gpu_s
        rec.progress_s = kept
        if failed:
            rec.failures += 1
            rec.lost_gpu_failure_s += lost_gpu_s
        else:
            rec.preemptions += 1
            if rec.moving_until_s is not None:
                rec.lost_gpu_move_s += lost_gpu_s
        rec.moving_until_s = None
        self._free(rec)
        rec.epoch += 1
        rec.run_start_s = None
        self._enqueue(rec)
        self._victim_gone(rec.spec.id)

    def _free(self, rec: JobRecord) -> None:
        """Give back what a job holds (or, for a victim whose cards already went to its preemptor, its use)."""
        if rec.transferred:
            self._used -= rec.ghost_used_milli
            rec.ghost_used_milli = 0
            rec.transferred = False
            self._forget_running(rec)
            self._dirty = True
        else:
            self._release(rec)

    def _transfer(self, victim: JobRecord) -> None:
        """Hand a terminating victim's cards to its preemptor now; its use counts until its grace ends."""
        if victim.transferred:
            return
        ghost = victim.used_milli
        self._release(victim)
        self._used += ghost
        victim.ghost_used_milli = ghost
        victim.transferred = True

    def _bind(self, rec: JobRecord, placement, victims: list[JobRecord]) -> None:
        """Hold a preemptor's placement until every victim it evicted has left, then start it there."""
        for v in victims:
            self._transfer(v)
        self._dequeue(rec)
        rec.state = JobState.BOUND
        hold = JobRecord(spec=replace(rec.spec, id=f"{rec.spec.id}#held", usage_milli=0))
        self._take(hold, tuple(placement.assignments), placement.cpu)
        waiting = {v.spec.id for v in victims if v.state is JobState.TERMINATING}
        job = _engine_job(
            rec.spec,
            assignments=tuple(placement.assignments),
            start_time=self.now,
            borrowed=placement.borrowed,
            cpu_assignments=dict(hold.cpu),
        )
        binding = _Binding(
            rec, tuple(placement.assignments), dict(hold.cpu), placement.borrowed, hold, waiting, job
        )
        self._bindings[rec.spec.id] = binding
        if not waiting:
            self._start_bound(binding)

    def _start_bound(self, b: _Binding) -> None:
        del self._bindings[b.rec.spec.id]
        self._release(b.hold)
        self._start(b.rec, b.assignments, b.cpu, b.borrowed, from_pending=False)

    def _unbind(self, b: _Binding) -> None:
        del self._bindings[b.rec.spec.id]
        self._release(b.hold)
        self._enqueue(b.rec)

    def _victim_gone(self, job_id: str) -> None:
        for b in [b for b in self._bindings.values() if job_id in b.waiting]:
            b.waiting.discard(job_id)
            if not b.waiting:
                self._start_bound(b)

    # ------------------------------------------------------------------------------------------- snapshot
    def _node(self, led: _NodeLedger) -> Node:
        if led.cached is None:
            base = led.base
            gpus = tuple(
                replace(
                    g,
                    allocated_memory_mib=led.gpu_memory_mib[i],
                    allocated_compute_milli=led.gpu_compute_milli[i],
                    holders=led.gpu_holders[i],
                )
                for i, g in enumerate(base.gpus)
            )
            led.cached = replace(
                base,
                gpus=gpus,
                state=led.state,
                allocated_cpu_milli=led.cpu_milli,
                allocated_memory_mib=led.memory_mib,
            )
        return led.cached

    def _typical_workload(self) -> tuple[tuple[Request, float], ...]:
        if self._workload_dirty:
            total = sum(self._recent_counts.values())
            ranked = sorted(self._recent_counts.items(), key=lambda kv: (-kv[1], repr(kv[0])))
            self._workload = tuple((r, c / total) for r, c in ranked) if total else ()
            self._workload_dirty = False
        return self._workload

    def _recent_evictions(self) -> None:
        """Running jobs carry how often they were evicted in the last hour (the engine's no-thrash rule)."""
        horizon = self.now - 3600.0
        for job_id in list(self._evicted_recently):
            rec = self.records[job_id]
            while rec.evicted_at and rec.evicted_at[0] <= horizon:
                rec.evicted_at.pop(0)
            if not rec.evicted_at:
                self._evicted_recently.discard(job_id)
            job = self.running.get(job_id)
            if job is not None and job.recent_evictions != len(rec.evicted_at):
                self.running[job_id] = replace(job, recent_evictions=len(rec.evicted_at))

    def _moving(self) -> tuple[Job, ...]:
        """Jobs being moved, listed as pending while they stop: the engine holds their new place until then."""
        return tuple(
            _engine_job(rec.spec, ready_at=rec.moving_until_s)
            for rec in (self.records[job_id] for job_id in self._moves)
        )

    def snapshot(self) -> Snapshot:
        self._recent_evictions()
        return Snapshot(
            now=self.now,
            nodes=tuple(self._node(led) for led in self.ledger.values()),
            # A preemptor waiting for its victims holds its cards (and counts against its team's quota) as a
            # placed job does in production.
            running=(*self.running.values(), *(b.job for b in self._bindings.values())),
            pending=(*self.pending.values(), *self._moving()),
            quotas=self.quotas,
            usage=dict(self._usage),
            workload=self._typical_workload(),
            seed=self.config.seed,
        )

    # --------------------------------------------------------------------------------------------- handlers
    def _on_arrival(self, job_id: str) -> None:
        rec = self.records[job_id]
        self._enqueue(rec)
        req = rec.spec.request
        self._recent.append(req)
        self._recent_counts[req] += 1
        if len(self._recent) > self.config.workload_window:
            old = self._recent.pop(0)
            self._recent_counts[old] -= 1
            if not self._recent_counts[old]:
                del self._recent_counts[old]
        self._workload_dirty = True

    def _on_complete(self, job_id: str, epoch: int) -> None:
        rec = self.records[job_id]
        if rec.epoch != epoch or rec.state not in (JobState.RUNNING, JobState.TERMINATING):
            return
        s = rec.spec
        self._count_idle(rec)
        self._moves.pop(s.id, None)  # it finished while it was being moved
        rec.moving_until_s = None
        worked = rec.progress_s + (self.now - (self.now if rec.run_start_s is None else rec.run_start_s))
        rec.progress_s = min(worked, s.runtime_s)
        self._free(rec)
        rec.finish_s = self.now
        rec.epoch += 1
        rec.state = JobState.DONE if worked + 1e-6 >= s.runtime_s else JobState.TIMED_OUT
        self._victim_gone(s.id)

    def _count_idle(self, rec: JobRecord) -> None:
        """The card-seconds of the run now ending that its cards sat idle (within the metrics window)."""
        if rec.run_start_s is None or rec.spec.busy_s is None:
            return
        end = self.now if self.config.horizon_s is None else min(self.now, self.config.horizon_s)
        cards = rec.last_alloc_milli / WHOLE_GPU_MILLI
        rec.idle_gpu_s += rec.spec.idle_s_between(rec.run_start_s, rec.run_start_s, end) * cards

    def _on_idle(self, job_id: str, epoch: int, natural_end_s: float) -> None:
        """A session idle for its class's timeout is stopped: its cards go to waiting work."""
        rec = self.records[job_id]
        if rec.epoch != epoch or rec.state is not JobState.RUNNING:
            return
        self._count_idle(rec)
        end = natural_end_s if self.config.horizon_s is None else min(natural_end_s, self.config.horizon_s)
        rec.idle_reclaimed_gpu_s += max(0.0, end - self.now) * rec.last_alloc_milli / WHOLE_GPU_MILLI
        self._moves.pop(job_id, None)
        rec.moving_until_s = None
        worked = rec.progress_s + (self.now - rec.run_start_s)
        rec.progress_s = min(worked, rec.spec.runtime_s)
        self._free(rec)
        rec.finish_s = self.now
        rec.epoch += 1
        rec.run_start_s = None
        rec.state = JobState.IDLE_STOPPED
        self._victim_gone(job_id)

    def _on_evict_end(self, job_id: str, epoch: int) -> None:
        rec = self.records[job_id]
        if rec.epoch != epoch or rec.state is not JobState.TERMINATING:
            return
        self._stop(rec, failed=False)

    def _on_fail(self, failure: NodeFailure) -> None:
        led = self.ledger.get(failure.node)
        if led is None:
            raise SimulationError(f"node failure names an unknown node {failure.node!r}")
        if led.state is NodeState.LOST:
            return
        self._node_failures += 1
        # Placements waiting on this node are void first, so a victim dying here cannot start one of them.
        for b in [
            b
            for b in self._bindings.values()
            if any(a.node == failure.node for a in b.assignments) or failure.node in b.cpu
        ]:
            self._unbind(b)
        victims = [
            r
            for r in self.records.values()
            if r.state in (JobState.RUNNING, JobState.TERMINATING)
            and (any(a.node == failure.node for a in r.assignments) or failure.node in r.cpu)
        ]
        for rec in victims:
            self._stop(rec, failed=True)
        led.state = NodeState.LOST
        led.cached = None
        self.guarantees.capacity_changed(-WHOLE_GPU_MILLI * len(led.base.gpus))
        self._dirty = True
        if failure.repair_s is not None:
            self._push(self.now + failure.repair_s, _Ev.REPAIR, failure.node)

    def _on_repair(self, node: str) -> None:
        led = self.ledger[node]
        if led.state is NodeState.LOST:
            self.guarantees.capacity_changed(WHOLE_GPU_MILLI * len(led.base.gpus))
        led.state = NodeState.READY
        led.cached = None
        self._dirty = True

    def _on_cycle(self, at: float) -> None:
        if self._next_cycle_at != at:
            return  # superseded by an earlier request
        self._next_cycle_at = None
        if not self.pending:
            return
        if not self._dirty and self.now - self._last_cycle_at < self.config.idle_recheck_s - 1e-9:
            # Nothing changed since the last cycle: check again later, in case ageing changes the answer.
            self._next_cycle_at = self._last_cycle_at + self.config.idle_recheck_s
            self._push(self._next_cycle_at, _Ev.CYCLE, self._next_cycle_at)
            return
        self._run_cycle()

    def _run_cycle(self) -> None:
        snap = self.snapshot()
        self._dirty = False
        self._last_cycle_at = self.now
        t0 = time.perf_counter()
        decisions = self.scheduler(snap, self.profile)
        self.cycle_wall_s += time.perf_counter() - t0
        self.cycles += 1
        victims_of: dict[str, list[JobRecord]] = {}
        evicted: list[tuple[str, str, str]] = []  # (victim, its team, the preemptor's team)
        for ev in decisions.evictions:
            rec = self.records.get(ev.job_id)
            if rec is not None and rec.state is JobState.BOUND:
                # Placed but not started (it waits for its own victims): it goes back to the queue at once.
                preemptor = self.records.get(ev.preemptor_id)
                evicted.append((ev.job_id, rec.spec.team, preemptor.spec.team if preemptor else ""))
                rec.preemptions += 1
                self._unbind(self._bindings[ev.job_id])
                continue
            if rec is None or rec.state not in (JobState.RUNNING, JobState.TERMINATING):
                raise SimulationError(f"eviction of {ev.job_id!r}, which is not running")
            if not rec.spec.preemptible and ev.code == "preempted":
                raise SimulationError(f"{ev.job_id} is not preemptible but was preempted")
            victims_of.setdefault(ev.preemptor_id, []).append(rec)
            if rec.state is JobState.TERMINATING:
                continue  # already on its way out; its grace period is not restarted
            rec.state = JobState.TERMINATING
            rec.evicted_at.append(self.now)
            self._evicted_recently.add(ev.job_id)
            if ev.code == "moved":
                rec.moves += 1
                rec.moving_until_s = self.now + max(0.0, ev.grace_s)
                self._moves[ev.job_id] = None
            self._push(self.now + max(0.0, ev.grace_s), _Ev.EVICT_END, (ev.job_id, rec.epoch))
            preemptor = self.records.get(ev.preemptor_id)
            evicted.append((ev.job_id, rec.spec.team, preemptor.spec.team if preemptor else ""))
        # A moved job runs on elsewhere (its new place is held for it): no guarantee loses it, and it is counted
        # among the moves, not the evictions.
        moved = {ev.job_id for ev in decisions.evictions if ev.code == "moved"}
        evicted = [e for e in evicted if e[0] not in moved]
        if evicted:
            placed = [(self.records[p.job_id].spec.team, p.assignments) for p in decisions.placements]
            self.guarantees.evictions_applied(snap, evicted, placed)
        for p in decisions.placements:
            rec = self.records.get(p.job_id)
            if rec is None or rec.state is not JobState.PENDING:
                raise SimulationError(f"placement of {p.job_id!r}, which is not pending")
            if p.job_id in victims_of:
                self._bind(rec, p, victims_of[p.job_id])
            else:
                self._start(rec, tuple(p.assignments), p.cpu, p.borrowed)
        if decisions.placements:
            self.guarantees.placements_applied(
                (self.records[p.job_id].spec for p in decisions.placements), self.now
            )
        self._relabel(decisions.borrowed)
        self._count_reservations(decisions)
        if decisions.placements or decisions.evictions:
            self._dirty = True
        self._sample()
        if self.pending:
            # Evictions free capacity only after their grace; placements may have unblocked nothing.
            self._next_cycle_at = self.now + (
                self.config.cycle_interval_s if self._dirty else self.config.idle_recheck_s
            )
            self._dirty = bool(decisions.placements or decisions.evictions)
            self._push(self._next_cycle_at, _Ev.CYCLE, self._next_cycle_at)

    def _count_reservations(self, decisions: Decisions) -> None:
        """A reservation is kept when its job is placed on the nodes it held, broken when it is dropped or moves to
        other nodes first; each new one (a job on a set of nodes) counts as made. Moved jobs' held places are not
        reservations of a waiting job and are left out."""
        moved = {ev.job_id for ev in decisions.evictions if ev.code == "moved"}
        now = {
            r.job_id: frozenset(a.node for a in r.assignments)
            for r in decisions.reservations
            if r.job_id not in moved and r.job_id not in self._moves
        }
        placed = {p.job_id: frozenset(a.node for a in p.assignments) for p in decisions.placements}
        counts = self._reservations
        for job_id, nodes in self._reserved.items():
            if now.get(job_id) == nodes:
                continue
            if job_id in placed:
                counts["kept" if placed[job_id] <= nodes else "started_elsewhere"] += 1
            elif job_id in now:
                counts["moved"] += 1
            elif job_id in self.pending:
                counts["dropped"] += 1
        for job_id, nodes in now.items():
            if self._reserved.get(job_id) != nodes:
                counts["made"] += 1
        # The next cycle's snapshot tells each waiting job where it held its reservation (kept while it can be).
        for job_id in set(self._reserved) | set(now):
            job = self.pending.get(job_id)
            if job is not None:
                nodes = tuple(sorted(now.get(job_id, ())))
                if job.reserved_on != nodes:
                    self.pending[job_id] = replace(job, reserved_on=nodes)
        self._reserved = now

    def _relabel(self, borrowed: frozenset[str]) -> None:
        """Running jobs' "on borrowed capacity" labels follow their teams' standing, as in production."""
        for job_id, job in self.running.items():
            flag = job_id in borrowed
            if job.borrowed is not flag:
                self.running[job_id] = replace(job, borrowed=flag)
                self.records[job_id].borrowed = flag

    @staticmethod
    def _gpu_fragment_milli(led: _NodeLedger, i: int) -> int:
        """Free share stranded on a partly used card: capacity that only slices can still use."""
        if not led.gpu_holders[i]:
            return 0
        g = led.base.gpus[i]
        mem_free = (g.memory_mib - led.gpu_memory_mib[i]) * WHOLE_GPU_MILLI // max(1, g.memory_mib)
        return max(0, min(WHOLE_GPU_MILLI - led.gpu_compute_milli[i], mem_free))

    # ------------------------------------------------------------------------------------------------- run
    def _schedule_failures(self) -> None:
        for f in self.failures:
            self._push(f.time_s, _Ev.FAIL, f)
        mtbf = self.config.node_mtbf_s
        if mtbf:
            end = self.config.horizon_s or max(
                (r.spec.submit_time_s + r.spec.runtime_s for r in self.records.values()), default=0.0
            )
            rng = random.Random(f"failures-{self.config.seed}")
            for name in self.ledger:
                t = rng.expovariate(1 / mtbf)
                while t < end:
                    self._push(t, _Ev.FAIL, NodeFailure(name, t, self.config.node_repair_s))
                    t += self.config.node_repair_s + rng.expovariate(1 / mtbf)

    def run(self) -> SimResult:
        if self._ran:
            raise RuntimeError("a Simulator runs once; build another")
        self._ran = True
        for rec in sorted(self.records.values(), key=lambda r: (r.spec.submit_time_s, r.spec.id)):
            self._push(rec.spec.submit_time_s, _Ev.ARRIVAL, rec.spec.id)
        self._schedule_failures()
        horizon = self.config.horizon_s
        if horizon is not None:
            self._push(horizon, _Ev.END)
        bar = self._progress_bar()
        self._sample()
        while self._heap:
            t, kind, _, payload = heapq.heappop(self._heap)
            if horizon is not None and t > horizon:
                break
            self._advance(t)
            ev = _Ev(kind)
            if ev is _Ev.END:
                break
            if ev is _Ev.ARRIVAL:
                self._on_arrival(payload)
            elif ev is _Ev.COMPLETE:
                self._on_complete(*payload)
            elif ev is _Ev.IDLE:
                self._on_idle(*payload)
            elif ev is _Ev.EVICT_END:
                self._on_evict_end(*payload)
            elif ev is _Ev.FAIL:
                self._on_fail(payload)
            elif ev is _Ev.REPAIR:
                self._on_repair(payload)
            elif ev is _Ev.CYCLE:
                self._on_cycle(payload)
                if bar is not None:
                    bar.update(max(0, int(self.now) - bar.n))
                continue
            if ev is not _Ev.CYCLE:
                self._sample()
                if self.pending and self._dirty:
                    self._request_cycle()
            if self._drained():
                break
        end = horizon if horizon is not None else self.now
        self._advance(end)
        for rec in self.records.values():  # runs still going at the end: their idle time so far
            if rec.state in (JobState.RUNNING, JobState.TERMINATING):
                self._count_idle(rec)
        self._sample()
        if bar is not None:
            bar.close()
        guarantees = self.guarantees.finish(end)
        return SimResult(
            jobs=list(self.records.values()),
            series=self._thin(self.series),
            capacity_milli=self.capacity_milli,
            start_s=0.0,
            end_s=end,
            cycles=self.cycles,
            cycle_wall_s=self.cycle_wall_s,
            quotas=self.quotas,
            allocated_milli_s=self._int_alloc,
            used_milli_s=self._int_used,
            fragment_milli_s=self._int_frag,
            queue_len_s=self._int_queue,
            quota_satisfaction={
                t: (guarantees.teams[t].wanted_s, guarantees.teams[t].satisfied_s) for t in self.quotas
            },
            node_failures=self._node_failures,
            guarantees=guarantees,
            whole_nvlink_free_s=self._int_whole_free,
            nvlink_nodes=len(self._nvlink_nodes),
            reservations={
                k: self._reservations[k] for k in ("made", "kept", "started_elsewhere", "moved", "dropped")
            },
        )

    def _drained(self) -> bool:
        """Without a horizon, stop once nothing runs and nothing else can happen."""
        if self.config.horizon_s is not None or self.running:
            return False
        return all(kind == _Ev.CYCLE for _, kind, _, _ in self._heap) and (
            not self.pending or self.cycles > 0 and not self._dirty
        )

    def _thin(self, series: list[SeriesPoint]) -> list[SeriesPoint]:
        cap = self.config.max_series_points
        if len(series) <= cap:
            return series
        step = len(series) / cap
        keep = [series[int(i * step)] for i in range(cap)]
        keep[-1] = series[-1]
        return keep

    def _progress_bar(self):
        if not self.config.progress:
            return None
        try:
            from tqdm import tqdm
        except ImportError:  # the bar is a convenience
            return None
        total = self.config.horizon_s or max(
            (r.spec.submit_time_s + r.spec.runtime_s for r in self.records.values()), default=0.0
        )
        return tqdm(
            total=int(total),
            desc=self.config.progress_label,
            unit="sim-s",
            file=sys.stderr,
            leave=False,
            mininterval=0.5,
            disable=None,  # only on a terminal: logs and pipes stay clean
        )


def simulate(
    *,
    nodes: Sequence[Node],
    jobs: Iterable[SimJob],
    profile: object,
    quotas: Mapping[str, Quota] | None = None,
    config: SimConfig | None = None,
    failures: Sequence[NodeFailure] = (),
    scheduler: Scheduler | None = None,
) -> SimResult:
    """Build a simulator and run it once."""
    return Simulator(
        nodes=nodes,
        jobs=jobs,
        profile=profile,
        quotas=quotas,
        config=config,
        failures=failures,
        scheduler=scheduler,
    ).run()
