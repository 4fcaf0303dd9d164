"""What a simulated run measures about guarantees and fairness, kept up to date as jobs move (never by rescanning
the cluster): quota satisfaction, time to guarantee, evictions of guaranteed work, priority inversions, the split
of borrowed capacity and Jain's index. The definitions are the engine's (`scheduling.engine.accounting`).

`Simulator` tells a `GuaranteeTracker` when a job waits, is placed, starts, stops running or is evicted, and
advances it with the clock; `finish` returns the raw `GuaranteeFigures` that `metrics.summarize` reports.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scheduling.engine.accounting import (
    beyond_guarantee,
    effective_quotas,
    estimated_charge,
    has_guarantee,
    keeps_guarantee,
    within_guarantee,
)
from scheduling.engine.resources import charge_of
from scheduling.engine.types import WHOLE_GPU_MILLI, Assignment, Node, NodeState, Quota, Snapshot

if TYPE_CHECKING:
    from scheduling.sim.workload import SimJob

_MIN_WEIGHT = 1e-9  # a team weighted 0 still takes what nobody else wants


def water_fill(total: float, caps: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    """Weighted max-min split of `total` among claimants: shares in proportion to weight, none above its cap,
    and what a capped claimant cannot take goes to the others in the same proportion."""
    out = dict.fromkeys(caps, 0.0)
    left, weight_left = float(total), sum(weights[t] for t in caps)
    for team in sorted(caps, key=lambda t: (caps[t] / weights[t], t)):
        if left <= 0 or weight_left <= 0:
            break
        share = min(caps[team], left * weights[team] / weight_left)
        out[team] = share
        left -= share
        weight_left -= weights[team]
    return out


def jain_index(values: Iterable[float]) -> float | None:
    """(sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one has everything; None for no values."""
    xs = list(values)
    squares = sum(x * x for x in xs)
    if not xs or squares <= 0:
        return None
    return sum(xs) ** 2 / (len(xs) * squares)


def card_models(nodes: Iterable[Node]) -> dict[str, tuple[int, int]]:
    """model -> (smallest, largest) card memory MiB, the `models` argument of `estimated_charge`."""
    models: dict[str, tuple[int, int]] = {}
    for node in nodes:
        for gpu in node.gpus:
            lo, hi = models.get(gpu.model, (gpu.memory_mib, gpu.memory_mib))
            models[gpu.model] = (min(lo, gpu.memory_mib), max(hi, gpu.memory_mib))
    return models


@dataclass(frozen=True, slots=True)
class TeamFigures:
    """One team's raw figures over the window: time integrals and the episodes it waited for its guarantee."""

    wanted_s: float  # time the team (with a guarantee) held or wanted any GPU
    satisfied_s: float  # integral of the instant satisfaction over that time
    episodes_s: tuple[float, ...]  # time to guarantee of each episode, open ones up to the end of the window
    open_episodes: int  # episodes still open at the end (their wait so far is in episodes_s)
    held_milli_s: float  # integral of the compute the team held
    fair_milli_s: float  # integral of its weighted max-min fair share of the capacity
    priority_inversions: int  # its jobs that started ahead of an earlier, higher-priority job of the team
    within_guarantee_evictions: int  # its within-guarantee jobs evicted for another team


@dataclass(frozen=True, slots=True)
class OwedJob:
    """A job that was owed (waiting within its team's guarantee) at some time: how long it waited while owed
    before it started (or until the end of the window, when it never started)."""

    job_id: str
    team: str
    owed_s: float
    started: bool


@dataclass(frozen=True, slots=True)
class GuaranteeFigures:
    teams: Mapping[str, TeamFigures]
    evictions_cross_team: int
    evictions_within_team: int
    within_guarantee_evictions_by_other_teams: int
    priority_inversions: int
    borrowed_s: float  # time with any capacity borrowed
    share_error_s: float  # integral of the borrowed-share error over that time
    owed_jobs: tuple[OwedJob, ...] = ()


@dataclass(slots=True)
class _Team:
    quota: Quota | None
    weight: float
    held: list[int] = field(default_factory=lambda: [0, 0])  # exact charge of its running jobs (MiB, milli)
    # The same by priority: what stands before a waiting job of that priority in the team's guarantee.
    held_by_priority: dict[int, list[int]] = field(default_factory=dict)
    # Waiting jobs (pending, or placed and waiting for their victims): id -> estimated charge; and in the order
    # they are owed their guarantee: highest priority first, then submit time.
    waiting: dict[str, tuple[int, int]] = field(default_factory=dict)
    order: list[tuple[int, float, str]] = field(default_factory=list)
    owed_ids: frozenset[str] = frozenset()
    waiting_milli: int = 0
    waiting_mem_sizes: Counter[int] = field(default_factory=Counter)
    waiting_milli_sizes: Counter[int] = field(default_factory=Counter)
    # Its standing as of the last refresh.
    owed: tuple[int, int] = (0, 0)  # the waiting charge within its guarantee
    owed_jobs: int = 0
    satisfaction: float = 1.0
    wants: bool = False
    fair_milli: float = 0.0
    # Integrals and counts.
    wanted_s: float = 0.0
    satisfied_s: float = 0.0
    held_milli_s: float = 0.0
    fair_milli_s: float = 0.0
    episode_since_s: float | None = None
    episodes_s: list[float] = field(default_factory=list)
    inversions: int = 0
    guaranteed_evictions: int = 0

    @property
    def borrowed_milli(self) -> int:
        return beyond_guarantee(self.quota, self.held)[1]

    @property
    def borrowing_demand_milli(self) -> int:
        """What it borrows plus the waiting compute beyond its guarantee (not owed to it)."""
        return self.borrowed_milli + self.waiting_milli - self.owed[1]


@dataclass(frozen=True, slots=True)
class _Watch:
    """A start that jumped ahead of earlier, higher-priority waiting work but declared a max runtime: it is a
    backfill unless one of those jobs is placed before the start's declared end."""

    mark: int  # jobs pending since before this mark were waiting when it started
    end_s: float
    priority: int
    submit_s: float


class GuaranteeTracker:
    """Per team: what it holds and what it waits for, its standing against its guarantee, and the integrals and
    counts the figures are made of. State changes at events; `advance` integrates the state between them."""

    def __init__(self, *, nodes: Sequence[Node], quotas: Mapping[str, Quota]) -> None:
        # As the engine applies them (a memory-only guarantee also guarantees its share of the compute).
        nodes = tuple(nodes)
        quotas = effective_quotas(quotas, nodes)
        self.quotas = quotas
        self.models = card_models(nodes)
        self.capacity_milli = sum(
            WHOLE_GPU_MILLI * len(n.gpus) for n in nodes if n.state is not NodeState.LOST
        )
        self.teams: dict[str, _Team] = {}
        for team in quotas:
            self._team(team)
        self._dirty: set[str] = set()
        self._shares_dirty = True
        self._share_error = 0.0
        self._borrowed_milli = 0
        self.borrowed_s = 0.0
        self.share_error_s = 0.0
        self.evictions_cross_team = 0
        self.evictions_within_team = 0
        # Priority inversions: pending (not yet placed) jobs per (team, priority) by submit time, when each became
        # pending (a running mark), and the open backfill watches per team.
        self._pending: dict[tuple[str, int], list[tuple[float, str]]] = {}
        self._priorities: dict[str, set[int]] = {}
        self._pending_mark: dict[str, int] = {}
        self._mark = 0
        self._watches: dict[str, list[_Watch]] = {}
        # Time each waiting job has spent owed so far (those owed at some time), and those that then started.
        self._owed_s: dict[str, float] = {}
        self._owed_team: dict[str, str] = {}
        self._owed_done: list[OwedJob] = []

    def _team(self, name: str) -> _Team:
        team = self.teams.get(name)
        if team is None:
            quota = self.quotas.get(name)
            weight = max(_MIN_WEIGHT, quota.weight if quota is not None else 1.0)
            team = self.teams[name] = _Team(quota, weight)
        return team

    def _touch(self, name: str) -> None:
        self._dirty.add(name)
        self._shares_dirty = True

    # ------------------------------------------------------------------------------------------ job moves
    def job_waiting(self, spec: SimJob) -> None:
        """The job is pending (arrived, requeued, or its placement was voided)."""
        self._pend(spec)
        team = self._team(spec.team)
        if spec.id in team.waiting:
            return  # placed, waiting for its victims, and put back: it never stopped waiting
        charge = estimated_charge(spec.request, self.models)
        if charge[0] <= 0 and charge[1] <= 0:
            return  # holds no GPU: no guarantee is about it
        team.waiting[spec.id] = charge
        bisect.insort(team.order, (-spec.priority, spec.submit_time_s, spec.id))
        team.waiting_milli += charge[1]
        team.waiting_mem_sizes[charge[0]] += 1
        team.waiting_milli_sizes[charge[1]] += 1
        self._touch(spec.team)

    def _pend(self, spec: SimJob) -> None:
        """Note the job among its team's pending jobs of its priority, and when it became pending."""
        self._mark += 1
        self._pending_mark[spec.id] = self._mark
        key = (spec.team, spec.priority)
        bisect.insort(self._pending.setdefault(key, []), (spec.submit_time_s, spec.id))
        self._priorities.setdefault(spec.team, set()).add(spec.priority)

    def job_placed(self, spec: SimJob, now_s: float) -> None:
        """The cycle placed the job (it starts, or waits for its victims): it is no longer pending."""
        lst = self._pending[(spec.team, spec.priority)]
        del lst[bisect.bisect_left(lst, (spec.submit_time_s, spec.id))]
        mark = self._pending_mark.pop(spec.id)
        self._settle_watches(spec, mark, now_s)

    def job_started(self, spec: SimJob, assignments: tuple[Assignment, ...]) -> None:
        """The job runs on `assignments`: it stops waiting and its exact charge counts as held."""
        team = self._team(spec.team)
        charge = team.waiting.pop(spec.id, None)
        if charge is not None:
            del team.order[bisect.bisect_left(team.order, (-spec.priority, spec.submit_time_s, spec.id))]
            team.waiting_milli -= charge[1]
            _discard(team.waiting_mem_sizes, charge[0])
            _discard(team.waiting_milli_sizes, charge[1])
        owed = self._owed_s.pop(spec.id, None)
        if owed is not None:
            self._owed_done.append(OwedJob(spec.id, spec.team, owed, True))
        self._hold(spec.team, spec.priority, charge_of(assignments), +1)

    def job_stopped(self, spec: SimJob, assignments: tuple[Assignment, ...]) -> None:
        """The job no longer holds its cards (finished, gone after its grace, or handed to its preemptor)."""
        self._hold(spec.team, spec.priority, charge_of(assignments), -1)

    def _hold(self, name: str, priority: int, charge: tuple[int, int], sign: int) -> None:
        team = self._team(name)
        team.held[0] += sign * charge[0]
        team.held[1] += sign * charge[1]
        row = team.held_by_priority.setdefault(priority, [0, 0])
        row[0] += sign * charge[0]
        row[1] += sign * charge[1]
        self._touch(name)

    def capacity_changed(self, delta_milli: int) -> None:
        self.capacity_milli += delta_milli
        self._shares_dirty = True

    # ---------------------------------------------------------------------------------------- evictions
    def evictions_applied(
        self,
        snapshot: Snapshot,
        evictions: Iterable[tuple[str, str, str]],
        placed: Iterable[tuple[str, tuple[Assignment, ...]]] = (),
    ) -> None:
        """Count the cycle's evictions, each (victim id, victim team, preemptor team): within the victim's team,
        or across teams, and then whether it took work within the victim's team's guarantee: what the team held
        at the cycle's snapshot plus what the cycle placed for it (`placed`: team, assignments), less its
        cross-team victims of the cycle up to this one, is below its guarantee on a resource the guarantee names
        (`keeps_guarantee`)."""
        cross = []
        for victim, victim_team, preemptor_team in evictions:
            if victim_team == preemptor_team:
                self.evictions_within_team += 1
            else:
                self.evictions_cross_team += 1
                cross.append((victim, victim_team))
        if not cross:
            return
        charges = {job.id: charge_of(job.assignments) for job in snapshot.running}
        held: dict[str, list[int]] = {}
        for job in snapshot.running:
            row = held.setdefault(job.team, [0, 0])
            row[0] += charges[job.id][0]
            row[1] += charges[job.id][1]
        for team, assignments in placed:
            row = held.setdefault(team, [0, 0])
            mem, comp = charge_of(assignments)
            row[0] += mem
            row[1] += comp
        taken: dict[str, list[int]] = {}
        for victim, victim_team in sorted(cross):
            row = taken.setdefault(victim_team, [0, 0])
            mem, comp = charges.get(victim, (0, 0))
            row[0] += mem
            row[1] += comp
            if not keeps_guarantee(self.quotas.get(victim_team), held.get(victim_team, (0, 0)), row):
                self._team(victim_team).guaranteed_evictions += 1

    # ----------------------------------------------------------------------------------- priority inversions
    def placements_applied(self, specs: Iterable[SimJob], now_s: float) -> None:
        """After a cycle's placements: each placed job that jumped ahead of an earlier, higher-priority job of its
        team still pending is an inversion, unless it declared a max runtime (then it is watched as a backfill)."""
        for spec in specs:
            if not self._waiting_senior(spec):
                continue
            if spec.max_runtime_s is None:
                self._team(spec.team).inversions += 1
                continue
            self._mark += 1
            watch = _Watch(self._mark, now_s + spec.max_runtime_s, spec.priority, spec.submit_time_s)
            self._watches.setdefault(spec.team, []).append(watch)

    def _waiting_senior(self, spec: SimJob) -> bool:
        """Whether a job of the team with higher priority, submitted earlier, is pending."""
        for priority in self._priorities.get(spec.team, ()):
            if priority > spec.priority:
                lst = self._pending.get((spec.team, priority))
                if lst and lst[0][0] < spec.submit_time_s:
                    return True
        return False

    def _settle_watches(self, spec: SimJob, pending_mark: int, now_s: float) -> None:
        """A job placed now ends the watches it was senior to and that have not reached their declared end."""
        watches = self._watches.get(spec.team)
        if not watches:
            return
        keep = []
        for w in watches:
            if w.end_s <= now_s:
                continue  # the backfilled job was due to end before anyone it jumped could start
            if pending_mark < w.mark and spec.priority > w.priority and spec.submit_time_s < w.submit_s:
                self._team(spec.team).inversions += 1
                continue
            keep.append(w)
        self._watches[spec.team] = keep

    # ------------------------------------------------------------------------------------------------ clock
    def advance(self, at_s: float, dt_s: float) -> None:
        """The state reached at `at_s` holds for `dt_s` more seconds: bring it up to date, then integrate."""
        if self._dirty or self._shares_dirty:
            self._refresh(at_s)
        if self._borrowed_milli > 0:
            self.borrowed_s += dt_s
            self.share_error_s += self._share_error * dt_s
        owed_s = self._owed_s
        for team in self.teams.values():
            team.held_milli_s += team.held[1] * dt_s
            team.fair_milli_s += team.fair_milli * dt_s
            if team.wants:
                team.wanted_s += dt_s
                team.satisfied_s += team.satisfaction * dt_s
            for job_id in team.owed_ids:
                owed_s[job_id] = owed_s.get(job_id, 0.0) + dt_s

    def _refresh(self, at_s: float) -> None:
        for name in self._dirty:
            team = self.teams[name]
            owed_mem, owed_milli, team.owed_ids = _owed(team)
            team.owed_jobs = len(team.owed_ids)
            team.owed = (owed_mem, owed_milli)
            for job_id in team.owed_ids:
                self._owed_s.setdefault(job_id, 0.0)
                self._owed_team[job_id] = name
            team.wants = has_guarantee(team.quota) and (
                team.held[0] > 0 or team.held[1] > 0 or bool(team.waiting)
            )
            team.satisfaction = _satisfaction(team.quota, team.held, team.owed) if team.wants else 1.0
            if team.owed_jobs and team.episode_since_s is None:
                team.episode_since_s = at_s
            elif not team.owed_jobs and team.episode_since_s is not None:
                team.episodes_s.append(at_s - team.episode_since_s)
                team.episode_since_s = None
        self._dirty.clear()
        if self._shares_dirty:
            self._refresh_shares()
            self._shares_dirty = False

    def _refresh_shares(self) -> None:
        teams = self.teams
        weights = {name: t.weight for name, t in teams.items()}
        demand = {
            name: t.held[1] + t.waiting_milli for name, t in teams.items() if t.held[1] + t.waiting_milli > 0
        }
        fair = water_fill(self.capacity_milli, demand, weights)
        for name, team in teams.items():
            team.fair_milli = fair.get(name, 0.0)
        borrowed = {name: t.borrowed_milli for name, t in teams.items()}
        self._borrowed_milli = sum(borrowed.values())
        if self._borrowed_milli <= 0:
            self._share_error = 0.0
            return
        caps = {name: t.borrowing_demand_milli for name, t in teams.items() if t.borrowing_demand_milli > 0}
        ideal = water_fill(self._borrowed_milli, caps, weights)
        gap = sum(abs(borrowed[name] - ideal.get(name, 0.0)) for name in teams)
        self._share_error = gap / (2 * self._borrowed_milli)

    def finish(self, end_s: float) -> GuaranteeFigures:
        """Close the window at `end_s`: open episodes count their wait so far, and a watched backfill whose
        declared end lies beyond the window is an inversion (the job it jumped had not been placed)."""
        if self._dirty or self._shares_dirty:
            self._refresh(end_s)
        for name, watches in self._watches.items():
            self._team(name).inversions += sum(1 for w in watches if w.end_s > end_s)
        self._watches.clear()
        teams = {}
        for name, t in sorted(self.teams.items()):
            still_open = t.episode_since_s is not None
            episodes = (*t.episodes_s, end_s - t.episode_since_s) if still_open else tuple(t.episodes_s)
            teams[name] = TeamFigures(
                wanted_s=t.wanted_s,
                satisfied_s=t.satisfied_s,
                episodes_s=episodes,
                open_episodes=int(still_open),
                held_milli_s=t.held_milli_s,
                fair_milli_s=t.fair_milli_s,
                priority_inversions=t.inversions,
                within_guarantee_evictions=t.guaranteed_evictions,
            )
        never = tuple(
            OwedJob(job_id, self._owed_team[job_id], owed, False)
            for job_id, owed in sorted(self._owed_s.items())
        )
        return GuaranteeFigures(
            owed_jobs=(*self._owed_done, *never),
            teams=teams,
            evictions_cross_team=self.evictions_cross_team,
            evictions_within_team=self.evictions_within_team,
            within_guarantee_evictions_by_other_teams=sum(
                t.within_guarantee_evictions for t in teams.values()
            ),
            priority_inversions=sum(t.priority_inversions for t in teams.values()),
            borrowed_s=self.borrowed_s,
            share_error_s=self.share_error_s,
        )


def _discard(sizes: Counter[int], value: int) -> None:
    sizes[value] -= 1
    if sizes[value] <= 0:
        del sizes[value]


def _owed(team: _Team) -> tuple[int, int, frozenset[str]]:
    """The waiting charge owed to the team (memory MiB, compute milli) and the jobs it is owed for: waiting jobs
    by priority (highest first), then submit time, each counted when the team, holding what it holds at that
    priority or higher plus those counted before, stays within its guarantee with it (its lower-priority running
    work gives way to it, as the engine's guarantee order says). The walk stops once even the smallest waiting
    charge no longer fits (what stands before a job only grows along the walk)."""
    quota = team.quota
    if not has_guarantee(quota) or not team.order:
        return 0, 0, frozenset()
    smallest = (min(team.waiting_mem_sizes), min(team.waiting_milli_sizes))
    owed = [0, 0]
    jobs = []
    level: int | None = None
    above = [0, 0]
    for neg_priority, _, job_id in team.order:
        if level != -neg_priority:
            level = -neg_priority
            above = [0, 0]
            for p, row in team.held_by_priority.items():
                if p >= level:
                    above[0] += row[0]
                    above[1] += row[1]
        used = (above[0] + owed[0], above[1] + owed[1])
        if not within_guarantee(quota, used, smallest):
            break
        charge = team.waiting[job_id]
        if within_guarantee(quota, used, charge):
            owed[0] += charge[0]
            owed[1] += charge[1]
            jobs.append(job_id)
    return owed[0], owed[1], frozenset(jobs)


def _satisfaction(quota: Quota, held: Sequence[int], owed: tuple[int, int]) -> float:
    """On each resource the guarantee names, what the team holds of what it is entitled to, the lowest of them
    (1 where nothing is owed): entitled = min(guarantee, held + owed), and of its holding only the guarantee less
    what is owed serves it when the owed work could start only in the place of its own lower-priority work
    (held + owed beyond the guarantee): min(1, min(held, guarantee - owed) / entitled)."""
    ratios = []
    named = (
        (quota.guaranteed_gpu_memory_mib, held[0], owed[0]),
        (quota.guaranteed_compute_milli, held[1], owed[1]),
    )
    for guarantee, h, o in named:
        entitled = min(guarantee, h + o) if guarantee > 0 else 0
        if entitled > 0:
            ratios.append(min(1.0, max(0, min(h, guarantee - o)) / entitled))
    return min(ratios, default=1.0)
