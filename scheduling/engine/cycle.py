"""One scheduling cycle: `run_cycle(snapshot, profile) -> Decisions`.

A session over an immutable snapshot keeps a working copy of the nodes in a `NodeIndex`, runs the profile's actions
in order (admit, allocate with reservations and backfill, reclaim, preempt) and returns what to do. Evictions are
staged in a `Statement` that commits or rolls back whole. docs/engine.md walks through it step by step.
"""

from __future__ import annotations

import random
import threading
from bisect import insort
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from scheduling.engine.accounting import min_charge, model_usage_add, team_usage, usage_add, within_guarantee
from scheduling.engine.framework import CycleContext, Profile
from scheduling.engine.index import NodeIndex
from scheduling.engine.plugins import get_plugin
from scheduling.engine.profiles import DEFAULT_PARAMS, check_profile
from scheduling.engine.reasons import (
    BEING_FREED,
    FILTERED,
    GANG_INCOMPLETE,
    INSUFFICIENT_GPUS,
    INSUFFICIENT_HOST,
    MODEL_QUOTA_LIMIT,
    NO_FIT,
    NO_MATCHING_GPU,
    NO_NUMA_GROUP,
    NO_NVLINK_GROUP,
    NO_SLICE,
    NODE_UNAVAILABLE,
    NOT_REACHED,
    QUOTA_LIMIT,
    RESERVED,
    WAITING_FOR_RESERVATION,
    explain_cluster,
)
from scheduling.engine.resources import (
    DEFAULT_TIMESLICE_FACTOR,
    allocate_on_node,
    charge_of,
    choose_whole,
    compute_cap_milli,
    gpu_is_free,
    gpu_matches,
    gpu_with,
    job_host_on,
    node_fits,
    node_with,
    release_many,
    release_on_node,
    slice_fits_gpu,
    whole_assignments,
)
from scheduling.engine.types import (
    WHOLE_GPU_MILLI,
    Assignment,
    Decisions,
    Eviction,
    Health,
    Job,
    Node,
    Pending,
    Placement,
    Request,
    Reservation,
    Sharing,
    Snapshot,
    Status,
)

_STATE_SLOTS = 16
NEG_INF = float("-inf")
INF = float("inf")


@dataclass
class _Plugins:
    queue: list[Any]
    admit: list[Any]
    cached_filters: list[Any]
    live_filters: list[Any]
    cached_scores: list[tuple[Any, float]]
    live_scores: list[tuple[Any, float]]
    gpu_scores: list[tuple[Any, float]]
    topology_aware: bool
    # Admit plugins with per-GPU-model hooks (see framework.AdmitPlugin).
    restrictors: list[Any] = field(default_factory=list)
    model_checks: list[Any] = field(default_factory=list)
    model_borrowed: list[Any] = field(default_factory=list)


def _cacheable(plugin: Any) -> bool:
    return bool(getattr(plugin, "CACHEABLE", True))


def _load(profile: Profile) -> _Plugins:
    check_profile(profile)
    filters = [get_plugin(n) for n in profile.filters if n != "fits"]
    node_scores = [(get_plugin(n), float(w)) for n, w in profile.node_scores if w]
    admit = [get_plugin(n) for n in profile.admit]
    return _Plugins(
        queue=[get_plugin(n) for n in profile.queue_order],
        admit=admit,
        cached_filters=[f for f in filters if _cacheable(f)],
        live_filters=[f for f in filters if not _cacheable(f)],
        cached_scores=[(p, w) for p, w in node_scores if _cacheable(p)],
        live_scores=[(p, w) for p, w in node_scores if not _cacheable(p)],
        gpu_scores=[(get_plugin(n), float(w)) for n, w in profile.gpu_scores if w],
        topology_aware=any(n == "topology" for n, _ in profile.gpu_scores),
        restrictors=[p for p in admit if hasattr(p, "restrict_models") and hasattr(p, "restricted_teams")],
        model_checks=[p for p in admit if hasattr(p, "admit_assignments")],
        model_borrowed=[p for p in admit if hasattr(p, "borrowed_assignments")],
    )


@dataclass
class _EngineState:
    """What outlives one cycle for a profile: the plugins and the node index with its memos."""

    profile: Profile
    plugins: _Plugins
    index: NodeIndex | None = None
    dirty: set[int] = field(default_factory=set)
    workload: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Running job id -> (its assignments, what they give back to the start projection's pools).
    releases: dict[str, tuple] = field(default_factory=dict)


_STATES: OrderedDict[int, _EngineState] = OrderedDict()
_STATES_LOCK = threading.Lock()


def _state_for(profile: Profile) -> _EngineState:
    with _STATES_LOCK:
        state = _STATES.get(id(profile))
        if state is not None and state.profile is profile:
            _STATES.move_to_end(id(profile))
            return state
        state = _STATES[id(profile)] = _EngineState(profile=profile, plugins=_load(profile))
        while len(_STATES) > _STATE_SLOTS:
            _STATES.popitem(last=False)
        return state


def run_cycle(snapshot: Snapshot, profile: Profile) -> Decisions:
    """Decide placements, evictions, reservations and pending reasons for one snapshot. Deterministic for the
    same snapshot (and its seed) and profile; caches kept between calls never change the answer, only its cost."""
    state = _state_for(profile)
    with state.lock:
        return _Cycle(state, snapshot).run()


@dataclass(slots=True)
class _Holding:
    """What one running job holds on one node."""

    job: Job
    assignments: list[Assignment]
    cpu_milli: int
    memory_mib: int


@dataclass(slots=True)
class _Held:
    """A reservation's hold on one node."""

    job_id: str
    start: float
    assignments: tuple[Assignment, ...]
    cpu_milli: int
    memory_mib: int


def _overlay(real: Node, holds: list[_Held]) -> Node:
    """The node as other jobs see it: reserved cards (or slices) and host resources count as taken."""
    if not holds:
        return real
    gpus = list(real.gpus)
    pos = {g.index: i for i, g in enumerate(gpus)}
    cpu = mem = 0
    for h in holds:
        cpu += h.cpu_milli
        mem += h.memory_mib
        for a in h.assignments:
            i = pos[a.gpu_index]
            g = gpus[i]
            if a.compute_milli >= WHOLE_GPU_MILLI and a.memory_mib >= g.memory_mib:
                gpus[i] = gpu_with(
                    g, g.memory_mib, max(g.allocated_compute_milli, WHOLE_GPU_MILLI), g.holders + 1
                )
            else:
                gpus[i] = gpu_with(
                    g,
                    min(g.memory_mib, g.allocated_memory_mib + a.memory_mib),
                    g.allocated_compute_milli + a.compute_milli,
                    g.holders + 1,
                )
    return node_with(
        real,
        tuple(gpus),
        min(real.cpu_milli, real.allocated_cpu_milli + cpu),
        min(real.memory_mib, real.allocated_memory_mib + mem),
    )


class _Statement:
    """Staged changes (evictions and the evicting job's placement) that commit or roll back whole."""

    def __init__(self, cycle: _Cycle):
        self.cycle = cycle
        self.saved: dict[int, tuple[Node, Node | None]] = {}
        self.usage: list[tuple[str, int, int]] = []
        self.model_usage: list[tuple[str, tuple[Assignment, ...], int]] = []
        self.evicted: list[tuple[Job, str]] = []
        self.placement: Placement | None = None

    def touch(self, pos: int) -> None:
        if pos not in self.saved:
            c = self.cycle
            self.saved[pos] = (c.index.nodes[pos], c.real.get(pos))

    def rollback(self) -> None:
        c = self.cycle
        for pos, (view, real) in self.saved.items():
            if real is None:
                c.real.pop(pos, None)
            else:
                c.real[pos] = real
            c.index.set(pos, view, consumed_only=False)
        for team, mem, comp in self.usage:
            usage_add(c.ctx, team, -mem, -comp)
        for team, assignments, sign in self.model_usage:
            model_usage_add(c.ctx, team, assignments, -sign)
        for job, _ in self.evicted:
            c.evicted.discard(job.id)

    def commit(self, preemptor: Job) -> None:
        c = self.cycle
        for job, code in self.evicted:
            c.evictions.append(Eviction(job.id, preemptor.id, code, job.grace_s))
        if self.placement is not None:
            c.placements.append(self.placement)
            c.placed_jobs.append(preemptor)


class _Cycle:
    def __init__(self, state: _EngineState, snapshot: Snapshot):
        self.state = state
        self.snap = snapshot
        self.profile = state.profile
        self.plugins = state.plugins
        self.ctx = CycleContext(snapshot=snapshot, profile=self.profile, rng=random.Random(snapshot.seed))
        self.factor = float(self.param("timeslice_oversubscription"))
        self._sync_index()
        self.index: NodeIndex = state.index  # type: ignore[assignment]
        self.index.touched = set()
        self.real: dict[int, Node] = {}  # positions under a reservation: the node without the overlay
        self.holds: dict[int, list[_Held]] = {}
        self.placements: list[Placement] = []
        self.placed_jobs: list[Job] = []
        self.evictions: list[Eviction] = []
        self.reservations: list[Reservation] = []
        self.status: dict[str, Status] = {}
        self.blocked: set[str] = set()  # pending for lack of room (eviction may help)
        self.est_start: dict[str, float] = {}
        self.evicted: set[str] = set()
        self._by_pos: dict[int, list[_Holding]] | None = None
        self._all_by_pos: dict[int, list[_Holding]] | None = None
        self._reason_cache: dict[tuple, Status | None] = {}
        # Teams with per-GPU-model quota rows (asked once, before anything is placed), and per job the latest
        # per-model limit that kept it off some model (named in its pending reason).
        self.restricted: frozenset[str] = frozenset()
        self.model_notes: dict[str, Status] = {}
        self.views: dict[str, Job | Status] = {}  # pending job -> how `_pending` explained and projects it

    def param(self, name: str) -> Any:
        return self.profile.params.get(name, DEFAULT_PARAMS.get(name))

    def _sync_index(self) -> None:
        state, snap = self.state, self.snap
        if state.index is None:
            state.index = NodeIndex(
                snap.nodes, float(self.param("timeslice_oversubscription") or DEFAULT_TIMESLICE_FACTOR)
            )
        else:
            if snap.workload is not state.workload and snap.workload != state.workload:
                # Scorers may read the typical workload: their cached verdicts are void.
                state.index.verdicts.clear()
                state.index.memos.clear()
            state.index.sync(snap.nodes, state.dirty)
        state.workload = snap.workload
        state.dirty = set()

    # -- the cycle ----------------------------------------------------------------------------------------
    def run(self) -> Decisions:
        try:
            if self.plugins.restrictors:
                self.restricted = frozenset().union(
                    *(p.restricted_teams(self.ctx) for p in self.plugins.restrictors)
                )
            queue = self._queue()
            actions = self.profile.actions
            if "admit" in actions:
                self._admit(queue)
            if "allocate" in actions:
                self._allocate(queue, reserve="backfill" in actions)
            if "reclaim" in actions:
                self._post_filter(queue, mode="reclaim")
            if "preempt" in actions:
                self._post_filter(queue, mode="preempt")
            pending = self._pending(queue)
        finally:
            # The next cycle re-reads these slots from its snapshot.
            snap_nodes, nodes = self.index.snap_nodes, self.index.nodes
            self.state.dirty = {p for p in self.index.touched if nodes[p] is not snap_nodes[p]}
            self.index.touched = set()
        return Decisions(
            placements=tuple(self.placements),
            evictions=tuple(self.evictions),
            pending=tuple(pending),
            reservations=tuple(self.reservations),
        )

    def _queue(self) -> list[Job]:
        jobs = list(self.snap.pending)
        if len(jobs) <= 1:
            return jobs
        plugins = self.plugins.queue
        ctx = self.ctx

        def key(job: Job) -> tuple:
            parts: list[Any] = []
            for p in plugins:
                parts.extend(p.sort_key(ctx, job))
            parts.append(job.submit_time)
            parts.append(job.id)
            return tuple(parts)

        jobs.sort(key=key)
        return jobs

    def _admit(self, queue: list[Job]) -> None:
        for job in queue:
            for plugin in self.plugins.admit:
                status = plugin.admit(self.ctx, job)
                if status is not None:
                    self.status[job.id] = status
                    break

    # -- allocate, with reservations and backfill ------------------------------------------------------------
    def _allocate(self, queue: list[Job], *, reserve: bool) -> None:
        max_res = int(self.param("reservations_max") or 0) if reserve else 0
        min_prio = self.param("reservation_min_priority")
        # Only the first blocked jobs reserve (each try may walk every running job's end); a job that cannot
        # reserve anywhere (it fits on no node even empty) does not use up a reservation, but a try.
        tries_left = 2 * max_res
        for job in queue:
            if job.id in self.status:
                continue
            if self._try_place(job):
                continue
            if job.id in self.status:  # refused by quota at its exact charge
                continue
            self.blocked.add(job.id)
            if (
                len(self.reservations) < max_res
                and tries_left > 0
                and (min_prio is None or job.priority >= min_prio)
            ):
                tries_left -= 1
                view = self._effective(job)
                if not isinstance(view, Status):
                    self._reserve(view)

    def _evaluator(self, job: Job) -> Callable[[int], tuple[bool, float]]:
        req, nodes, ctx, factor = job.request, self.index.nodes, self.ctx, self.factor
        filters, scores = self.plugins.cached_filters, self.plugins.cached_scores

        def evaluate(pos: int) -> tuple[bool, float]:
            node = nodes[pos]
            if not node_fits(req, node, factor):
                return False, 0.0
            for f in filters:
                if f.filter(ctx, job, node) is not None:
                    return False, 0.0
            return True, float(sum(w * p.score_node(ctx, job, node) for p, w in scores))

        return evaluate

    def _node_ok(self, job: Job, node: Node) -> bool:
        if not node_fits(job.request, node, self.factor):
            return False
        ctx = self.ctx
        return all(
            f.filter(ctx, job, node) is None
            for f in (*self.plugins.cached_filters, *self.plugins.live_filters)
        )

    def _node_score(self, job: Job, node: Node) -> float:
        ctx = self.ctx
        return float(
            sum(
                w * p.score_node(ctx, job, node)
                for p, w in (*self.plugins.cached_scores, *self.plugins.live_scores)
            )
        )

    def _feasible(self, job: Job) -> tuple[np.ndarray, np.ndarray]:
        """(fits, score) per position in the view every job sees (reserved capacity counts as taken)."""
        memo = self.index.memo(job.request, self._evaluator(job))
        ok, score = memo.ok & self.index.present, memo.score
        live_f, live_s = self.plugins.live_filters, self.plugins.live_scores
        if live_f or live_s:
            score = score.copy()
            nodes, ctx = self.index.nodes, self.ctx
            idx = np.flatnonzero(ok).tolist()
            for f in live_f:
                refused = [p for p in idx if f.filter(ctx, job, nodes[p]) is not None]
                if refused:
                    ok[refused] = False
                    idx = np.flatnonzero(ok).tolist()
            if idx:
                chosen = [nodes[p] for p in idx]
                for plugin, weight in live_s:
                    # A plugin may score many nodes at once (`score_nodes`), which saves a call per node.
                    many = getattr(plugin, "score_nodes", None)
                    if many is not None:
                        values = many(ctx, job, chosen)
                    else:
                        one = plugin.score_node
                        values = [one(ctx, job, node) for node in chosen]
                    score[idx] += weight * np.asarray(values, dtype=np.float64)
        return ok, score

    def _backfill_views(self, job: Job) -> dict[int, tuple[float, Node]]:
        """Reserved nodes as this job may use them: a reservation it would end before does not bind it."""
        out: dict[int, tuple[float, Node]] = {}
        if not self.holds or job.max_runtime_s is None:
            return out
        end = self.snap.now + job.max_runtime_s
        for pos in sorted(self.holds):
            holds = self.holds[pos]
            binding = [h for h in holds if h.start < end]
            if len(binding) == len(holds):
                continue
            node = _overlay(self.real[pos], binding)
            if self._node_ok(job, node):
                out[pos] = (self._node_score(job, node), node)
        return out

    def _choose(self, job: Job) -> list[tuple[int, Node]] | None:
        """The nodes (best score first, ties to snapshot order) the job would take, with the view to plan on."""
        extra = self._backfill_views(job)
        nodes = self.index.nodes
        want = job.request.nodes
        if want <= 1 and not extra and not (self.plugins.live_filters or self.plugins.live_scores):
            # The common case: the memo remembers its best node until a node changes.
            memo = self.index.memo(job.request, self._evaluator(job))
            if memo.best is False:
                memo.best = self.index.best(memo.ok, memo.score) if memo.ok.any() else None
            return None if memo.best is None else [(memo.best, nodes[memo.best])]
        ok, score = self._feasible(job)
        rank = self.index.rank
        if want <= 1:
            pos = self.index.best(ok, score)
            best = (float(score[pos]), -int(rank[pos])) if pos is not None else None
            choice = (pos, nodes[pos]) if pos is not None else None
            for p, (s, node) in extra.items():
                if best is None or (s, -int(rank[p])) > best:
                    best, choice = (s, -int(rank[p])), (p, node)
            return [choice] if choice else None
        idx = np.flatnonzero(ok)
        ranked = [(float(score[p]), int(rank[p]), p, nodes[p]) for p in idx.tolist() if p not in extra]
        ranked += [(s, int(rank[p]), p, node) for p, (s, node) in extra.items()]
        if len(ranked) < want:
            return None
        ranked.sort(key=lambda t: (-t[0], t[1]))
        return [(p, node) for _, _, p, node in ranked[:want]]

    def _plan(
        self, job: Job, chosen: list[tuple[int, Node]]
    ) -> list[tuple[int, tuple[Assignment, ...]]] | None:
        req = job.request
        plan = []
        for pos, node in chosen:
            if req.gpus:
                cards = choose_whole(req, node, topology_aware=self.plugins.topology_aware)
                if cards is None:
                    return None
                plan.append((pos, whole_assignments(node, cards)))
            elif req.is_slice:
                best = None
                for i, g in enumerate(node.gpus):
                    charge = slice_fits_gpu(req, g, self.factor)
                    if charge is None:
                        continue
                    s = sum(w * p.score_gpu(self.ctx, job, node, g) for p, w in self.plugins.gpu_scores)
                    if best is None or s > best[0]:
                        best = (s, i, charge)
                if best is None:
                    return None
                _, i, (mem, comp) = best
                plan.append((pos, (Assignment(node.name, node.gpus[i].index, mem, comp),)))
            else:
                plan.append((pos, ()))
        return plan

    def _effective(self, job: Job) -> Job | Status:
        """The job as it may be placed now: when per-GPU-model quota rules keep its team off some models, the
        same job with its allowed models narrowed to the rest (or, when none is left, why it must wait).

        A narrowed request is a request of its own to the node index, so the memos and cached verdicts stay
        keyed by what they depend on. Only jobs of `restricted` teams are looked at; the answer follows the
        team's usage at the moment of asking, which this cycle's placements and evictions change."""
        if job.team not in self.restricted or not job.request.uses_gpu:
            return job
        allowed: tuple[str, ...] | None = None
        notes: list[Status] = []
        for plugin in self.plugins.restrictors:
            restriction = plugin.restrict_models(self.ctx, job)
            if restriction is None:
                continue
            notes.append(restriction.status)
            allowed = (
                restriction.allowed
                if allowed is None
                else tuple(m for m in allowed if m in restriction.allowed)
            )
        if allowed is None:
            self.model_notes.pop(job.id, None)
            return job
        note = notes[0] if len(notes) == 1 else Status(notes[0].code, "; ".join(n.reason for n in notes))
        self.model_notes[job.id] = note
        if not allowed:
            return note
        return replace(job, request=replace(job.request, gpu_models=allowed))

    def _without_models(
        self, view: Job, chosen: list[tuple[int, Node]], plan: list[tuple[int, tuple[Assignment, ...]]]
    ) -> Job | None:
        """The job without the GPU models a plan used (None when no model would be left)."""
        nodes = dict(chosen)
        used = set()
        for pos, assigns in plan:
            for a in assigns:
                card = _card(nodes[pos], a.gpu_index)
                if card is not None:
                    used.add(card.model)
        req = view.request
        remaining = tuple(m for m in (req.gpu_models or tuple(self.index.model_bits)) if m not in used)
        if not remaining or not used:
            return None
        return replace(view, request=replace(req, gpu_models=remaining))

    def _refused_on_models(self, job: Job, assignments: tuple[Assignment, ...]) -> Status | None:
        """A per-model rule's refusal of these exact assignments (None: every model they touch allows them)."""
        if job.team not in self.restricted:
            return None
        for plugin in self.plugins.model_checks:
            status = plugin.admit_assignments(self.ctx, job, assignments)
            if status is not None:
                return status
        return None

    def _try_place(
        self, job: Job, *, chosen: list[tuple[int, Node]] | None = None, stmt: _Statement | None = None
    ) -> bool:
        view = self._effective(job)
        if isinstance(view, Status):
            self.status[job.id] = view
            return False
        while True:
            pick = chosen if chosen is not None else self._choose(view)
            if pick is None:
                return False
            plan = self._plan(view, pick)
            if plan is None:
                return False
            assignments = tuple(a for _, assigns in plan for a in assigns)
            refused = self._refused_on_models(job, assignments)
            if refused is None:
                break
            # Charged exactly (a MIG instance rounds a slice up) a model would take the team past its limit
            # there: look again without the models this plan used, as if they had been ruled out up front.
            narrower = self._without_models(view, pick, plan) if chosen is None else None
            if narrower is None:
                self.status[job.id] = refused
                self.model_notes[job.id] = refused
                return False
            view = narrower
        charge = charge_of(assignments)
        borrowed = False
        if job.team in self.restricted:
            borrowed = any(
                p.borrowed_assignments(self.ctx, job, assignments) for p in self.plugins.model_borrowed
            )
        for plugin in self.plugins.admit:
            check = getattr(plugin, "admit_charge", None)
            if check is not None:
                status = check(self.ctx, job, charge)
                if status is not None:
                    self.status[job.id] = status
                    return False
            is_borrowed = getattr(plugin, "borrowed", None)
            if is_borrowed is not None and is_borrowed(self.ctx, job, charge):
                borrowed = True
        req = job.request
        cpu = {}
        for pos, assigns in plan:
            name = self.index.names[pos]
            cpu[name] = (req.cpu_milli, req.memory_mib)
            if stmt is not None:
                stmt.touch(pos)
            self._take(pos, assigns, req.cpu_milli, req.memory_mib)
        usage_add(self.ctx, job.team, charge[0], charge[1])
        if job.team in self.restricted:
            model_usage_add(self.ctx, job.team, assignments, 1)
        placement = Placement(job.id, assignments, borrowed, cpu)
        if stmt is not None:
            stmt.usage.append((job.team, charge[0], charge[1]))
            if job.team in self.restricted:
                stmt.model_usage.append((job.team, assignments, 1))
            stmt.placement = placement
        else:
            self.placements.append(placement)
            self.placed_jobs.append(job)
        self.status.pop(job.id, None)
        self.blocked.discard(job.id)
        return True

    def _take(self, pos: int, assigns: tuple[Assignment, ...], cpu_milli: int, memory_mib: int) -> None:
        if pos in self.real:
            self.real[pos] = allocate_on_node(self.real[pos], assigns, cpu_milli, memory_mib)
            self.index.set(pos, _overlay(self.real[pos], self.holds[pos]))
        else:
            self.index.set(
                pos,
                allocate_on_node(self.index.nodes[pos], assigns, cpu_milli, memory_mib),
                consumed_only=True,
            )

    def _give_back(self, pos: int, assigns: tuple[Assignment, ...], cpu_milli: int, memory_mib: int) -> None:
        if pos in self.real:
            self.real[pos] = release_on_node(self.real[pos], assigns, cpu_milli, memory_mib)
            self.index.set(pos, _overlay(self.real[pos], self.holds[pos]), consumed_only=False)
        else:
            self.index.set(
                pos,
                release_on_node(self.index.nodes[pos], assigns, cpu_milli, memory_mib),
                consumed_only=False,
            )

    # -- reservations --------------------------------------------------------------------------------------
    def pos_of(self, name: str) -> int | None:
        """The slot of a node in this snapshot (None for a node it does not list)."""
        slot = self.index.slot_of.get(name)
        return slot if slot is not None and self.index.present[slot] else None

    def _real_node(self, pos: int) -> Node:
        return self.real.get(pos) or self.index.nodes[pos]

    def _end_events(self) -> list[tuple[float, str, tuple[Assignment, ...], Job]]:
        """Running jobs (and this cycle's placements) with a known end, soonest first."""
        now = self.snap.now
        events = []
        for job in self.snap.running:
            if job.max_runtime_s is None or job.id in self.evicted:
                continue
            start = job.start_time if job.start_time is not None else now
            events.append((max(now, start + job.max_runtime_s), job.id, job.assignments, job))
        by_id = {p.job_id: p for p in self.placements}
        for job in self.placed_jobs:
            if job.max_runtime_s is not None and job.id in by_id:
                events.append((now + job.max_runtime_s, job.id, by_id[job.id].assignments, job))
        events.sort(key=lambda e: (e[0], e[1]))
        return events

    def _reserve(self, job: Job) -> None:
        """Hold the cards the job will get when enough running jobs end, and estimate when that is.

        When the running jobs' declared max runtimes never free enough room, the job still holds its best
        candidate cards (`_closest_candidates`): with the time the jobs it may preempt there pass the minimum
        runtime as its estimated start, or with no estimated start when it waits for jobs with no known end.
        Cards held with no start count as needed soon: no lower job may take them as they free up, so big jobs
        do not starve behind a stream of small ones."""
        req = job.request
        if not req.uses_gpu:
            return
        scratch: dict[int, Node] = {}

        def view(pos: int) -> Node:
            real = scratch.get(pos) or self._real_node(pos)
            return _overlay(real, self.holds.get(pos, []))

        ok, _ = self._feasible(job)
        fitting: set[int] = set(np.flatnonzero(ok).tolist())
        static = self.index.static(req)
        start = None
        for end, _, assignments, running in self._end_events():
            touched: dict[int, list[Assignment]] = {}
            for a in assignments:
                pos = self.pos_of(a.node)
                if pos is not None and static[pos]:
                    touched.setdefault(pos, []).append(a)
            for pos, assigns in touched.items():
                cpu, mem = job_host_on(running, self.index.names[pos])
                scratch[pos] = release_on_node(
                    scratch.get(pos) or self._real_node(pos), tuple(assigns), cpu, mem
                )
                if self._node_ok(job, view(pos)):
                    fitting.add(pos)
            if len(fitting) >= req.nodes:
                start = end
                break
        if start is not None:
            chosen = [(p, view(p)) for p in self.index.ranked(fitting)[: req.nodes]]
        else:
            if not self.param("reserve_unknown_start"):
                return
            found = self._closest_candidates(job, static, fitting)
            if found is None:
                return
            start, chosen = found
        plan = self._plan(job, chosen)
        if plan is None:
            return
        assignments = tuple(a for _, assigns in plan for a in assigns)
        self.reservations.append(Reservation(job.id, assignments, start))
        if start is not None:
            self.est_start[job.id] = start
        # An unknown start binds like an imminent one: no lower job's max runtime provably ends before it.
        self._hold(job, NEG_INF if start is None else start, plan)

    def _hold(self, job: Job, start: float, plan: list[tuple[int, tuple[Assignment, ...]]]) -> None:
        req = job.request
        for pos, assigns in plan:
            if pos not in self.real:
                self.real[pos] = self.index.nodes[pos]
            self.holds.setdefault(pos, []).append(
                _Held(job.id, start, assigns, req.cpu_milli, req.memory_mib)
            )
            self.index.set(pos, _overlay(self.real[pos], self.holds[pos]), consumed_only=True)

    def _closest_candidates(
        self, job: Job, static: np.ndarray, fitting: set[int]
    ) -> tuple[float | None, list[tuple[int, Node]]] | None:
        """Where the job gets in soonest when the declared ends alone never make room: per node, the running
        jobs are released in the order they are expected to go (by their declared end, or, for jobs this one
        may preempt, when they pass the minimum runtime; the rest, with no known end, oldest first) until the
        job fits; the node whose last needed release comes first wins (then fewest releases, then snapshot
        order). Returns that time (None when a job with no known end must go) and the nodes with the views to
        plan on. Only the `reservation_candidates` nodes with the most free room now are examined, which keeps
        this cheap on a large cluster; the room a reservation holds stays free, so the same node stays the
        closest from cycle to cycle."""
        req = job.request
        limit = max(int(self.param("reservation_candidates") or 0), 2 * req.nodes)
        idx = self.index
        cand = static.copy()
        if fitting:
            cand[list(fitting)] = False
        positions = np.flatnonzero(cand)
        if not len(positions):
            return None
        if req.gpus:
            room = idx.n_idle[positions]
        elif req.is_slice:
            room = idx.slice_comp[positions]
        else:
            room = idx.free_cpu[positions]
        # Most room first; ties to snapshot order.
        order = np.lexsort((idx.rank[positions], -room))
        examined = [int(p) for p in positions[order[:limit]]]
        by_pos = self._holdings_by_pos()
        placed_here = self._placed_on(examined)
        now = self.snap.now
        can_preempt = "preempt" in self.profile.actions
        min_runtime_s = float(self.param("min_runtime_s") or 0.0)

        def gone_by(v: Job, start_time: float | None) -> float:
            started = start_time if start_time is not None else now
            end = started + v.max_runtime_s if v.max_runtime_s is not None else INF
            if can_preempt and v.preemptible and v.priority < job.priority:
                # Evictable once past the minimum runtime (a job with no start time counts as old enough).
                end = min(end, started + min_runtime_s if start_time is not None else now)
            return max(now, end)

        ranked: list[tuple[tuple, int, Node]] = []
        for pos in examined:
            base = self._real_node(pos)
            holds = self.holds.get(pos, [])
            waits = [
                (
                    gone_by(h.job, h.job.start_time),
                    h.job.start_time if h.job.start_time is not None else now,
                    h.job.id,
                    h,
                )
                for h in by_pos.get(pos, ())
                if h.job.id not in self.evicted
            ]
            # A job placed earlier in this cycle is waited for only if its end is known (or it may be preempted).
            waits += [
                w
                for w in ((gone_by(h.job, now), now, h.job.id, h) for h in placed_here.get(pos, ()))
                if w[0] < INF
            ]
            waits.sort(key=lambda w: w[:3])
            node = _overlay(base, holds)
            if self._node_ok(job, node):
                ranked.append(((now, 0, int(idx.rank[pos])), pos, node))
                continue
            for n, (t, _, _, h) in enumerate(waits, start=1):
                base = release_on_node(base, tuple(h.assignments), h.cpu_milli, h.memory_mib)
                node = _overlay(base, holds)
                if self._node_ok(job, node):
                    ranked.append(((t, n, int(idx.rank[pos])), pos, node))
                    break
        ranked.sort(key=lambda t: t[0])
        nodes = [(pos, self.index.nodes[pos]) for pos in fitting]
        nodes += [(pos, node) for _, pos, node in ranked]
        if len(nodes) < req.nodes:
            return None
        start = max((key[0] for key, _, _ in ranked[: req.nodes - len(fitting)]), default=now)
        return (None if start == INF else start), nodes[: req.nodes]

    def _placed_on(self, positions: list[int]) -> dict[int, list[_Holding]]:
        """What this cycle's placements hold on these node positions (their jobs start now)."""
        names = {self.index.names[pos]: pos for pos in positions}
        out: dict[int, list[_Holding]] = {}
        if not self.placements:
            return out
        by_id = {j.id: j for j in self.placed_jobs}
        for p in self.placements:
            mine = [a for a in p.assignments if a.node in names]
            hosts = [n for n in p.cpu if n in names]
            if not mine and not hosts:
                continue
            job = by_id[p.job_id]
            for name in sorted(set(hosts) | {a.node for a in mine}):
                cpu, mem = p.cpu.get(name, (0, 0))
                assigns = [a for a in mine if a.node == name]
                out.setdefault(names[name], []).append(_Holding(job, assigns, cpu, mem))
        return out

    def _holdings_by_pos(self) -> dict[int, list[_Holding]]:
        """Node position -> what each running job (evictable or not) holds there; built once per cycle."""
        if self._all_by_pos is None:
            by_pos: dict[int, dict[str, _Holding]] = {}
            names = self.index.names
            for job in self.snap.running:
                for a in job.assignments:
                    pos = self.pos_of(a.node)
                    if pos is None:
                        continue
                    held = by_pos.setdefault(pos, {}).get(job.id)
                    if held is None:
                        cpu, mem = job_host_on(job, names[pos])
                        held = by_pos[pos][job.id] = _Holding(job, [], cpu, mem)
                    held.assignments.append(a)
                for name in job.cpu_assignments:
                    pos = self.pos_of(name)
                    if pos is not None and job.id not in by_pos.setdefault(pos, {}):
                        cpu, mem = job_host_on(job, name)
                        by_pos[pos][job.id] = _Holding(job, [], cpu, mem)
            self._all_by_pos = {pos: list(held.values()) for pos, held in by_pos.items()}
        return self._all_by_pos

    def _suspend_reservation(self, job_id: str) -> list[tuple[int, _Held]]:
        """Lift a job's own holds while it tries to get in another way (its holds must not block it)."""
        lifted: list[tuple[int, _Held]] = []
        for pos in sorted(self.holds):
            mine = [h for h in self.holds[pos] if h.job_id == job_id]
            if not mine:
                continue
            lifted += [(pos, h) for h in mine]
            kept = [h for h in self.holds[pos] if h.job_id != job_id]
            real = self.real[pos]
            if kept:
                self.holds[pos] = kept
            else:
                del self.holds[pos]
                del self.real[pos]
            self.index.set(pos, _overlay(real, kept), consumed_only=False)
        return lifted

    def _restore_holds(self, lifted: list[tuple[int, _Held]]) -> None:
        for pos, h in lifted:
            if pos not in self.real:
                self.real[pos] = self.index.nodes[pos]
            self.holds.setdefault(pos, []).append(h)
            self.index.set(pos, _overlay(self.real[pos], self.holds[pos]), consumed_only=True)

    def _drop_reservation(self, job_id: str) -> None:
        """A job that got in by eviction no longer needs what it had reserved."""
        if not any(r.job_id == job_id for r in self.reservations):
            return
        self.reservations = [r for r in self.reservations if r.job_id != job_id]
        self.est_start.pop(job_id, None)
        self._suspend_reservation(job_id)

    # -- reclaim and preempt (post-filter) -------------------------------------------------------------------
    def _running_by_pos(self) -> dict[int, list[_Holding]]:
        """Node position -> what each running job holds there (built once, only when eviction is considered)."""
        if self._by_pos is None:
            by_pos = self._holdings_by_pos()
            # Only what may ever be evicted: preemptible and past the minimum runtime; lowest priority first.
            now = self.snap.now
            min_runtime_s = float(self.param("min_runtime_s") or 0.0)

            def evictable(v: _Holding) -> bool:
                started = v.job.start_time
                return v.job.preemptible and (started is None or now - started >= min_runtime_s)

            self._by_pos = {}
            for pos, held in by_pos.items():
                victims = sorted((v for v in held if evictable(v)), key=lambda v: (v.job.priority, v.job.id))
                if victims:
                    self._by_pos[pos] = victims
        return self._by_pos

    def _victim_rule(self, job: Job, mode: str) -> Callable[[list[_Holding]], list[_Holding]] | None:
        """Picks, from a node's evictable holdings (preemptible, past the minimum runtime, lowest priority first),
        those this job may evict: lower priority ones (preempt), or other teams' borrowed ones (reclaim)."""
        evicted = self.evicted
        if mode == "preempt":
            priority = job.priority

            def lower(held: list[_Holding]) -> list[_Holding]:
                out = []
                for v in held:
                    if v.job.priority >= priority:
                        break
                    if v.job.id not in evicted:
                        out.append(v)
                return out

            return lower
        quota = self.snap.quotas.get(job.team)
        if quota is None:
            return None
        used = team_usage(self.ctx).get(job.team, (0, 0))
        if not within_guarantee(quota, used, min_charge(job.request)):
            return None
        team = job.team
        return lambda held: [
            v for v in held if v.job.borrowed and v.job.team != team and v.job.id not in evicted
        ]

    def _work_lost(self, v: Job) -> float:
        """GPU-seconds of progress an eviction throws away (running time x cards held)."""
        ran = self.snap.now - v.start_time if v.start_time is not None else 0.0
        _, comp = charge_of(v.assignments)
        return max(0.0, ran) * max(comp, 1) / WHOLE_GPU_MILLI

    def _release_all(self, pos: int, base: Node, victims: list[_Holding]) -> Node:
        node = release_many(base, [(tuple(v.assignments), v.cpu_milli, v.memory_mib) for v in victims])
        return _overlay(node, self.holds.get(pos, []))

    def _could_fit(self, job: Job, pos: int, victims: list[_Holding]) -> bool:
        """A cheap necessary condition for the job fitting on the node once all these victims are gone."""
        req = job.request
        node = self.index.nodes[pos]
        cpu = node.free_cpu_milli + sum(v.cpu_milli for v in victims)
        mem = node.free_memory_mib + sum(v.memory_mib for v in victims)
        if cpu < req.cpu_milli or mem < req.memory_mib:
            return False
        if not req.uses_gpu:
            return True
        freed: dict[int, list[int]] = {}
        for v in victims:
            for a in v.assignments:
                row = freed.setdefault(a.gpu_index, [0, 0, 0])
                row[0] += 1
                row[1] += a.memory_mib
                row[2] += a.compute_milli
        if req.gpus:
            count = 0
            for g in node.gpus:
                if gpu_matches(req, g):
                    row = freed.get(g.index)
                    if gpu_is_free(g) or (row is not None and row[0] >= g.holders):
                        count += 1
            return count >= req.gpus
        for g in node.gpus:
            if g.sharing is Sharing.EXCLUSIVE or not gpu_matches(req, g):
                continue
            row = freed.get(g.index, (0, 0, 0))
            free_mem = g.memory_mib - g.allocated_memory_mib + row[1]
            free_comp = compute_cap_milli(g, self.factor) - g.allocated_compute_milli + row[2]
            if free_mem >= req.gpu_memory_mib and free_comp >= req.gpu_compute_milli:
                return True
        return False

    def _victims_on(
        self, job: Job, pos: int, eligible: list[_Holding]
    ) -> tuple[tuple, list[_Holding]] | None:
        """The cheapest victim set on one node that lets the job fit there: greedy, then drop the unneeded."""
        if not self._could_fit(job, pos, eligible):
            return None
        base = self._real_node(pos)
        if not self._node_ok(job, self._release_all(pos, base, eligible)):
            return None
        order = sorted(eligible, key=lambda v: (v.job.priority, self._work_lost(v.job), v.job.id))
        chosen: list[_Holding] = []
        node = base
        for v in order:
            chosen.append(v)
            node = release_on_node(node, tuple(v.assignments), v.cpu_milli, v.memory_mib)
            if self._node_ok(job, _overlay(node, self.holds.get(pos, []))):
                break
        for v in list(reversed(chosen)) if len(chosen) > 1 else ():
            trial = [c for c in chosen if c is not v]
            if self._node_ok(job, self._release_all(pos, base, trial)):
                chosen = trial
        if not chosen:
            return (-1, 0.0, 0), []
        cost = (
            max(v.job.priority for v in chosen),
            sum(self._work_lost(v.job) for v in chosen),
            len(chosen),
        )
        return cost, chosen

    def _post_filter(self, queue: list[Job], *, mode: str) -> None:
        budget = int(self.param(f"{mode}_max_attempts") or 0)
        failed: set[tuple] = set()
        code = "preempted" if mode == "preempt" else "reclaimed"
        for job in queue:
            if budget <= 0:
                break
            if job.id not in self.blocked:
                continue
            # The job's own reservation must not stand in its way; it is put back if the job stays pending.
            lifted = self._suspend_reservation(job.id) if self.holds else []
            if self.evictions and self._try_place(job):
                self._drop_reservation(job.id)
                continue  # room freed by this cycle's evictions for an earlier job
            view = self._effective(job)
            if isinstance(view, Status):
                # Its team's per-model limits leave it no model (this cycle's evictions may have changed that
                # only for the better, and then the plain placement above took it).
                self.status[job.id] = view
                self.blocked.discard(job.id)
                if lifted:
                    self._restore_holds(lifted)
                continue
            rule = self._victim_rule(job, mode)
            key = (view.request, job.priority, job.team if mode == "reclaim" else "")
            if rule is not None and key not in failed:
                budget -= 1
                if self._evict_for(job, view, rule, code):
                    continue
                failed.add(key)
            if lifted:
                self._restore_holds(lifted)

    def _evict_for(
        self, job: Job, view: Job, rule: Callable[[list[_Holding]], list[_Holding]], code: str
    ) -> bool:
        """Evict for `job`, judging where it fits as `view` (the job with the GPU models it may use now)."""
        req = view.request
        static = self.index.static(req)
        candidates: list[tuple[tuple, int, list[_Holding]]] = []
        for pos, held in sorted(self._running_by_pos().items()):
            if not static[pos]:
                continue
            eligible = rule(held)
            if not eligible:
                continue
            found = self._victims_on(view, pos, eligible)
            if found is not None:
                candidates.append((found[0], pos, found[1]))
        if req.nodes > 1:
            ok, _ = self._feasible(view)
            candidates += [((-1, 0.0, 0), int(p), []) for p in np.flatnonzero(ok).tolist()]
        if len({pos for _, pos, _ in candidates}) < req.nodes or not candidates:
            return False
        rank = self.index.rank
        candidates.sort(key=lambda c: (c[0], int(rank[c[1]])))
        picked: list[tuple[int, list[Job]]] = []
        seen_pos: set[int] = set()
        for _, pos, victims in candidates:
            if pos not in seen_pos:
                seen_pos.add(pos)
                picked.append((pos, victims))
            if len(picked) == req.nodes:
                break
        victims_by_id: dict[str, Job] = {}
        for _, victims in picked:
            for v in victims:
                victims_by_id.setdefault(v.job.id, v.job)
        if not any(victims_by_id.values()) and req.nodes <= 1:
            return False
        stmt = _Statement(self)
        for v in sorted(victims_by_id.values(), key=lambda v: v.id):
            self._evict(v, code, stmt)
        chosen = [(pos, self.index.nodes[pos]) for pos, _ in picked]
        if all(self._node_ok(view, node) for _, node in chosen) and self._try_place(
            job, chosen=chosen, stmt=stmt
        ):
            stmt.commit(job)
            self._drop_reservation(job.id)
            return True
        stmt.rollback()
        return False

    def _evict(self, victim: Job, code: str, stmt: _Statement) -> None:
        """Give back everything a running job (a whole gang) holds, staged in the statement."""
        by_node: dict[str, list[Assignment]] = {}
        for a in victim.assignments:
            by_node.setdefault(a.node, []).append(a)
        for name in victim.cpu_assignments:
            by_node.setdefault(name, [])
        for name in sorted(by_node):
            pos = self.pos_of(name)
            if pos is None:
                continue
            stmt.touch(pos)
            cpu, mem = job_host_on(victim, name)
            self._give_back(pos, tuple(by_node[name]), cpu, mem)
        mem, comp = charge_of(victim.assignments)
        usage_add(self.ctx, victim.team, -mem, -comp)
        stmt.usage.append((victim.team, -mem, -comp))
        if victim.team in self.restricted:
            model_usage_add(self.ctx, victim.team, victim.assignments, -1)
            stmt.model_usage.append((victim.team, victim.assignments, -1))
        self.evicted.add(victim.id)
        stmt.evicted.append((victim, code))

    # -- pending reasons -------------------------------------------------------------------------------------
    def _pending(self, queue: list[Job]) -> list[Pending]:
        placed = {p.job_id for p in self.placements}
        explain = bool(self.param("explain"))
        explained: dict[Request, Status] = {}
        in_order = None  # the index in snapshot order, so reasons name the first node that qualifies
        holders = {r.job_id: r for r in self.reservations}
        rows: list[tuple[Job, Status, int]] = []
        position = 0
        for job in queue:
            if job.id in placed:
                continue
            position += 1
            status = self.status.get(job.id)
            note = ""
            # The job as it may be placed now: per-model quota limits may leave it fewer GPU models (or none).
            subject = job
            if job.team in self.restricted and job.request.uses_gpu:
                view = self.views[job.id] = self._effective(job)
                if isinstance(view, Status):
                    status = status or view
                else:
                    subject = view
            if status is None and job.id in holders:
                held = holders[job.id]
                where = ", ".join(sorted({a.node for a in held.assignments}))
                if held.estimated_start is not None:
                    when = f"it should start in about {_duration(held.estimated_start - self.snap.now)}"
                    status = Status(
                        WAITING_FOR_RESERVATION,
                        f"capacity is reserved for it on {where}; {when}, when the jobs running there end or can be "
                        "preempted",
                    )
                else:
                    # No start is known: say what is missing now, and that the room is held for it.
                    note = (
                        f"; cards are held for it on {where} as they free up (the jobs running there declare "
                        "no max runtime, so no start can be estimated)"
                    )
            if status is None and not explain:
                status = Status(NO_FIT, "no node can host it now")
            if status is None and job.id not in self.blocked and "allocate" not in self.profile.actions:
                status = Status(NOT_REACHED, "this profile does not allocate")
            if status is None and job.id not in holders:
                status = self._reserved_reason(subject)
            if status is None:
                req = subject.request
                status = explained.get(req)
                if status is None:
                    ok, _ = self._feasible(subject)
                    if job.id in self.blocked and int(ok.sum()) >= max(1, req.nodes):
                        # It did not fit when its turn came; evictions for a later job freed room since.
                        first = self.index.ranked(np.flatnonzero(ok).tolist())[0]
                        status = Status(
                            BEING_FREED,
                            f"room is being freed on {self.index.names[first]} by this cycle's evictions; "
                            "it should start in the next cycle",
                        )
                        rows.append((job, self._with_model_note(job, subject, status), position))
                        continue
                    if in_order is None:
                        in_order = self.index.in_order()
                    status = self._filtered_reason(subject, ok) or explain_cluster(
                        req, in_order, ok[self.index.order], self.factor
                    )
                    explained[req] = status
            if note:
                status = Status(status.code, status.reason + note)
            if subject is not job and job.id not in self.status:
                status = self._with_model_note(job, subject, status)
            rows.append((job, status, position))
        return self._with_estimates(rows, explain)

    def _with_model_note(self, job: Job, view: Job, status: Status) -> Status:
        """The pending reason of a job that per-model limits keep off some GPU models. When it would fit now on
        a model it may not use, the limit is what holds it back: `model-quota-limit`, naming the limit, then what
        the models left to it lack. Otherwise it waits like any job, and the reason adds the limit."""
        if view is job:
            return status
        note = self.model_notes[job.id].reason
        if status.code in (NO_FIT, INSUFFICIENT_HOST) or status.code in _WAITING_FOR_ROOM:
            whole, _ = self._feasible(job)
            if int(whole.sum()) >= max(1, job.request.nodes):
                return Status(
                    MODEL_QUOTA_LIMIT, f"{note}; on the GPU models it may still use: {status.reason}"
                )
        return Status(status.code, f"{status.reason}; {note}")

    def _with_estimates(self, rows: list[tuple[Job, Status, int]], explain: bool) -> list[Pending]:
        """The pending list, each job with its estimated start: its reservation's where it has one, else a
        projection in queue order (`StartProjection`); the reason sentence names it."""
        projection = StartProjection.build(self) if rows and self.param("estimate_starts") else None
        est_start = self.est_start
        if projection is None and not est_start:
            return [Pending(job.id, status, position, None) for job, status, position in rows]
        now = self.snap.now
        # Jobs with the same reason and the same rounded estimate share one Status (fewer objects per cycle).
        with_eta: dict[tuple[int, str], Status] = {}
        out = []
        for job, status, position in rows:
            eta = None
            view = self.views.get(job.id, job)
            if status.code not in _NO_ESTIMATE and not isinstance(view, Status):
                if projection is not None:
                    eta = projection.start(view)
                held = est_start.get(job.id)
                if held is not None:
                    eta = held
            if eta is not None and explain and status.code != WAITING_FOR_RESERVATION:
                text = _duration(eta - now)
                key = (id(status), text)
                shared = with_eta.get(key)
                if shared is None:
                    shared = with_eta[key] = Status(
                        status.code,
                        f"{status.reason}; estimated start in about {text} (from the running jobs' max runtimes)",
                    )
                status = shared
            out.append(Pending(job.id, status, position, eta))
        return out

    def _filtered_reason(self, job: Job, ok: np.ndarray) -> Status | None:
        """When the profile has filters of its own and one refused a node that had room, say which and why."""
        extra = (*self.plugins.cached_filters, *self.plugins.live_filters)
        if not extra or ok.any():
            return None
        nodes = self.index.nodes
        for pos in self.index.ranked(np.flatnonzero(self.index.coarse(job.request)).tolist()):
            if not node_fits(job.request, nodes[pos], self.factor):
                continue
            for f in extra:
                status = f.filter(self.ctx, job, nodes[pos])
                if status is not None:
                    return Status(FILTERED, f"{f.NAME} refused {nodes[pos].name}: {status.reason}")
        return None

    def _reserved_reason(self, job: Job) -> Status | None:
        """If the job would fit but for a reservation, say whose and until when."""
        if not self.holds or job.id not in self.blocked:
            return None
        key = (job.request, "reserved")
        if key not in self._reason_cache:
            self._reason_cache[key] = self._reserved_reason_for(job)
        return self._reason_cache[key]

    def _reserved_reason_for(self, job: Job) -> Status | None:
        for pos in self.index.ranked(self.holds):
            if self._node_ok(job, self.real[pos]):
                first = min(self.holds[pos], key=lambda h: h.start)
                name = self.index.names[pos]
                if first.job_id not in self.est_start:
                    return Status(
                        RESERVED,
                        f"the free capacity that fits it on {name} is reserved for job {first.job_id}, which "
                        "waits for the jobs running there to end; no start can be estimated, so nothing lower "
                        "may use it",
                    )
                return Status(
                    RESERVED,
                    f"the free capacity that fits it on {name} is reserved for job {first.job_id}, "
                    f"which should start in about {_duration(first.start - self.snap.now)}; it could run there "
                    "now if its max runtime ended before then",
                )
        return None


# Reasons that say the job's GPU capacity is missing now (a per-model limit may be what is in the way).
_WAITING_FOR_ROOM = frozenset(
    {INSUFFICIENT_GPUS, NO_NVLINK_GROUP, NO_NUMA_GROUP, NO_SLICE, GANG_INCOMPLETE, NO_MATCHING_GPU}
)

# Pending jobs that wait for something other than GPU capacity: no start is projected for them.
_NO_ESTIMATE = frozenset(
    {QUOTA_LIMIT, NOT_REACHED, FILTERED, NODE_UNAVAILABLE, NO_MATCHING_GPU, INSUFFICIENT_HOST, BEING_FREED}
)


class _Pool:
    """Free capacity of one kind (idle whole cards, or free compute milli on shared cards) of one GPU model,
    as a timeline: what is free at `time`, and the releases still to come, soonest first."""

    __slots__ = ("free", "time", "events", "next", "future", "memo")

    def __init__(self, free: int, now: float):
        self.free = free
        self.time = now
        self.events: list[tuple[float, int]] = []
        self.next = 0
        self.future = 0
        # need -> earliest(need), until the pool changes: many queued jobs ask the same of a pool they skip.
        self.memo: dict[int, tuple[float, int] | None] = {}

    def earliest(self, need: int, now: float) -> tuple[float, int] | None:
        """When `need` is free (strictly after now: the job did not fit now), and the event index reached."""
        if self.free + self.future < need:
            return None
        memo = self.memo
        if need in memo:
            return memo[need]
        free, i, time, events = self.free, self.next, self.time, self.events
        n = len(events)
        found: tuple[float, int] | None = None
        while True:
            if free >= need and time > now:
                found = (time, i)
                break
            if i >= n:
                break
            time, amount = events[i]
            free += amount
            i += 1
            # Releases at one instant count together.
            while i < n and events[i][0] == time:
                free += events[i][1]
                i += 1
        memo[need] = found
        return found

    def take(self, need: int, at: float, upto: int, until: float | None) -> None:
        self.memo.clear()
        for _, amount in self.events[self.next : upto]:
            self.free += amount
            self.future -= amount
        self.next, self.time = upto, at
        self.free -= need
        if until is not None:
            insort(self.events, (until, need), lo=self.next, key=_event_time)
            self.future += need


def _event_time(e: tuple[float, int]) -> float:
    return e[0]


def _gives_back(
    cycle: _Cycle, assignments: tuple[Assignment, ...]
) -> tuple[tuple[tuple[str, bool], int], ...]:
    """What a job's cards give back to the projection's pools when it ends: idle cards, shared compute."""
    out: dict[tuple[str, bool], int] = {}
    for a in assignments:
        pos = cycle.pos_of(a.node)
        if pos is None:
            continue
        g = _card(cycle._real_node(pos), a.gpu_index)
        if g is None or g.health is Health.FAILED:
            continue
        is_shared = g.sharing is not Sharing.EXCLUSIVE
        if a.compute_milli >= WHOLE_GPU_MILLI and a.memory_mib >= g.memory_mib:
            out[(g.model, False)] = out.get((g.model, False), 0) + 1
            if is_shared:
                out[(g.model, True)] = out.get((g.model, True), 0) + WHOLE_GPU_MILLI
        elif is_shared:
            out[(g.model, True)] = out.get((g.model, True), 0) + a.compute_milli
    return tuple(out.items())


def _card(node: Node, gpu_index: int) -> Any:
    gpus = node.gpus
    if gpu_index < len(gpus) and gpus[gpu_index].index == gpu_index:
        return gpus[gpu_index]
    return next((g for g in gpus if g.index == gpu_index), None)


def _pool_row(node: Node, factor: float) -> tuple:
    """What a node adds to the projection's pools, per GPU model: (model, card memory MiB, compute capability,
    has shared cards, idle cards, free compute milli on shared cards)."""
    per: dict[str, list] = {}
    for g in node.gpus:
        if g.health is Health.FAILED:
            continue
        row = per.get(g.model)
        if row is None:
            row = per[g.model] = [g.model, g.memory_mib, g.compute_capability, False, 0, 0]
        if g.sharing is not Sharing.EXCLUSIVE:
            row[3] = True
            if g.allocated_memory_mib < g.memory_mib:
                row[5] += max(0, compute_cap_milli(g, factor) - g.allocated_compute_milli)
        if gpu_is_free(g):
            row[4] += 1
    return tuple(tuple(r) for r in per.values())


class StartProjection:
    """A cheap estimate of when each pending job starts: per GPU model, the cluster's idle cards and free shared
    compute now, plus what the running jobs give back at their declared ends (`start_time + max_runtime_s`);
    pending jobs take capacity in queue order (holding it for their own max runtime, or for good when they
    declare none). It ignores which node the capacity is on, so it is a lower bound for jobs that need many
    cards on one node. A job gets None when the capacity it needs is never known to come free."""

    def __init__(self, cycle: _Cycle, pools: dict[tuple[str, bool], _Pool], models: dict[str, tuple]):
        self.cycle = cycle
        self.pools = pools
        self.models = models  # model -> (card memory MiB, compute capability, has shared cards)
        self._by_request: dict[tuple, list[tuple[tuple[str, bool], int]]] = {}

    @classmethod
    def build(cls, cycle: _Cycle) -> StartProjection | None:
        snap, now = cycle.snap, cycle.snap.now
        ends: list[tuple[float, Job, tuple[Assignment, ...]]] = []
        for job in snap.running:
            if job.max_runtime_s is not None and job.id not in cycle.evicted:
                start = job.start_time if job.start_time is not None else now
                ends.append((max(now, start + job.max_runtime_s), job, job.assignments))
        if not ends:
            return None  # nothing is known to end: no estimate can be made
        by_id = {p.job_id: p for p in cycle.placements}
        for job in cycle.placed_jobs:
            if job.max_runtime_s is not None and job.id in by_id:
                ends.append((now + job.max_runtime_s, job, by_id[job.id].assignments))
        index = cycle.index
        models: dict[str, tuple] = {}
        idle: dict[str, int] = {}
        shared: dict[str, int] = {}
        factor = cycle.factor

        def add(row: tuple, times: int) -> None:
            for model, memory_mib, cc, has_shared, idle_cards, room_milli in row:
                known = models.get(model)
                if known is None or (has_shared and not known[2]):
                    models[model] = (memory_mib, cc, has_shared or bool(known and known[2]))
                idle[model] = idle.get(model, 0) + idle_cards * times
                shared[model] = shared.get(model, 0) + room_milli * times

        # Nodes of one shape contribute alike: count shapes, summarise each once (and keep it across cycles).
        usable = index.present & index.ready
        held = [pos for pos in cycle.real if usable[pos]]
        if held:
            usable = usable.copy()
            usable[held] = False
            for pos in held:
                add(_pool_row(cycle.real[pos], factor), 1)
        shapes, counts = np.unique(index.shape[usable], return_counts=True)
        rows = index.pool_rows
        first_pos = None
        for sid, count in zip(shapes.tolist(), counts.tolist(), strict=True):
            row = rows.get(sid)
            if row is None:
                if first_pos is None:
                    first_pos = {}
                    for pos in np.flatnonzero(usable).tolist():
                        first_pos.setdefault(int(index.shape[pos]), pos)
                row = rows[sid] = _pool_row(index.nodes[first_pos[sid]], factor)
            add(row, count)
        pools: dict[tuple[str, bool], _Pool] = {}
        for model in models:
            pools[(model, False)] = _Pool(idle.get(model, 0), now)
            pools[(model, True)] = _Pool(shared.get(model, 0), now)
        releases: dict[tuple[str, bool], list[tuple[float, int]]] = {}
        # What a running job gives back, per pool, is kept between cycles: its cards do not change.
        memo = cycle.state.releases
        seen: dict[str, tuple] = {}
        for end, job, assignments in ends:
            known = memo.get(job.id)
            if known is not None and known[0] is assignments:
                gives = known[1]
            else:
                gives = _gives_back(cycle, assignments)
            seen[job.id] = (assignments, gives)
            for key, amount in gives:
                releases.setdefault(key, []).append((end, amount))
        cycle.state.releases = seen
        for key, events in releases.items():
            events.sort(key=_event_time)
            pool = pools[key]
            pool.events = events
            pool.future = sum(amount for _, amount in events)
        return cls(cycle, pools, models)

    def _options(self, req: Request) -> list[tuple[tuple[str, bool], int]]:
        """The pools a request may draw on, with what it needs from each (cards, or compute milli)."""
        # Keyed by the fields that matter here: hashing a whole Request costs more than the work it saves.
        key = (
            req.gpus,
            req.nodes,
            req.gpu_memory_mib,
            req.gpu_compute_milli,
            req.gpu_models,
            req.min_gpu_memory_mib,
            req.min_compute_capability,
        )
        options = self._by_request.get(key)
        if options is None:
            options = []
            shared = not req.gpus
            if shared and not req.is_slice:
                pass  # CPU-only: no GPU capacity to wait for
            else:
                for model, (memory_mib, cc, has_shared) in self.models.items():
                    if req.gpu_models and model not in req.gpu_models:
                        continue
                    if memory_mib < max(req.min_gpu_memory_mib, req.gpu_memory_mib if shared else 0):
                        continue
                    if cc < req.min_compute_capability or (shared and not has_shared):
                        continue
                    if shared:
                        # A slice naming only memory holds the proportional compute share.
                        share = -(-WHOLE_GPU_MILLI * req.gpu_memory_mib // memory_mib)
                        need = max(req.gpu_compute_milli, share, 1)
                    else:
                        need = req.gpus * req.nodes
                    options.append(((model, shared), need))
            self._by_request[key] = options
        return options

    def start(self, job: Job) -> float | None:
        """The job's projected start (None when unknowable); it then holds that capacity in the projection."""
        now = self.cycle.snap.now
        best: tuple[float, tuple[str, bool], int, int] | None = None
        pools = self.pools
        for key, need in self._options(job.request):
            found = pools[key].earliest(need, now)
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], key, need, found[1])
        if best is None:
            return None
        at, key, need, upto = best
        until = at + job.max_runtime_s if job.max_runtime_s is not None else None
        pools[key].take(need, at, upto, until)
        return at


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
