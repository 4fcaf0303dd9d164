"""The start projection: a cheap estimate of when each pending job starts, from the running jobs' declared max
runtimes and the capacity per GPU model (docs/engine.md, "Pending reasons").
"""

from __future__ import annotations

from bisect import insort

import numpy as np

from scheduling.engine.resources import compute_cap_milli, gpu_is_free
from scheduling.engine.session import Session, card
from scheduling.engine.types import WHOLE_GPU_MILLI, Assignment, Health, Job, Node, Request, Sharing


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
            # Compared as whole tuples (no key function: this runs once per queued job). Events at one instant
            # are taken together, so their order among themselves does not matter.
            insort(self.events, (until, need), lo=self.next)
            self.future += need


# A kind of card: its model name, memory MiB and compute capability. One model name may come in two memory sizes
# (an H100 of 40 and one of 80 GiB): each size is a pool of its own, so the answer does not depend on which the
# engine met first.
CardKind = tuple[str, int, tuple[int, int]]


def _kind(g) -> CardKind:
    return (g.model, g.memory_mib, g.compute_capability)


def _gives_back(
    s: Session, assignments: tuple[Assignment, ...]
) -> tuple[tuple[tuple[CardKind, bool], int], ...]:
    """What a job's cards give back to the projection's pools when it ends: idle cards, shared compute."""
    out: dict[tuple[CardKind, bool], int] = {}
    for a in assignments:
        pos = s.pos_of(a.node)
        if pos is None:
            continue
        g = card(s.real_node(pos), a.gpu_index)
        if g is None or g.health is Health.FAILED:
            continue
        is_shared = g.sharing is not Sharing.EXCLUSIVE
        kind = _kind(g)
        if a.compute_milli >= WHOLE_GPU_MILLI and a.memory_mib >= g.memory_mib:
            out[(kind, False)] = out.get((kind, False), 0) + 1
            if is_shared:
                out[(kind, True)] = out.get((kind, True), 0) + WHOLE_GPU_MILLI
        elif is_shared:
            out[(kind, True)] = out.get((kind, True), 0) + a.compute_milli
    return tuple(out.items())


def _pool_row(node: Node, factor: float) -> tuple:
    """What a node adds to the projection's pools, per kind of card: (kind, card memory MiB, compute capability,
    has shared cards, idle cards, free compute milli on shared cards)."""
    per: dict[CardKind, list] = {}
    for g in node.gpus:
        if g.health is Health.FAILED:
            continue
        kind = _kind(g)
        row = per.get(kind)
        if row is None:
            row = per[kind] = [kind, g.memory_mib, g.compute_capability, False, 0, 0]
        if g.sharing is not Sharing.EXCLUSIVE:
            row[3] = True
            if g.allocated_memory_mib < g.memory_mib:
                row[5] += max(0, compute_cap_milli(g, factor) - g.allocated_compute_milli)
        if gpu_is_free(g):
            row[4] += 1
    return tuple(tuple(r) for r in per.values())


def _releases(
    s: Session, ends: list[tuple[float, Job, tuple[Assignment, ...]]], *, running: bool
) -> dict[tuple[CardKind, bool], list[tuple[float, int]]]:
    """What these jobs give back to each pool at their ends, soonest first. What a running job gives back is
    kept between cycles (its cards do not change); given the running jobs, the kept answers become theirs."""
    releases: dict[tuple[CardKind, bool], list[tuple[float, int]]] = {}
    memo = s.state.releases
    seen: dict[str, tuple] = {}
    for end, job, assignments in ends:
        known = memo.get(job.id)
        if known is not None and known[0] is assignments:
            gives = known[1]
        else:
            gives = _gives_back(s, assignments)
        seen[job.id] = (assignments, gives)
        for key, amount in gives:
            releases.setdefault(key, []).append((end, amount))
    if running:
        s.state.releases = seen
    for events in releases.values():
        events.sort()
    return releases


class StartProjection:
    """A cheap estimate of when each pending job starts: per GPU model, the cluster's idle cards and free shared
    compute now, plus what the running jobs give back at their declared ends (`start_time + max_runtime_s`);
    pending jobs take capacity in queue order (holding it for their own max runtime, or for good when they
    declare none). It ignores which node the capacity is on, so it is a lower bound for jobs that need many
    cards on one node. A job gets None when the capacity it needs is never known to come free."""

    def __init__(self, s: Session, pools: dict[tuple[CardKind, bool], _Pool], models: dict[CardKind, tuple]):
        self.session = s
        self.pools = pools
        # kind -> (card memory MiB, compute capability, has shared cards), in a fixed order: ties between kinds
        # go the same way whatever order the cycle met the nodes in.
        self.models = dict(sorted(models.items()))
        self._by_request: dict[Request, list[tuple[tuple[CardKind, bool], int]]] = {}

    @classmethod
    def build(cls, s: Session) -> StartProjection | None:
        now = s.snap.now
        # The running jobs' releases per pool follow from the running jobs alone: kept for cycles on the same
        # snapshot (what-ifs) while nothing is evicted. This cycle's placements are added to a copy.
        kept = s.running_memo()
        running = kept.get("projection.releases") if not s.evicted else None
        if running is None:
            ends: list[tuple[float, Job, tuple[Assignment, ...]]] = []
            for job in s.snap.running:
                if job.max_runtime_s is not None and job.id not in s.evicted:
                    start = job.start_time if job.start_time is not None else now
                    ends.append((max(now, start + job.max_runtime_s), job, job.assignments))
            running = (bool(ends), _releases(s, ends, running=True))
            if not s.evicted:
                kept["projection.releases"] = running
        any_end, running_releases = running
        if not any_end:
            return None  # nothing is known to end: no estimate can be made
        releases = {key: list(events) for key, events in running_releases.items()}
        by_id = {p.job_id: p for p in s.placements}
        placed = [
            (now + job.max_runtime_s, job, by_id[job.id].assignments)
            for job in s.placed_jobs
            if job.max_runtime_s is not None and job.id in by_id
        ]
        for key, events in _releases(s, placed, running=False).items():
            merged = releases.setdefault(key, [])
            merged.extend(events)
            merged.sort()
        index = s.index
        models: dict[CardKind, tuple] = {}
        idle: dict[CardKind, int] = {}
        shared: dict[CardKind, int] = {}
        factor = s.factor

        def add(row: tuple, times: int) -> None:
            for model, memory_mib, cc, has_shared, idle_cards, room_milli in row:
                known = models.get(model)
                if known is None or (has_shared and not known[2]):
                    models[model] = (memory_mib, cc, has_shared or bool(known and known[2]))
                idle[model] = idle.get(model, 0) + idle_cards * times
                shared[model] = shared.get(model, 0) + room_milli * times

        # Nodes of one shape contribute alike: count shapes, summarise each once (and keep it across cycles).
        usable = index.present & index.ready
        held = [pos for pos in s.real if usable[pos]]
        if held:
            usable = usable.copy()
            usable[held] = False
            for pos in held:
                add(_pool_row(s.real[pos], factor), 1)
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
        pools: dict[tuple[CardKind, bool], _Pool] = {}
        for model in models:
            pools[(model, False)] = _Pool(idle.get(model, 0), now)
            pools[(model, True)] = _Pool(shared.get(model, 0), now)
        for key, events in releases.items():
            pool = pools[key]
            pool.events = events
            pool.future = sum(amount for _, amount in events)
        return cls(s, pools, models)

    def _options(self, req: Request) -> list[tuple[tuple[CardKind, bool], int]]:
        """The pools a request may draw on, with what it needs from each (cards, or compute milli)."""
        key = req  # a Request keeps its hash
        options = self._by_request.get(key)
        if options is None:
            options = []
            shared = not req.gpus
            if shared and not req.is_slice:
                pass  # CPU-only: no GPU capacity to wait for
            else:
                for kind, (memory_mib, cc, has_shared) in self.models.items():
                    if req.gpu_models and kind[0] not in req.gpu_models:
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
                    options.append(((kind, shared), need))
            self._by_request[key] = options
        return options

    def start(self, job: Job) -> float | None:
        """The job's projected start (None when unknowable); it then holds that capacity in the projection."""
        now = self.session.snap.now
        best: tuple[float, tuple[CardKind, bool], int, int] | None = None
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
