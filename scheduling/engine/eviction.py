"""Evicting for blocked jobs (what reclaim and preempt share): per node the cheapest set of victims that lets the
job fit, the best node(s), and the evictions with the job's placement staged in a `Statement`.

Which running jobs a blocked job may evict is the action's `VictimRule`; everything else is the same for both.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable
from typing import Protocol

import numpy as np

from scheduling.engine.accounting import model_usage_add, usage_add
from scheduling.engine.placement import effective, evaluator, feasible, node_ok, try_place
from scheduling.engine.resources import (
    charge_of,
    compute_cap_milli,
    gpu_is_free,
    gpu_matches,
    job_host_on,
    release_many,
    release_on_node,
    slice_charge,
)
from scheduling.engine.session import Holding, Session, overlay
from scheduling.engine.statement import Statement
from scheduling.engine.types import WHOLE_GPU_MILLI, Assignment, Job, Node, Request, Sharing, Status

# From a node's evictable holdings (preemptible, past the minimum runtime, lowest priority first): those the
# blocked job may evict.
Victims = Callable[[list[Holding]], list[Holding]]


class VictimRule(Protocol):
    """Which running jobs a blocked job may evict, for one evicting action."""

    CODE: str  # the evictions' code ("preempted", "reclaimed")
    MAX_ATTEMPTS_PARAM: str  # the profile param capping how many blocked jobs try per cycle
    MIN_RUNTIME_PARAM: str  # the profile param: jobs younger than this are not evicted by this rule
    EVICTS_PINNED: bool  # whether never-preempted jobs may be victims (only borrowed ones, by reclaim)

    def victims(self, s: Session, job: Job) -> Victims | None:
        """The job's pick from a node's evictable holdings (None: it may evict nothing this cycle)."""
        ...

    def scope(self, job: Job) -> str:
        """What, besides the request and priority, makes a failed try worth repeating for another job."""
        ...

    def order(self, s: Session, v: Holding) -> tuple:
        """Which of a node's eligible victims to take first (the unneeded ones are dropped again)."""
        ...

    def allows(self, s: Session, job: Job, victims: list[Job]) -> bool:
        """Whether these victims may all go together (each was eligible alone)."""
        ...

    def cost(self, s: Session, chosen: list[Holding]) -> tuple:
        """What evicting this set costs (lower is better): the node whose set costs least is chosen."""
        ...

    def cost_floor(self, s: Session, job: Job, pos: int, eligible: list[Holding]) -> tuple:
        """A lower bound of `cost` for every non-empty set taken from `eligible` that lets the job fit on the
        node: a node whose floor is above the cost another node already offers is not searched (`_evict_for`)."""
        ...


def evict_for_blocked(s: Session, rule: VictimRule) -> None:
    """Each blocked job, in queue order, tries a plain placement again when this cycle's evictions freed room,
    then eviction under the rule; at most the rule's attempts per cycle, and a request that failed is not tried
    again at the same priority (and scope)."""
    budget = int(s.param(rule.MAX_ATTEMPTS_PARAM) or 0)
    failed: set[tuple] = set()
    # Whom a job may evict follows from its request, priority and scope and from what this pass changed (each
    # success places a job and evicts others): a "nobody" holds for the same key until the next success.
    nobody: dict[tuple, int] = {}
    blocked, held_at, restricted, scope = s.blocked, s.held_at, s.restricted, rule.scope
    for job in s.queue:
        if budget <= 0:
            break
        if job.id not in blocked:
            continue
        if not s.evictions and job.id not in held_at and job.team not in restricted:
            # The common case, asked first: nothing to retry, and the job is its own view (below).
            key = (job.request, job.priority, scope(job))
            if key in failed or nobody.get(key) == len(s.placements):
                continue
        # The job's own reservation must not stand in its way; it is put back if the job stays pending.
        lifted = s.suspend_reservation(job.id) if s.holds else []
        if s.evictions and try_place(s, job):
            s.drop_reservation(job.id)
            continue  # room freed by this cycle's evictions for an earlier job
        view = effective(s, job)
        if isinstance(view, Status):
            # Its team's per-model limits leave it no model (this cycle's evictions may have changed that
            # only for the better, and then the plain placement above took it).
            s.status[job.id] = view
            s.blocked.discard(job.id)
            if lifted:
                s.restore_holds(lifted)
            continue
        key = (view.request, job.priority, rule.scope(job))
        victims = None
        if key not in failed and nobody.get(key) != len(s.placements):
            victims = rule.victims(s, job)
            if victims is None:
                nobody[key] = len(s.placements)
        if victims is not None:
            budget -= 1
            if _evict_for(s, job, view, victims, rule):
                continue
            failed.add(key)
        if lifted:
            s.restore_holds(lifted)


def running_by_pos(
    s: Session, min_runtime_s: float | None = None, pinned: bool = False
) -> dict[int, list[Holding]]:
    """Node position -> what may be evicted there: running jobs past the minimum runtime (the profile's
    `min_runtime_s` unless given) and evicted fewer than `evictions_per_hour_max` times in the last hour,
    preemptible ones only unless `pinned`; lowest priority first. Built once per
    cycle for each such view, only when eviction is considered."""
    if min_runtime_s is None:
        min_runtime_s = float(s.param("min_runtime_s") or 0.0)
    key = ("evictable", min_runtime_s, pinned)
    known = s.evictable_by_pos.get(key) if s.evictable_by_pos is not None else None
    if known is not None:
        return known
    kept = s.running_memo()
    known = kept.get(key)
    if known is None:
        now = s.snap.now
        by_pos = s.holdings_by_pos()

        most = s.param("evictions_per_hour_max")

        def evictable(v: Holding) -> bool:
            started = v.job.start_time
            return (
                (pinned or v.job.preemptible)
                and (started is None or now - started >= min_runtime_s)
                and (most is None or v.job.recent_evictions < int(most))
            )

        known = {}
        for pos, held in by_pos.items():
            victims = sorted((v for v in held if evictable(v)), key=lambda v: (v.job.priority, v.job.id))
            if victims:
                known[pos] = victims
        kept[key] = known
    if s.evictable_by_pos is None:
        s.evictable_by_pos = {}
    s.evictable_by_pos[key] = known
    return known


def evictions_left(s: Session, v: Job) -> bool:
    """Whether the running job may be evicted again: fewer than `evictions_per_hour_max` evictions in the last
    hour (no thrash: a job is never placed and then evicted more often than that an hour)."""
    most = s.param("evictions_per_hour_max")
    return most is None or v.recent_evictions < int(most)


def work_lost(s: Session, v: Job) -> float:
    """`work_lost_s` of a running job at the snapshot's time, worked out once a cycle (victim orders and costs ask
    for the same jobs on every node and every attempt)."""
    known = s.ctx.cache.get(_WORK_LOST_KEY)
    if known is None:
        known = s.ctx.cache[_WORK_LOST_KEY] = {}
    lost = known.get(v.id)
    if lost is None:
        lost = known[v.id] = work_lost_s(s.snap.now, v)
    return lost


_WORK_LOST_KEY = "eviction.work_lost"


def work_lost_s(now: float, v: Job) -> float:
    """GPU-seconds of progress an eviction throws away: the time since its last checkpoint (all of its running
    time when it declares none) x the cards it holds."""
    ran = now - v.start_time if v.start_time is not None else 0.0
    if v.checkpoint_interval_s:
        ran = ran % v.checkpoint_interval_s
    _, comp = charge_of(v.assignments)
    return max(0.0, ran) * max(comp, 1) / WHOLE_GPU_MILLI


def work_then_count(s: Session, chosen: list[Holding]) -> tuple:
    """A victim set's cost as reclaim and share weigh it: the work it throws away, then how many jobs."""
    return (sum(work_lost(s, v.job) for v in chosen), len(chosen))


def work_then_count_floor(s: Session, job: Job, pos: int, eligible: list[Holding]) -> tuple:
    """A lower bound of `work_then_count` for the victim sets on this node that let the job fit: at least one
    job, losing at least `work_floor`."""
    return (work_floor(s, job, pos, eligible), 1)


def work_floor(s: Session, job: Job, pos: int, eligible: list[Holding]) -> float:
    """The least work any set of these victims that lets the job fit on the node throws away.

    For whole cards the job needs `need` more idle cards than the node has, and a card becomes idle only once as
    many of its holders are gone as it counts: spreading each victim's work lost over the cards it holds here, no
    set frees a card for less than the sum of its cheapest holders' shares, nor `need` cards for less than the
    sum over the `need` cheapest cards; for a slice, `_slice_floor`. Otherwise at least one victim goes. Sums are
    kept a hair below the exact figure, so that summing in another order never puts them above a set's actual
    cost."""
    cheapest = min(work_lost(s, v.job) for v in eligible)
    req = job.request
    if req.is_slice:
        return max(cheapest, _slice_floor(s, req, s.index.nodes[pos], eligible))
    if not req.gpus:
        return cheapest
    node = s.index.nodes[pos]
    idle = 0
    for g in node.gpus:
        if gpu_is_free(g) and gpu_matches(req, g):
            idle += 1
    need = req.gpus - idle
    if need <= 0:
        return cheapest
    shares: dict[int, list[float]] = {}  # card index -> each eligible holder's share of its work lost
    for v in eligible:
        if not v.assignments:
            continue
        share = work_lost(s, v.job) / len(v.assignments)
        for a in v.assignments:
            shares.setdefault(a.gpu_index, []).append(share)
    per_card: list[float] = []
    for g in node.gpus:
        if gpu_is_free(g) or not gpu_matches(req, g):
            continue
        mine = shares.get(g.index)
        if mine is None or len(mine) < g.holders:
            continue  # not all its holders may go: it stays taken
        mine.sort()
        per_card.append(sum(mine[: g.holders]))
    if len(per_card) < need:
        return cheapest  # no set frees enough cards here; the search says so
    per_card.sort()
    return max(cheapest, sum(per_card[:need]) * (1 - 1e-9))


# The cost of a node the job fits on without evicting anything: below every rule's cost.
FREE_COST: tuple = (-float("inf"),)


def release_all(s: Session, pos: int, base: Node, victims: list[Holding]) -> Node:
    node = release_many(base, [(tuple(v.assignments), v.cpu_milli, v.memory_mib) for v in victims])
    return overlay(node, s.holds.get(pos, []))


def could_fit(s: Session, job: Job, pos: int, victims: list[Holding]) -> bool:
    """A cheap necessary condition for the job fitting on the node once all these victims are gone."""
    req = job.request
    node = s.index.nodes[pos]
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
        free_comp = compute_cap_milli(g, s.factor) - g.allocated_compute_milli + row[2]
        if free_mem >= req.gpu_memory_mib and free_comp >= req.gpu_compute_milli:
            return True
    return False


def _slice_floor(s: Session, req: Request, node: Node, eligible: list[Holding]) -> float:
    """For a slice: the slice needs one card with room, and victims free a card's memory and compute only as much
    as they hold on it. Per card short of room, the set must hold there at least the memory and compute missing,
    so it loses at least the missing amount times its holders' least work lost per MiB (per milli-GPU), and at
    least one holder's work; the node's floor is its cheapest card's (0 where a card has room already). Products
    are kept a hair below the exact figure, as in `work_floor`; a single holder's work is exact."""
    held: dict[int, dict[str, list]] = {}  # card index -> victim id -> [work lost, memory MiB, compute milli]
    for v in eligible:
        lost = work_lost(s, v.job)
        for a in v.assignments:
            row = held.setdefault(a.gpu_index, {}).setdefault(v.job.id, [lost, 0, 0])
            row[1] += a.memory_mib
            row[2] += a.compute_milli
    best = float("inf")
    for g in node.gpus:
        if not gpu_matches(req, g):
            continue
        charge = slice_charge(req, g)
        if charge is None:
            continue
        # What the card lacks (`slice_fits_gpu`): memory for the charge (and any free memory at all), compute.
        short_mem = max(
            g.allocated_memory_mib + charge[0] - g.memory_mib, g.allocated_memory_mib - g.memory_mib + 1
        )
        short_comp = g.allocated_compute_milli + charge[1] - compute_cap_milli(g, s.factor)
        if short_mem <= 0 and short_comp <= 0:
            return 0.0
        rows = held.get(g.index)
        if not rows:
            continue
        floor = min(r[0] for r in rows.values())
        for short, field in ((short_mem, 1), (short_comp, 2)):
            if short <= 0:
                continue
            rates = [r[0] / r[field] for r in rows.values() if r[field] > 0]
            if not rates:
                floor = float("inf")  # nothing here frees it: this card cannot take the slice
                break
            floor = max(floor, short * min(rates) * (1 - 1e-9))
        best = min(best, floor)
    return best if best != float("inf") else 0.0


def _floor_then_rank(entry: tuple) -> tuple:
    return (entry[0], entry[1])


def _fits_without_eviction(s: Session, view: Job) -> np.ndarray | None:
    """Per position, whether the job fits there as the node stands (what `victims_on` finds costs `FREE_COST`).
    None where that cannot be read without scoring nodes: a single-node job under a profile with filters or
    scores that are not cached (a score may draw from the cycle's random numbers); every node is then searched."""
    if view.request.nodes > 1:
        return feasible(s, view)[0]
    plugins = s.plugins
    if plugins.live_filters or plugins.live_scores:
        return None
    return s.index.memo(view.request, evaluator(s, view)).ok & s.index.present


def victims_on(
    s: Session, job: Job, pos: int, eligible: list[Holding], rule: VictimRule
) -> tuple[tuple, list[Holding]] | None:
    """The cheapest victim set on one node that lets the job fit there: greedy, then drop the unneeded."""
    if not could_fit(s, job, pos, eligible):
        return None
    base = s.real_node(pos)
    if not node_ok(s, job, release_all(s, pos, base, eligible)):
        return None
    order = sorted(eligible, key=lambda v: rule.order(s, v))
    chosen: list[Holding] = []
    node = base
    fits = node_ok(s, job, overlay(base, s.holds.get(pos, [])))
    for v in order if not fits else ():
        if not rule.allows(s, job, [c.job for c in chosen] + [v.job]):
            continue
        chosen.append(v)
        node = release_on_node(node, tuple(v.assignments), v.cpu_milli, v.memory_mib)
        if node_ok(s, job, overlay(node, s.holds.get(pos, []))):
            fits = True
            break
    if not fits:
        return None
    for v in list(reversed(chosen)) if len(chosen) > 1 else ():
        trial = [c for c in chosen if c is not v]
        if node_ok(s, job, release_all(s, pos, base, trial)):
            chosen = trial
    if not chosen:
        return FREE_COST, []
    return rule.cost(s, chosen), chosen


def _evict_for(s: Session, job: Job, view: Job, pick: Victims, rule: VictimRule) -> bool:
    """Evict for `job`, judging where it fits as `view` (the job with the GPU models it may use now).

    The job takes the `req.nodes` nodes whose victim sets cost least (ties to snapshot order). Nodes are searched
    in order of a lower bound of their cost (the rule's `cost_floor`; a node the job fits on already costs
    nothing), and the search stops at the first node whose bound is above the costs already found: searching it
    could not change the choice, only spend the cycle's time."""
    req = view.request
    want = req.nodes
    static = s.index.static(req)
    rank = s.index.rank
    fits_now = _fits_without_eviction(s, view)
    # Per node: its cost and victims, for the nodes searched; the `want` best (cost, rank) so far, in order.
    found: dict[int, tuple[tuple, list[Holding]]] = {}
    top: list[tuple[tuple, int]] = []
    if want > 1:
        # A gang may also take nodes it fits on as they are; searching them for victims could not do better.
        for p in np.flatnonzero(fits_now).tolist():
            found[p] = (FREE_COST, [])
            top.append((FREE_COST, int(rank[p])))
        top = sorted(top)[:want]
    entries: list[tuple[tuple, int, int, list[Holding]]] = []
    min_runtime_s = float(s.param(rule.MIN_RUNTIME_PARAM) or 0.0)
    for pos, held in running_by_pos(s, min_runtime_s, rule.EVICTS_PINNED).items():
        if not static[pos] or pos in found:
            continue
        eligible = pick(held)
        if not eligible:
            continue
        floor = FREE_COST if fits_now is None or fits_now[pos] else rule.cost_floor(s, view, pos, eligible)
        entries.append((floor, int(rank[pos]), pos, eligible))
    entries.sort(key=_floor_then_rank)
    for floor, pos_rank, pos, eligible in entries:
        if len(top) == want and (floor, pos_rank) > top[-1]:
            break  # this node and every one after it cost more than the `want` best found
        got = victims_on(s, view, pos, eligible, rule)
        if got is not None:
            found[pos] = got
            insort(top, (got[0], pos_rank))
            del top[want:]
    if len(found) < want or not found:
        return False
    best = sorted(found, key=lambda p: (found[p][0], int(rank[p])))[:want]
    picked: list[tuple[int, list[Holding]]] = [(pos, found[pos][1]) for pos in best]
    victims_by_id: dict[str, Job] = {}
    for _, victims in picked:
        for v in victims:
            victims_by_id.setdefault(v.job.id, v.job)
    if not any(victims_by_id.values()) and req.nodes <= 1:
        return False
    if not rule.allows(s, job, list(victims_by_id.values())):
        return False
    stmt = Statement(s)
    for v in sorted(victims_by_id.values(), key=lambda v: v.id):
        evict_job(s, v, rule.CODE, stmt)
    chosen = [(pos, s.index.nodes[pos]) for pos, _ in picked]
    if all(node_ok(s, view, node) for _, node in chosen) and try_place(s, job, chosen=chosen, stmt=stmt):
        stmt.commit(job)
        s.drop_reservation(job.id)
        return True
    stmt.rollback()
    return False


def evict_job(s: Session, victim: Job, code: str, stmt: Statement) -> None:
    """Give back everything a running job (a whole gang) holds, staged in the statement."""
    by_node: dict[str, list[Assignment]] = {}
    for a in victim.assignments:
        by_node.setdefault(a.node, []).append(a)
    for name in victim.cpu_assignments:
        by_node.setdefault(name, [])
    for name in sorted(by_node):
        pos = s.pos_of(name)
        if pos is None:
            continue
        stmt.touch(pos)
        cpu, mem = job_host_on(victim, name)
        s.give_back(pos, tuple(by_node[name]), cpu, mem)
    mem, comp = charge_of(victim.assignments)
    usage_add(s.ctx, victim.team, -mem, -comp, victim.priority_class, victim.priority)
    stmt.usage.append((victim.team, -mem, -comp, victim.priority_class, victim.priority))
    if victim.team in s.restricted:
        model_usage_add(s.ctx, victim.team, victim.assignments, -1)
        stmt.model_usage.append((victim.team, victim.assignments, -1))
    s.evicted.add(victim.id)
    stmt.evicted.append((victim, code))
