"""Making room by moving work (consolidation): the work on the node(s) a blocked job needs is stopped, and what can
run elsewhere now restarts there at once, its new place held for it while it stops.

At its turn in allocation (`make_room_at_turn`), a blocked job that needs several cards on a node and is within
its team's guarantee (or a big job at the head of the queue: a gang, or one that needs half of the largest node)
may stop, on the node(s) it needs:
- preemptible work of any team that is smaller on a node than itself, including work within another team's
  guarantee, when that work runs somewhere else in the same cycle (a move: no team drops below its guarantee);
- if it is within its guarantee, other teams' borrowed work (as reclaim takes it, their guarantees kept);
- its own team's lower-priority preemptible work past the minimum runtime (as preemption takes it).
A moved job's new place is free room, or room made by sending reclaimable work (or the job's own team's work
below the moved job) back to the queue. Moving is the last resort: where reclaim or preemption alone frees a
node, the node is held for the job and those actions decide whom to take. Never-preempted work is never moved;
a job evicted `evictions_per_hour_max` times in the last hour is left alone. Every team that loses work to the
queue keeps its guarantee, moved jobs counted at what they held before.

The node(s) the profile's node scores rate highest for the job once cleared win, then those whose victims lose
the least work since their last checkpoint, then the fewest victims; at most `move_max_attempts` jobs try per
cycle, each moving at most `moves_per_job_max` jobs. A moved job gets an `Eviction` with code "moved", the nodes it
restarts on and why, and a `Reservation` holding its new place until its grace ends; the caller lists it as
pending with `ready_at` meanwhile, and allocation keeps holding its place (`hold_returning`). docs/engine.md,
"Moving work to make room".
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from scheduling.engine.accounting import (
    has_guarantee,
    job_charge,
    keeps_guarantee,
    others_keep_guarantees,
    running_borrowed,
    running_charges,
    team_usage,
    usage_at_or_above,
    within_guarantee,
)
from scheduling.engine.eviction import (
    FREE_COST,
    could_fit,
    evict_job,
    evictions_left,
    release_all,
    victims_on,
    work_floor,
    work_lost,
)
from scheduling.engine.placement import choose, effective, feasible, node_ok, node_score, plan, try_place
from scheduling.engine.plugins.guarantee import within_guarantee_ids
from scheduling.engine.resources import charge_of
from scheduling.engine.session import Holding, Session
from scheduling.engine.statement import Statement
from scheduling.engine.types import Job, Node, Placement, Reservation, Status, TopologyNeed

MOVED = "moved"
NEG_INF = float("-inf")
# What a victim is to the job making room: whether it may be evicted without running elsewhere, and as what.
_RECLAIM, _PREEMPT = "reclaimed", "preempted"


class MakeRoom:
    """Victims of one job making room: which running jobs it may stop, and whether each may go back to the queue
    (reclaimed, preempted) or must run elsewhere (moved)."""

    def __init__(self, s: Session, job: Job, within: bool):
        self.job, self.within = job, within
        # What each victim is to a job of this team and priority: the same for every such job of the cycle.
        self.kinds: dict[str, str | None] = s.ctx.cache.setdefault(
            ("moves.kinds", job.team, job.priority, within), {}
        )
        self.homeless: set[str] = (
            set()
        )  # movable victims that found no place elsewhere in a staging that failed
        self.room: dict = {}  # request -> whether some node has room for it now
        # Moved jobs whose new place, in the last staging, sent other work back to the queue.
        self.homed_by_eviction: set[str] = set()
        self.min_runtime_s = float(s.param("min_runtime_s") or 0.0)
        self._evictable: list[tuple[int, list[Holding]]] | None = None
        self.spare = _spare(s) if within else {}
        # Whether it may send work back to the queue to make a moved job's new place: other teams' borrowed work
        # (within its guarantee), or its own team's lower-priority work.
        held = team_usage(s.ctx).get(job.team, (0, 0))
        above = usage_at_or_above(s.ctx, job.team, job.priority)
        self.evicts_elsewhere = bool(self.spare) or held[1] > above[1] or held[0] > above[0]

    def evict_kind(self, s: Session, v: Job) -> str | None:
        """How the job may take `v` without it running elsewhere: reclaimed (another team's borrowed work, the
        job being within its guarantee), preempted (its own team's lower-priority work), or not at all."""
        if v.id in self.kinds:
            return self.kinds[v.id]
        out: str | None = None
        if v.id in s.evicted or not evictions_left(s, v):
            out = None
        elif v.team != self.job.team:
            room = self.spare.get(v.team)
            charge = running_charges(s.ctx).get(v.id, (0, 0))
            if (
                room is not None
                and (v.preemptible or v.id in running_borrowed(s.ctx))
                and (room[2] or charge[0] <= room[0] or charge[1] <= room[1])
            ):
                out = _RECLAIM
        elif v.preemptible and v.priority < self.job.priority:
            started = v.start_time
            if started is None or s.snap.now - started >= self.min_runtime_s:
                out = _PREEMPT
        self.kinds[v.id] = out
        return out

    def movable(self, s: Session, v: Job) -> bool:
        """Whether `v` may be moved for the job: preemptible, not evicted too often, smaller on a node than the
        job (moving work as large as the job could only trade places with it), and not known to find no place."""
        return (
            v.preemptible
            and v.request.gpus < self.job.request.gpus
            and v.id not in self.homeless
            and evictions_left(s, v)
            and self._room_elsewhere(s, v)
        )

    def _room_elsewhere(self, s: Session, v: Job) -> bool:
        """A cheap necessary condition for a new place: some node has room for it now, or the job may reclaim
        borrowed work to make one (asked once per request a cycle)."""
        if self.evicts_elsewhere:
            return True
        known = self.room.get(v.request)
        if known is None:
            known = self.room[v.request] = choose(s, _as_pending(v)) is not None
        return known

    def evictable_by_pos(self, s: Session) -> list[tuple[int, list[Holding]]]:
        """Per node, the running jobs the job making room may send back to the queue (worked out once)."""
        if self._evictable is None:
            self._evictable = []
            for pos, held in s.holdings_by_pos().items():
                mine = [h for h in held if self.evict_kind(s, h.job) is not None]
                if mine:
                    self._evictable.append((pos, mine))
        return self._evictable

    def eligible(self, s: Session, v: Job) -> bool:
        """Whether the job may stop `v` at all (it was not evicted earlier in the cycle)."""
        return v.id not in s.evicted and (self.evict_kind(s, v) is not None or self.movable(s, v))

    # The victim rule `victims_on` asks: order, what may go together, what a set costs.
    def order(self, s: Session, v: Holding) -> tuple:
        return (work_lost(s, v.job), v.job.id)

    def allows(self, s: Session, job: Job, victims: list[Job]) -> bool:
        """Other teams keep their guarantees without the victims that will surely go back to the queue (the
        reclaimed ones that cannot be moved; movers keep their place in their team's guarantee)."""
        taken = [v for v in victims if self.kinds.get(v.id) == _RECLAIM and not self.movable(s, v)]
        return not taken or others_keep_guarantees(s.ctx, job.team, taken)

    def cost(self, s: Session, chosen: list[Holding]) -> tuple:
        return (sum(work_lost(s, v.job) for v in chosen), len(chosen))


def _spare(s: Session) -> dict[str, tuple[int, int, bool]]:
    """Per team beyond its guarantee: the memory and compute that may be taken from it while it keeps its
    guarantee, and whether it has none at all (reclaim's `_spare`, without the weights)."""
    out: dict[str, tuple[int, int, bool]] = {}
    quotas = s.snap.quotas
    for team, used in team_usage(s.ctx).items():
        quota = quotas.get(team)
        if not has_guarantee(quota):
            if used[0] > 0 or used[1] > 0:
                out[team] = (0, 0, True)
            continue
        g_mem, g_comp = quota.guaranteed_gpu_memory_mib, quota.guaranteed_compute_milli
        over_mem = used[0] - g_mem if g_mem > 0 else -1
        over_comp = used[1] - g_comp if g_comp > 0 else -1
        if over_mem > 0 or over_comp > 0:
            out[team] = (over_mem, over_comp, False)
    return out


def make_room_at_turn(s: Session, job: Job, *, may_reserve: bool) -> bool:
    """At a blocked job's turn in allocation: when it needs several cards on a node and is within its team's
    guarantee (or is a big job at the head of the queue, which would reserve: `may_reserve`), free the node(s) it
    needs by moving work, at most `move_max_attempts` jobs a cycle. At its turn, so the room it needs is not taken
    by the jobs after it first. True when the job is placed."""
    req = job.request
    if s.moves_left <= 0 or req.gpus < 2:
        return False
    within = job.id in within_guarantee_ids(s.ctx) and _within_now(s, job)
    # Beyond its guarantee, only a big job at the head of the queue moves work: a gang, or one that needs at
    # least half of the largest node.
    if not within and not (may_reserve and (req.nodes > 1 or 2 * req.gpus >= _largest_node(s))):
        return False
    view = effective(s, job)
    if isinstance(view, Status):
        return False
    key = (view.request, job.priority, job.team, within)
    if key in s.moves_tried:
        return False
    s.moves_left -= 1
    if _make_room(s, job, view, within):
        return True
    s.moves_tried.add(key)
    return False


def _within_now(s: Session, job: Job) -> bool:
    """Whether the job is within its team's guarantee with this cycle's placements and evictions counted."""
    quota = s.snap.quotas.get(job.team)
    return has_guarantee(quota) and within_guarantee(
        quota, usage_at_or_above(s.ctx, job.team, job.priority), job_charge(s.ctx, job)
    )


def _make_room(s: Session, job: Job, view: Job, within: bool) -> bool:
    """Free the best node(s) for the job; False (nothing changed) when no set of victims can be taken.

    The best node is the one the profile's node scores rate highest for the job once its victims are gone (so a
    job that needs no NVLink clears a node whose island no bigger job needs), then the one whose victims lose the
    least work since their last checkpoint, then the fewest victims. Nodes are searched in that order with a
    lower bound of the work lost (`work_floor`), and the search stops once no node left can beat the
    `req.nodes` best found (as `eviction._evict_for` does)."""
    req = view.request
    want = req.nodes
    rule = MakeRoom(s, job, within)
    static = s.index.static(req)
    rank = s.index.rank
    by_pos = s.holdings_by_pos()
    most_moves = int(s.param("moves_per_job_max") or 0)
    for _ in range(3):
        fits_now = feasible(s, view)[0] if want > 1 else None
        entries: list[tuple[tuple, int, int, list[Holding]]] = []
        found: list[tuple[tuple, int, int, list[Holding]]] = []
        plain: list[tuple[float, int, int, Node]] = []
        nodes = s.index.nodes
        for pos in np.flatnonzero(static).tolist():
            if fits_now is not None and fits_now[pos]:
                # A gang also takes the nodes it fits on as they are.
                value = _value(s, view, nodes[pos])
                found.append(((value, *FREE_COST), int(rank[pos]), pos, []))
                continue
            held = by_pos.get(pos)
            if not held or len(nodes[pos].gpus) < req.gpus:
                continue
            eligible = [h for h in held if rule.eligible(s, h.job)]
            if not eligible or not could_fit(s, view, pos, eligible):
                continue
            cleared = release_all(s, pos, s.real_node(pos), eligible)
            if not node_ok(s, view, cleared):
                continue
            value = _value(s, view, cleared)
            if want <= 1 and _plain(s, rule, view, pos, eligible):
                plain.append((value, int(rank[pos]), pos, cleared))
                continue
            entries.append(((value, work_floor(s, view, pos, eligible), 1), int(rank[pos]), pos, eligible))
        if plain:
            # Reclaim or preemption alone frees a node: moving work is the last resort, and whom to take back is
            # theirs to decide (later in the cycle). Until then the node is held for the job, so that the jobs
            # after it in the queue do not take the room it needs first.
            _, _, pos, cleared = min(plain)
            return _hold_for(s, job, view, pos, cleared)
        entries.sort(key=lambda e: (e[0], e[1]))
        found.sort(key=lambda t: (t[0], t[1]))
        for floor, pos_rank, pos, eligible in entries:
            if len(found) >= want and (floor, pos_rank) > (found[want - 1][0], found[want - 1][1]):
                break
            got = victims_on(s, view, pos, eligible, rule)
            if got is None or not got[1]:
                continue
            cost, victims = got
            if sum(1 for v in victims if rule.evict_kind(s, v.job) is None) > most_moves:
                continue
            found.append(((floor[0], *cost), pos_rank, pos, victims))
            found.sort(key=lambda t: (t[0], t[1]))
        if len(found) < want:
            return False
        failed = _stage(s, job, view, rule, [(pos, victims) for _, _, pos, victims in found[:want]])
        if failed is None:
            return True
        if not failed:
            return False
        rule.homeless |= failed
    return False


def _hold_for(s: Session, job: Job, view: Job, pos: int, cleared: Node) -> bool:
    """Hold the cards the job takes on the node once its victims are gone (no start known yet: it binds every
    job after it). Returns False: the job is not placed."""
    planned = plan(s, view, [(pos, cleared)])
    if planned is None:
        return False
    s.hold(job, NEG_INF, planned)
    s.reservations.append(Reservation(job.id, tuple(a for _, assigns in planned for a in assigns), None))
    return False


def _plain(s: Session, rule: MakeRoom, view: Job, pos: int, eligible: list[Holding]) -> bool:
    """Whether the node frees for the job with victims that go back to the queue under one action's rule alone:
    other teams' borrowed work (reclaim), keeping their guarantees, or its own team's lower-priority work
    (preemption)."""
    for kind in (_RECLAIM, _PREEMPT):  # one action's victims alone: reclaim's, or preemption's
        plain = [h for h in eligible if rule.evict_kind(s, h.job) == kind]
        if plain and node_ok(s, view, release_all(s, pos, s.real_node(pos), plain)):
            if victims_on(s, view, pos, plain, _Plain(rule)) is not None:
                return True
    return False


class _Plain:
    """Victims that go back to the queue only: labelled borrowed work first, then the least work lost; together
    they keep the other teams' guarantees (reclaim's and preemption's rules, as one question)."""

    def __init__(self, rule: MakeRoom):
        self.rule = rule

    @staticmethod
    def order(s: Session, v: Holding) -> tuple:
        return (v.job.id not in running_borrowed(s.ctx), work_lost(s, v.job), v.job.id)

    def allows(self, s: Session, job: Job, victims: list[Job]) -> bool:
        taken = [v for v in victims if self.rule.evict_kind(s, v) == _RECLAIM]
        return not taken or others_keep_guarantees(s.ctx, job.team, taken)

    @staticmethod
    def cost(s: Session, chosen: list[Holding]) -> tuple:
        return (sum(work_lost(s, v.job) for v in chosen), len(chosen))


def _value(s: Session, job: Job, node: Node) -> float:
    """How the profile's node scores rate the node for the job, highest first (negated), to a tenth of a point:
    finer differences are left to the work lost."""
    return -round(node_score(s, job, node), 1)


def _stage(
    s: Session, job: Job, view: Job, rule: MakeRoom, picked: list[tuple[int, list[Holding]]]
) -> set[str] | None:
    """Evict the victims, place the job on the picked nodes and every mover elsewhere, all or nothing. Returns
    None on success, else the movers that found no place (empty: the job itself could not be placed)."""
    victims: dict[str, Job] = {}
    for _, held in picked:
        for h in held:
            victims.setdefault(h.job.id, h.job)
    if not rule.allows(s, job, list(victims.values())):
        return set()
    stmt = Statement(s)
    for v in sorted(victims.values(), key=lambda v: v.id):
        evict_job(s, v, rule.evict_kind(s, v) or MOVED, stmt)
    chosen = [(pos, s.index.nodes[pos]) for pos, _ in picked]
    if not (
        all(node_ok(s, view, node) for _, node in chosen) and try_place(s, job, chosen=chosen, stmt=stmt)
    ):
        stmt.rollback()
        return set()
    # Every victim that may be moved restarts elsewhere now if it can, the largest first (the hardest to fit).
    # Those that cannot must be theirs to take back to the queue, and the other teams keep their guarantees.
    homeless: list[Job] = []
    rule.homed_by_eviction = set()
    for v in sorted(victims.values(), key=_size_first):
        if not (rule.movable(s, v) and _home_for(s, v, stmt, rule)):
            homeless.append(v)
    # A mover whose new place was to be made by sending other work back, and which still did not fit there (its
    # per-model limits, say), fails the try: that work must not be stopped for nothing.
    failed = {v.id for v in homeless if rule.evict_kind(s, v) is None or v.id in rule.homed_by_eviction}
    if not failed:
        # Every team that loses work to the queue (reclaimed here or for a moved job's new place) keeps its
        # guarantee once the moved jobs' new places are counted.
        homed = {v.id for v, _ in stmt.homes}
        losers = {v.team for v, _ in stmt.evicted if v.id not in homed and v.team != job.team}
        if losers and not _keep_guarantees(s, losers, stmt.homes):
            # Try again without the reclaims that went too far: those of the victims that go back to the queue,
            # and the new places made by sending other work back.
            failed = {v.id for v in homeless if rule.evict_kind(s, v) == _RECLAIM} | rule.homed_by_eviction
            if not failed:
                failed = {v.id for v in victims.values()}
    if failed or not stmt.homes:
        # (With nothing to move, this is reclaim's or preemption's to decide, with their own rules of whom to take.)
        stmt.rollback()
        s.blocked.add(job.id)  # placed in the statement, it is blocked again
        return failed
    why = _why(s, job, view, rule.within)
    moves: dict[str, tuple[tuple[str, ...], str]] = {}
    for v, placement in stmt.homes:
        to = tuple(sorted({a.node for a in placement.assignments}))
        moves[v.id] = (to, f"moved to {', '.join(to)} {why}")
    stmt.evicted = [(v, MOVED if v.id in moves else code) for v, code in stmt.evicted]
    stmt.commit(job, moves)
    s.drop_reservation(job.id)
    now = s.snap.now
    for v, placement in stmt.homes:
        s.reservations.append(Reservation(v.id, placement.assignments, now + v.grace_s))
    return None


def _keep_guarantees(s: Session, teams: set[str], homes: list[tuple[Job, Placement]]) -> bool:
    """Whether each of these teams still holds its guarantee as the cycle stands now (evictions and moved jobs'
    new places counted). A moved job counts what it held before: a memory-only slice moved to a smaller card
    holds a larger compute share there, which must not make up for the work its team lost."""
    usage = {t: list(u) for t, u in team_usage(s.ctx).items() if t in teams}
    charges = running_charges(s.ctx)
    for v, placement in homes:
        row = usage.get(v.team)
        if row is not None:
            now, before = charge_of(placement.assignments), charges.get(v.id, (0, 0))
            row[0] += before[0] - now[0]
            row[1] += before[1] - now[1]
    quotas = s.snap.quotas
    return all(keeps_guarantee(quotas.get(t), usage.get(t, (0, 0)), (0, 0)) for t in teams)


def _size_first(v: Job) -> tuple:
    return (
        -(v.request.gpus * v.request.nodes),
        -v.request.gpu_memory_mib,
        -v.request.gpu_compute_milli,
        v.id,
    )


def _home_for(s: Session, v: Job, stmt: Statement, rule: MakeRoom) -> bool:
    """Place an evicted job elsewhere now, staged among the statement's `homes` (a hold: it restarts there once
    it has stopped): on free room, else on room the job making room may take back to the queue
    (`_home_by_eviction`). False when nothing can take it."""
    pending = _as_pending(v)
    placed = try_place(s, pending, stmt=stmt, home=True) or _home_by_eviction(s, pending, stmt, rule)
    s.status.pop(v.id, None)
    return placed


def _as_pending(v: Job) -> Job:
    """A running job as the pending job it is once stopped (what its next run asks for): no cards, no start, no
    label, no eviction count."""
    return replace(
        v,
        assignments=(),
        start_time=None,
        borrowed=False,
        cpu_assignments={},
        recent_evictions=0,
        reserved_on=(),
    )


def _home_by_eviction(s: Session, v: Job, stmt: Statement, rule: MakeRoom) -> bool:
    """Make a moved job's new place with work the job making room may send back to the queue: other teams'
    borrowed work when it is within its guarantee (the moved job's own team's included), its own team's
    lower-priority work; on the node where that lets the moved job fit for the least work lost. The evictions are
    the job's making room (it starts once they have all left); `_stage` checks that every team keeps its
    guarantee once all is done."""
    req = v.request
    static = s.index.static(req)
    rank = s.index.rank
    # Searched in order of the least work a set there may lose (`work_floor`), stopping once no node left can beat
    # the best found.
    entries = []
    for pos, held in rule.evictable_by_pos(s):
        if not static[pos]:
            continue
        eligible = [h for h in held if h.job.id not in s.evicted and _may_house(s, rule, h.job, v)]
        if eligible and could_fit(s, v, pos, eligible):
            entries.append((work_floor(s, v, pos, eligible), int(rank[pos]), pos, eligible))
    entries.sort(key=lambda e: (e[0], e[1]))
    best: tuple[tuple, int, int, list[Holding]] | None = None
    for floor, pos_rank, pos, eligible in entries:
        if best is not None and (floor,) > best[0][:1]:
            break
        got = victims_on(s, v, pos, eligible, _Cheapest(rule, v))
        if got is None or not got[1]:
            continue
        entry = (got[0], pos_rank, pos, got[1])
        if best is None or entry[:2] < best[:2]:
            best = entry
    if best is None:
        return False
    _, _, pos, victims = best
    for h in victims:
        evict_job(s, h.job, rule.evict_kind(s, h.job) or _RECLAIM, stmt)
    rule.homed_by_eviction.add(v.id)
    return try_place(s, v, chosen=[(pos, s.index.nodes[pos])], stmt=stmt, home=True)


def _may_house(s: Session, rule: MakeRoom, victim: Job, moved: Job) -> bool:
    """Whether `victim` may go back to the queue to make room for the moved job: another team's borrowed work
    (reclaim's), or the job making room's own lower-priority work that is also below the moved job (sending work
    of its own rank back to the queue to move another would only trade one stop for another)."""
    kind = rule.evict_kind(s, victim)
    if kind == _RECLAIM:
        return True
    return kind == _PREEMPT and victim.priority < moved.priority


class _Cheapest:
    """The victim rule of a moved job's new place: the least work lost, then the fewest jobs; another team's
    victims may go together only while that team keeps its guarantee as the cycle stands now (this staging's
    evictions and new places counted, the moved job's own among them)."""

    def __init__(self, rule: MakeRoom, moved: Job):
        self.rule, self.moved = rule, moved

    @staticmethod
    def order(s: Session, v: Holding) -> tuple:
        return (work_lost(s, v.job), v.job.id)

    def allows(self, s: Session, job: Job, victims: list[Job]) -> bool:
        taken: dict[str, list[int]] = {}
        charges = running_charges(s.ctx)
        for v in victims:
            if self.rule.evict_kind(s, v) == _RECLAIM:
                row = taken.setdefault(v.team, [0, 0])
                mem, comp = charges.get(v.id, (0, 0))
                row[0] += mem
                row[1] += comp
        usage, quotas = team_usage(s.ctx), s.snap.quotas
        # The moved job's team gets it back once it is placed here.
        back = job_charge(s.ctx, self.moved)
        out = True
        for t, row in taken.items():
            used = usage.get(t, (0, 0))
            if t == self.moved.team:
                used = (used[0] + back[0], used[1] + back[1])
            out = out and keeps_guarantee(quotas.get(t), used, row)
        return out

    @staticmethod
    def cost(s: Session, chosen: list[Holding]) -> tuple:
        return (sum(work_lost(s, v.job) for v in chosen), len(chosen))


def _why(s: Session, job: Job, view: Job, within: bool) -> str:
    """Why work is moved, as the moved job's events say it: 'to free an NVLink node for team llm's guaranteed
    8-GPU job 12'."""
    req = view.request
    if req.nodes > 1:
        room = f"{req.nodes} nodes"
    elif req.topology is TopologyNeed.NVLINK:
        room = "an NVLink island" if req.gpus < _largest_node(s) else "an NVLink node"
    else:
        room = f"{req.gpus} GPUs on one node"
    what = "guaranteed" if within else "reserved"
    gpus = req.gpus * req.nodes
    return f"to free {room} for team {job.team}'s {what} {gpus}-GPU job {job.id}"


def _largest_node(s: Session) -> int:
    return max((len(n.gpus) for n in s.snap.nodes), default=0)


def hold_returning(s: Session, job: Job) -> bool:
    """A job being moved (pending with `ready_at` in the future: it is still stopping where it ran) holds its
    best place now, until it is ready; later jobs see it as taken. False when no place can be held."""
    view = effective(s, job)
    if isinstance(view, Status):
        return False
    chosen = choose(s, view)
    if chosen is None:
        return False
    planned = plan(s, view, chosen)
    if planned is None:
        return False
    start = float(job.ready_at or s.snap.now)
    s.hold(job, start, planned)
    s.reservations.append(Reservation(job.id, tuple(a for _, assigns in planned for a in assigns), start))
    s.est_start[job.id] = start
    return True
