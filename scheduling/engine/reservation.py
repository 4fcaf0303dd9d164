"""Reservations for blocked jobs: hold the cards a job gets when enough running jobs end, and estimate when.

Allocate reserves at a blocked job's turn when the profile backfills (docs/engine.md, "Reservations"); the holds
are what later jobs see as taken, unless they end before the reservation's start (backfill).
"""

from __future__ import annotations

import numpy as np

from scheduling.engine.placement import feasible, node_ok, plan
from scheduling.engine.resources import release_many, release_on_node
from scheduling.engine.session import Session, overlay
from scheduling.engine.types import Assignment, Job, Node, Reservation

NEG_INF = float("-inf")
INF = float("inf")


def reserve(s: Session, job: Job) -> None:
    """Hold the cards the job will get when enough running jobs end, and estimate when that is.

    When the running jobs' declared max runtimes never free enough room, the job still holds its best
    candidate cards (`closest_candidates`): with the time the jobs it may preempt there pass the minimum
    runtime as its estimated start, or with no estimated start when it waits for jobs with no known end.
    Cards held with no start count as needed soon: no lower job may take them as they free up, so big jobs
    do not starve behind a stream of small ones."""
    req = job.request
    if not req.uses_gpu:
        return
    scratch: dict[int, Node] = {}

    def view(pos: int) -> Node:
        real = scratch.get(pos) or s.real_node(pos)
        return overlay(real, s.holds.get(pos, []))

    ok, _ = feasible(s, job)
    fitting: set[int] = set(np.flatnonzero(ok).tolist())
    static = s.index.static(req)
    # A node fits whole cards only once it has that many idle: its idle cards now plus the cards released so
    # far bound that from above, so until they reach the request its releases are only noted (most of a long
    # walk is releases on nodes that cannot fit yet, and building each node after each release is the cost).
    idle_now, need_whole = s.index.n_idle, req.gpus
    freed: dict[int, set[int]] = {}
    deferred: dict[int, list[tuple[tuple[Assignment, ...], int, int]]] = {}
    start = None
    blocker = ("", "")
    for end, _, assignments, running in s.end_events():
        for pos, assigns, cpu, mem in s.releases_of(running, assignments):
            if not static[pos]:
                continue
            later = deferred.setdefault(pos, [])
            later.append((assigns, cpu, mem))
            if need_whole:
                cards = freed.setdefault(pos, set())
                cards.update(a.gpu_index for a in assigns)
                if int(idle_now[pos]) + len(cards) < need_whole:
                    continue
            scratch[pos] = release_many(scratch.get(pos) or s.real_node(pos), later)
            later.clear()
            if node_ok(s, job, view(pos)):
                fitting.add(pos)
        if len(fitting) >= req.nodes:
            start = end
            blocker = (running.id, "ends")
            break
    if start is not None:
        chosen = [(p, view(p)) for p in s.index.ranked(fitting)[: req.nodes]]
    else:
        if not s.param("reserve_unknown_start"):
            return
        found = closest_candidates(s, job, static, fitting)
        if found is None:
            return
        start, chosen, blocker = found
    kept = _kept(s, job, static, fitting, start, chosen)
    if kept is not None:
        start, chosen, blocker = kept
    planned = plan(s, job, chosen)
    if planned is None:
        return
    assignments = tuple(a for _, assigns in planned for a in assigns)
    s.reservations.append(Reservation(job.id, assignments, start, *blocker))
    if start is not None:
        s.est_start[job.id] = start
    # An unknown start binds like an imminent one: no lower job's max runtime provably ends before it.
    s.hold(job, NEG_INF if start is None else start, planned)


def _kept(
    s: Session,
    job: Job,
    static: np.ndarray,
    fitting: set[int],
    start: float | None,
    chosen: list[tuple[int, Node]],
) -> tuple[float | None, list[tuple[int, Node]], tuple[str, str]] | None:
    """The job's reservation of the previous cycle, kept while it still makes sense: its nodes are still there,
    ready and able to host it, and no start sooner by more than `reservation_switch_s` (or a quarter of the wait)
    was found elsewhere. Returns where it stays (None: the new choice stands; why the old one was dropped is
    noted for its pending reason)."""
    if not job.reserved_on:
        return None
    names = tuple(sorted(job.reserved_on))
    if names == tuple(sorted(s.index.names[p] for p, _ in chosen)):
        return None
    where = ", ".join(names)
    positions = []
    for name in names:
        pos = s.pos_of(name)
        if pos is None:
            s.reservation_notes[job.id] = f"its reservation on {where} was dropped: {name} left the cluster"
            return None
        node = s.index.nodes[pos]
        if not node.schedulable:
            s.reservation_notes[job.id] = (
                f"its reservation on {where} was dropped: {name} is {node.state.value}"
            )
            return None
        if not static[pos]:
            s.reservation_notes[job.id] = (
                f"its reservation on {where} was dropped: {name} no longer has cards it may use"
            )
            return None
        positions.append(pos)
    if len(positions) != job.request.nodes:
        return None
    mask = np.zeros_like(static)
    mask[positions] = True
    found = closest_candidates(s, job, mask, fitting & set(positions), limit=len(positions))
    if found is None or len(found[1]) < job.request.nodes:
        s.reservation_notes[job.id] = f"its reservation on {where} was dropped: it can no longer start there"
        return None
    kept_start = found[0]
    now = s.snap.now
    if start is not None:
        margin = max(float(s.param("reservation_switch_s") or 0.0), 0.25 * (start - now))
        if kept_start is None or kept_start > start + margin:
            sooner = ", ".join(sorted(s.index.names[p] for p, _ in chosen))
            s.reservation_notes[job.id] = (
                f"its reservation on {where} was dropped: it can start sooner on {sooner}"
            )
            return None
    return found


def closest_candidates(
    s: Session, job: Job, static: np.ndarray, fitting: set[int], *, limit: int | None = None
) -> tuple[float | None, list[tuple[int, Node]], tuple[str, str]] | None:
    """Where the job gets in soonest when the declared ends alone never make room: per node, the running
    jobs are released in the order they are expected to go (by their declared end, or, for jobs this one
    may preempt, when they pass the minimum runtime; the rest, with no known end, oldest first) until the
    job fits; the node whose last needed release comes first wins (then fewest releases, then snapshot
    order). Returns that time (None when a job with no known end must go) and the nodes with the views to
    plan on, and the running job whose end (or preemption) frees the last cards needed. Only the
    `reservation_candidates` nodes with the most free room now are examined (or `limit`), which keeps this cheap
    on a large cluster; the room a reservation holds stays free, so the same node stays the closest from cycle
    to cycle."""
    req = job.request
    if limit is None:
        limit = max(int(s.param("reservation_candidates") or 0), 2 * req.nodes)
    idx = s.index
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
    by_pos = s.holdings_by_pos()
    placed_here = s.placed_on(examined)
    now = s.snap.now
    can_preempt = s.preempts
    min_runtime_s = float(s.param("min_runtime_s") or 0.0)

    def gone_by(v: Job, start_time: float | None) -> float:
        started = start_time if start_time is not None else now
        end = started + v.max_runtime_s if v.max_runtime_s is not None else INF
        # Priority preempts the team's own work only.
        if can_preempt and v.preemptible and v.priority < job.priority and v.team == job.team:
            # Evictable once past the minimum runtime (a job with no start time counts as old enough).
            end = min(end, started + min_runtime_s if start_time is not None else now)
        return max(now, end)

    ranked: list[tuple[tuple, int, Node]] = []
    for pos in examined:
        base = s.real_node(pos)
        holds = s.holds.get(pos, [])
        waits = [
            (
                gone_by(h.job, h.job.start_time),
                h.job.start_time if h.job.start_time is not None else now,
                h.job.id,
                h,
            )
            for h in by_pos.get(pos, ())
            if h.job.id not in s.evicted
        ]
        # A job placed earlier in this cycle is waited for only if its end is known (or it may be preempted).
        waits += [
            w
            for w in ((gone_by(h.job, now), now, h.job.id, h) for h in placed_here.get(pos, ()))
            if w[0] < INF
        ]
        waits.sort(key=lambda w: w[:3])
        node = overlay(base, holds)
        if node_ok(s, job, node):
            ranked.append(((now, 0, int(idx.rank[pos])), pos, node, ("", "")))
            continue
        for n, (t, _, _, h) in enumerate(waits, start=1):
            base = release_on_node(base, tuple(h.assignments), h.cpu_milli, h.memory_mib)
            node = overlay(base, holds)
            if node_ok(s, job, node):
                how = (
                    "ends"
                    if h.job.max_runtime_s is not None and t >= _declared_end(h.job, now)
                    else ("can be preempted" if t < INF else "ends")
                )
                ranked.append(((t, n, int(idx.rank[pos])), pos, node, (h.job.id, how)))
                break
    ranked.sort(key=lambda t: t[0])
    nodes = [(pos, s.index.nodes[pos]) for pos in fitting]
    nodes += [(pos, node) for _, pos, node, _ in ranked]
    if len(nodes) < req.nodes:
        return None
    needed = ranked[: req.nodes - len(fitting)]
    start = max((key[0] for key, _, _, _ in needed), default=now)
    last = max(needed, key=lambda t: t[0])[3] if needed else ("", "")
    return (None if start == INF else start), nodes[: req.nodes], last


def _declared_end(v: Job, now: float) -> float:
    started = v.start_time if v.start_time is not None else now
    return started + v.max_runtime_s if v.max_runtime_s is not None else INF
