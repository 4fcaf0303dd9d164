"""The session: one cycle's working state over an immutable snapshot.

It keeps a working copy of the nodes in the profile's `NodeIndex`, the cards reservations hold (the node as other
jobs see it is the real node with those holds overlaid), and what the cycle decided so far: placements,
evictions, reservations and each pending job's status. Actions change it only through the methods here (and a
`Statement`, which saves what they touch so it can be put back).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from scheduling.engine.accounting import RUNNING_MEMO_KEY
from scheduling.engine.framework import DEFAULT_PARAMS, CycleContext
from scheduling.engine.index import NodeIndex
from scheduling.engine.resources import (
    DEFAULT_TIMESLICE_FACTOR,
    allocate_on_node,
    gpu_with,
    job_host_on,
    node_with,
    release_on_node,
)
from scheduling.engine.state import EngineState
from scheduling.engine.types import (
    WHOLE_GPU_MILLI,
    Assignment,
    Eviction,
    Job,
    Node,
    Placement,
    Reservation,
    Snapshot,
    Status,
)


@dataclass(slots=True)
class Holding:
    """What one running job holds on one node."""

    job: Job
    assignments: list[Assignment]
    cpu_milli: int
    memory_mib: int


@dataclass(slots=True)
class Held:
    """A reservation's hold on one node."""

    job_id: str
    start: float
    assignments: tuple[Assignment, ...]
    cpu_milli: int
    memory_mib: int


def overlay(real: Node, holds: list[Held]) -> Node:
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


def _soonest(event: tuple) -> tuple[float, str]:
    return (event[0], event[1])


def card(node: Node, gpu_index: int) -> Any:
    """The node's card with this index (None when it has none)."""
    gpus = node.gpus
    if gpu_index < len(gpus) and gpus[gpu_index].index == gpu_index:
        return gpus[gpu_index]
    return next((g for g in gpus if g.index == gpu_index), None)


class Session:
    """One cycle over one snapshot for one profile. What the actions read and change, and what they decided."""

    def __init__(self, state: EngineState, snapshot: Snapshot):
        self.state = state
        self.snap = snapshot
        self.profile = state.profile
        self.plugins = state.plugins
        self.ctx = CycleContext(snapshot=snapshot, profile=self.profile, rng=random.Random(snapshot.seed))
        self.ctx.cache[RUNNING_MEMO_KEY] = self.running_memo()
        self.factor = float(self.param("timeslice_oversubscription"))
        self._sync_index()
        self.index: NodeIndex = state.index  # type: ignore[assignment]
        self.index.touched = set()
        self.queue: list[Job] = []
        # What the profile's actions enable (each action's `prepare` says): allocation at all, reservations and
        # backfill inside allocation, and preemption (which a reservation's estimated start counts on).
        self.allocates = False
        self.reserves = False
        self.preempts = False
        # Moving work to make room (`moves.py`), at a blocked job's turn in allocation: how many more jobs may
        # try this cycle (the `consolidate` action sets it), and the requests that found no room.
        self.moves_left = 0
        self.moves_tried: set[tuple] = set()
        # Per pending job that held a reservation at the previous cycle and lost it: why (its pending reason says).
        self.reservation_notes: dict[str, str] = {}
        self.real: dict[int, Node] = {}  # positions under a reservation: the node without the overlay
        self.holds: dict[int, list[Held]] = {}
        self.held_at: dict[str, set[int]] = {}  # job id -> the positions its reservation holds
        self.placements: list[Placement] = []
        self.placed_jobs: list[Job] = []
        self.evictions: list[Eviction] = []
        self.reservations: list[Reservation] = []
        self.status: dict[str, Status] = {}
        self.blocked: set[str] = set()  # pending for lack of room (eviction may help)
        self.est_start: dict[str, float] = {}
        self.evicted: set[str] = set()
        # (min runtime, pinned too) -> node position -> what eviction may take there (built by eviction, once)
        self.evictable_by_pos: dict[tuple, dict[int, list[Holding]]] | None = None
        self._all_by_pos: dict[int, list[Holding]] | None = None
        self._end_events: tuple[tuple[frozenset[str], int], list] | None = None
        self.reason_cache: dict[tuple, Status | None] = {}
        # (request, max runtime) -> the index's release clock when no node could take it (`placement.choose`)
        self.no_room: dict[tuple, int] = {}
        # Teams with per-GPU-model quota rows (asked once, before anything is placed), and per job the latest
        # per-model limit that kept it off some model (named in its pending reason).
        self.restricted: frozenset[str] = frozenset()
        if self.plugins.restrictors:
            self.restricted = frozenset().union(
                *(p.restricted_teams(self.ctx) for p in self.plugins.restrictors)
            )
        self.model_notes: dict[str, Status] = {}
        self.views: dict[
            str, Job | Status
        ] = {}  # pending job -> how the pending reasons explained and project it

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

    def close(self) -> None:
        """Hand the index back: the next cycle re-reads from its snapshot the slots this one changed."""
        snap_nodes, nodes = self.index.snap_nodes, self.index.nodes
        self.state.dirty = {p for p in self.index.touched if nodes[p] is not snap_nodes[p]}
        self.index.touched = set()

    # -- nodes ---------------------------------------------------------------------------------------------
    def pos_of(self, name: str) -> int | None:
        """The slot of a node in this snapshot (None for a node it does not list)."""
        slot = self.index.slot_of.get(name)
        return slot if slot is not None and self.index.present[slot] else None

    def real_node(self, pos: int) -> Node:
        """The node without reservations' holds."""
        return self.real.get(pos) or self.index.nodes[pos]

    def take(self, pos: int, assigns: tuple[Assignment, ...], cpu_milli: int, memory_mib: int) -> None:
        if pos in self.real:
            self.real[pos] = allocate_on_node(self.real[pos], assigns, cpu_milli, memory_mib)
            self.index.set(pos, overlay(self.real[pos], self.holds[pos]))
        else:
            self.index.set(
                pos,
                allocate_on_node(self.index.nodes[pos], assigns, cpu_milli, memory_mib),
                consumed_only=True,
            )

    def give_back(self, pos: int, assigns: tuple[Assignment, ...], cpu_milli: int, memory_mib: int) -> None:
        if pos in self.real:
            self.real[pos] = release_on_node(self.real[pos], assigns, cpu_milli, memory_mib)
            self.index.set(pos, overlay(self.real[pos], self.holds[pos]), consumed_only=False)
        else:
            self.index.set(
                pos,
                release_on_node(self.index.nodes[pos], assigns, cpu_milli, memory_mib),
                consumed_only=False,
            )

    # -- reservations' holds ---------------------------------------------------------------------------------
    def hold(self, job: Job, start: float, plan: list[tuple[int, tuple[Assignment, ...]]]) -> None:
        req = job.request
        for pos, assigns in plan:
            if pos not in self.real:
                self.real[pos] = self.index.nodes[pos]
            self.holds.setdefault(pos, []).append(Held(job.id, start, assigns, req.cpu_milli, req.memory_mib))
            self.held_at.setdefault(job.id, set()).add(pos)
            self.index.set(pos, overlay(self.real[pos], self.holds[pos]), consumed_only=True)

    def suspend_reservation(self, job_id: str) -> list[tuple[int, Held]]:
        """Lift a job's own holds while it tries to get in another way (its holds must not block it)."""
        if job_id not in self.held_at:
            return []
        lifted: list[tuple[int, Held]] = []
        for pos in sorted(self.held_at.pop(job_id)):
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
            self.index.set(pos, overlay(real, kept), consumed_only=False)
        return lifted

    def restore_holds(self, lifted: list[tuple[int, Held]]) -> None:
        for pos, h in lifted:
            if pos not in self.real:
                self.real[pos] = self.index.nodes[pos]
            self.holds.setdefault(pos, []).append(h)
            self.held_at.setdefault(h.job_id, set()).add(pos)
            self.index.set(pos, overlay(self.real[pos], self.holds[pos]), consumed_only=True)

    def drop_reservation(self, job_id: str) -> None:
        """A job that got in by eviction no longer needs what it had reserved."""
        if not any(r.job_id == job_id for r in self.reservations):
            return
        self.reservations = [r for r in self.reservations if r.job_id != job_id]
        self.est_start.pop(job_id, None)
        self.suspend_reservation(job_id)

    # -- what runs where -------------------------------------------------------------------------------------
    def running_memo(self) -> dict[Any, Any]:
        """Parts that follow from the snapshot's nodes, running jobs and time alone, kept across cycles while
        those stay the same objects (what-ifs asked on one snapshot). What is kept here is never changed."""
        snap, memo = self.snap, self.state.running_memo
        if memo is None or memo[0] is not snap.nodes or memo[1] is not snap.running or memo[2] != snap.now:
            memo = self.state.running_memo = (snap.nodes, snap.running, snap.now, {})
        return memo[3]

    def end_events(self) -> list[tuple[float, str, tuple[Assignment, ...], Job]]:
        """Running jobs (and this cycle's placements) with a known end, soonest first. Shared until an eviction
        or a placement changes it: do not change it."""
        key = (frozenset(self.evicted), len(self.placements))  # placements are only ever added
        if self._end_events is not None and self._end_events[0] == key:
            return self._end_events[1]
        now = self.snap.now
        kept = self.running_memo()
        events = kept.get(("ends", key[0]))
        if events is None:
            events = []
            for job in self.snap.running:
                if job.max_runtime_s is None or job.id in self.evicted:
                    continue
                start = job.start_time if job.start_time is not None else now
                events.append((max(now, start + job.max_runtime_s), job.id, job.assignments, job))
            events.sort(key=_soonest)
            if not key[0]:
                kept[("ends", key[0])] = events
        if self.placements:
            by_id = {p.job_id: p for p in self.placements}
            placed = [
                (now + job.max_runtime_s, job.id, by_id[job.id].assignments, job)
                for job in self.placed_jobs
                if job.max_runtime_s is not None and job.id in by_id
            ]
            if placed:
                events = sorted([*events, *placed], key=_soonest)
        self._end_events = (key, events)
        return events

    def releases_of(
        self, job: Job, assignments: tuple[Assignment, ...]
    ) -> tuple[tuple[int, tuple[Assignment, ...], int, int], ...]:
        """What a job gives back when it ends: (node position, its cards there, host cpu_milli, host
        memory_mib) per node of this snapshot."""
        releases = self.running_memo().setdefault("releases", {})
        known = releases.get(job.id)
        if known is not None and known[0] is assignments:
            return known[1]
        per: dict[int, list[Assignment]] = {}
        for a in assignments:
            pos = self.pos_of(a.node)
            if pos is not None:
                per.setdefault(pos, []).append(a)
        names = self.index.names
        out = tuple((pos, tuple(mine), *job_host_on(job, names[pos])) for pos, mine in per.items())
        releases[job.id] = (assignments, out)
        return out

    def placed_on(self, positions: list[int]) -> dict[int, list[Holding]]:
        """What this cycle's placements hold on these node positions (their jobs start now)."""
        names = {self.index.names[pos]: pos for pos in positions}
        out: dict[int, list[Holding]] = {}
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
                out.setdefault(names[name], []).append(Holding(job, assigns, cpu, mem))
        return out

    def holdings_by_pos(self) -> dict[int, list[Holding]]:
        """Node position -> what each running job (evictable or not) holds there; built once per cycle."""
        if self._all_by_pos is None:
            kept = self.running_memo().get("by_pos")
            if kept is not None:
                self._all_by_pos = kept
                return kept
            by_pos: dict[int, dict[str, Holding]] = {}
            names = self.index.names
            for job in self.snap.running:
                for a in job.assignments:
                    pos = self.pos_of(a.node)
                    if pos is None:
                        continue
                    held = by_pos.setdefault(pos, {}).get(job.id)
                    if held is None:
                        cpu, mem = job_host_on(job, names[pos])
                        held = by_pos[pos][job.id] = Holding(job, [], cpu, mem)
                    held.assignments.append(a)
                for name in job.cpu_assignments:
                    pos = self.pos_of(name)
                    if pos is not None and job.id not in by_pos.setdefault(pos, {}):
                        cpu, mem = job_host_on(job, name)
                        by_pos[pos][job.id] = Holding(job, [], cpu, mem)
            self._all_by_pos = {pos: list(held.values()) for pos, held in by_pos.items()}
            self.running_memo()["by_pos"] = self._all_by_pos
        return self._all_by_pos
