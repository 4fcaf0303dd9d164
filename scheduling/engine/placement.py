"""Placing one job in a session: which nodes fit and how they score, which nodes and cards it takes, the exact
quota check of that placement, and taking the capacity (directly, or staged in a `Statement`).

Allocate, reclaim, preempt and the pending reasons all ask the same questions through these functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from scheduling.engine.accounting import model_usage_add, usage_add
from scheduling.engine.resources import charge_of, choose_whole, node_fits, slice_fits_gpu, whole_assignments
from scheduling.engine.session import Session, card, overlay
from scheduling.engine.statement import Statement
from scheduling.engine.types import Assignment, Job, Node, Placement, Status


def evaluator(s: Session, job: Job) -> Callable[[int], tuple[bool, float]]:
    """What the node index asks of a position it has no current verdict for: fits, and the cached score."""
    req, nodes, ctx, factor = job.request, s.index.nodes, s.ctx, s.factor
    filters, scores = s.plugins.cached_filters, s.plugins.cached_scores

    def evaluate(pos: int) -> tuple[bool, float]:
        node = nodes[pos]
        if not node_fits(req, node, factor):
            return False, 0.0
        for f in filters:
            if f.filter(ctx, job, node) is not None:
                return False, 0.0
        return True, float(sum(w * p.score_node(ctx, job, node) for p, w in scores))

    return evaluate


def node_ok(s: Session, job: Job, node: Node) -> bool:
    """Whether this node (as given: a scratch or overlaid view) can host the job: fits and every filter passes."""
    if not node_fits(job.request, node, s.factor):
        return False
    ctx = s.ctx
    return all(f.filter(ctx, job, node) is None for f in s.plugins.filters)


def node_score(s: Session, job: Job, node: Node) -> float:
    ctx = s.ctx
    return float(sum(w * p.score_node(ctx, job, node) for p, w in s.plugins.node_scores))


def feasible(s: Session, job: Job) -> tuple[np.ndarray, np.ndarray]:
    """(fits, score) per position in the view every job sees (reserved capacity counts as taken)."""
    memo = s.index.memo(job.request, evaluator(s, job))
    ok, score = memo.ok & s.index.present, memo.score
    plugins = s.plugins
    live_f, live_s = plugins.live_filters, plugins.live_scores
    if live_f or live_s:
        score = score.copy()
        nodes, ctx = s.index.nodes, s.ctx
        idx = np.flatnonzero(ok).tolist()
        for f in live_f:
            refused = [p for p in idx if f.filter(ctx, job, nodes[p]) is not None]
            if refused:
                ok[refused] = False
                idx = np.flatnonzero(ok).tolist()
        if idx:
            chosen = [nodes[p] for p in idx]
            for (plugin, weight), many in zip(live_s, plugins.live_batch, strict=True):
                # A plugin may score many nodes at once (`BatchNodeScorer`), which saves a call per node.
                if many is not None:
                    values = many(ctx, job, chosen)
                else:
                    one = plugin.score_node
                    values = [one(ctx, job, node) for node in chosen]
                score[idx] += weight * np.asarray(values, dtype=np.float64)
    return ok, score


def backfill_views(s: Session, job: Job) -> dict[int, tuple[float, Node]]:
    """Reserved nodes as this job may use them: a reservation it would end before does not bind it."""
    out: dict[int, tuple[float, Node]] = {}
    if not s.holds or job.max_runtime_s is None:
        return out
    end = s.snap.now + job.max_runtime_s
    for pos in sorted(s.holds):
        holds = s.holds[pos]
        binding = [h for h in holds if h.start < end]
        if len(binding) == len(holds):
            continue
        node = overlay(s.real[pos], binding)
        if node_ok(s, job, node):
            out[pos] = (node_score(s, job, node), node)
    return out


def choose(s: Session, job: Job) -> list[tuple[int, Node]] | None:
    """The nodes (best score first, ties to snapshot order) the job would take, with the view to plan on.

    Where no node could take a request, none can until something frees capacity: the next job with the same
    request (and max runtime, which decides what backfill it may do) is answered at once. Only verdicts that
    follow from the request alone are remembered (no filter or score that looks at the job itself)."""
    plugins = s.plugins
    remember = not (plugins.live_filters or plugins.live_scores)
    key = (job.request, job.max_runtime_s)
    if remember and s.no_room.get(key) == s.index.release_clock:
        return None
    chosen = _choose(s, job)
    if chosen is None and remember:
        s.no_room[key] = s.index.release_clock
    return chosen


def _choose(s: Session, job: Job) -> list[tuple[int, Node]] | None:
    extra = backfill_views(s, job)
    index = s.index
    nodes = index.nodes
    want = job.request.nodes
    if want <= 1 and not extra and not (s.plugins.live_filters or s.plugins.live_scores):
        # The common case: the memo remembers its best node until a node changes.
        memo = index.memo(job.request, evaluator(s, job))
        if memo.best is False:
            memo.best = index.best(memo.ok, memo.score) if memo.ok.any() else None
        return None if memo.best is None else [(memo.best, nodes[memo.best])]
    ok, score = feasible(s, job)
    rank = index.rank
    if want <= 1:
        pos = index.best(ok, score)
        best = (float(score[pos]), -int(rank[pos])) if pos is not None else None
        choice = (pos, nodes[pos]) if pos is not None else None
        for p, (sc, node) in extra.items():
            if best is None or (sc, -int(rank[p])) > best:
                best, choice = (sc, -int(rank[p])), (p, node)
        return [choice] if choice else None
    idx = np.flatnonzero(ok)
    ranked = [(float(score[p]), int(rank[p]), p, nodes[p]) for p in idx.tolist() if p not in extra]
    ranked += [(sc, int(rank[p]), p, node) for p, (sc, node) in extra.items()]
    if len(ranked) < want:
        return None
    ranked.sort(key=lambda t: (-t[0], t[1]))
    return [(p, node) for _, _, p, node in ranked[:want]]


def plan(
    s: Session, job: Job, chosen: list[tuple[int, Node]]
) -> list[tuple[int, tuple[Assignment, ...]]] | None:
    """The cards the job takes on each chosen node: whole cards by the profile's card chooser (or the
    lowest-index free ones), a slice on the best-scoring card that holds it (ties to the lowest index)."""
    req = job.request
    out = []
    chooser = s.plugins.choose_cards
    for pos, node in chosen:
        if req.gpus:
            if chooser is not None:
                cards = chooser(s.ctx, job, node)
            else:
                cards = choose_whole(req, node, topology_aware=False)
            if cards is None:
                return None
            out.append((pos, whole_assignments(node, cards)))
        elif req.is_slice:
            best = None
            for i, g in enumerate(node.gpus):
                charge = slice_fits_gpu(req, g, s.factor)
                if charge is None:
                    continue
                sc = sum(w * p.score_gpu(s.ctx, job, node, g) for p, w in s.plugins.gpu_scores)
                if best is None or sc > best[0]:
                    best = (sc, i, charge)
            if best is None:
                return None
            _, i, (mem, comp) = best
            out.append((pos, (Assignment(node.name, node.gpus[i].index, mem, comp),)))
        else:
            out.append((pos, ()))
    return out


def effective(s: Session, job: Job) -> Job | Status:
    """The job as it may be placed now: when per-GPU-model quota rules keep its team off some models, the
    same job with its allowed models narrowed to the rest (or, when none is left, why it must wait).

    A narrowed request is a request of its own to the node index, so the memos and cached verdicts stay
    keyed by what they depend on. Only jobs of `restricted` teams are looked at; the answer follows the
    team's usage at the moment of asking, which this cycle's placements and evictions change."""
    if job.team not in s.restricted or not job.request.uses_gpu:
        return job
    allowed: tuple[str, ...] | None = None
    notes: list[Status] = []
    for plugin in s.plugins.restrictors:
        restriction = plugin.restrict_models(s.ctx, job)
        if restriction is None:
            continue
        notes.append(restriction.status)
        allowed = (
            restriction.allowed if allowed is None else tuple(m for m in allowed if m in restriction.allowed)
        )
    if allowed is None:
        s.model_notes.pop(job.id, None)
        return job
    note = notes[0] if len(notes) == 1 else Status(notes[0].code, "; ".join(n.reason for n in notes))
    s.model_notes[job.id] = note
    if not allowed:
        return note
    return replace(job, request=replace(job.request, gpu_models=allowed))


def _without_models(
    s: Session, view: Job, chosen: list[tuple[int, Node]], planned: list[tuple[int, tuple[Assignment, ...]]]
) -> Job | None:
    """The job without the GPU models a plan used (None when no model would be left)."""
    nodes = dict(chosen)
    used = set()
    for pos, assigns in planned:
        for a in assigns:
            gpu = card(nodes[pos], a.gpu_index)
            if gpu is not None:
                used.add(gpu.model)
    req = view.request
    remaining = tuple(m for m in (req.gpu_models or s.index.snapshot_models()) if m not in used)
    if not remaining or not used:
        return None
    return replace(view, request=replace(req, gpu_models=remaining))


def _refused_on_models(s: Session, job: Job, assignments: tuple[Assignment, ...]) -> Status | None:
    """A per-model rule's refusal of these exact assignments (None: every model they touch allows them)."""
    if job.team not in s.restricted:
        return None
    for plugin in s.plugins.model_checks:
        status = plugin.admit_assignments(s.ctx, job, assignments)
        if status is not None:
            return status
    return None


def try_place(
    s: Session,
    job: Job,
    *,
    chosen: list[tuple[int, Node]] | None = None,
    stmt: Statement | None = None,
    home: bool = False,
) -> bool:
    """Place the job now if it fits and its exact charge is admitted (on `chosen` when given, as an evicting
    job is). Staged in `stmt` when given; otherwise recorded at once. A refusal is left in `s.status`. With
    `home`, the job is a moved job's next run: staged among the statement's `homes`, not as its placement."""
    view = effective(s, job)
    if isinstance(view, Status):
        s.status[job.id] = view
        return False
    while True:
        pick = chosen if chosen is not None else choose(s, view)
        if pick is None:
            return False
        planned = plan(s, view, pick)
        if planned is None:
            return False
        assignments = tuple(a for _, assigns in planned for a in assigns)
        refused = _refused_on_models(s, job, assignments)
        if refused is None:
            break
        # Charged exactly (a MIG instance rounds a slice up) a model would take the team past its limit
        # there: look again without the models this plan used, as if they had been ruled out up front.
        narrower = _without_models(s, view, pick, planned) if chosen is None else None
        if narrower is None:
            s.status[job.id] = refused
            s.model_notes[job.id] = refused
            return False
        view = narrower
    charge = charge_of(assignments)
    borrowed = False
    ctx = s.ctx
    if job.team in s.restricted:
        borrowed = any(p.borrowed_assignments(ctx, job, assignments) for p in s.plugins.model_borrowed)
    for check, is_borrowed in s.plugins.charge_checks:
        if check is not None:
            status = check(ctx, job, charge)
            if status is not None:
                s.status[job.id] = status
                return False
        if is_borrowed is not None and is_borrowed(ctx, job, charge):
            borrowed = True
    req = job.request
    cpu = {}
    for pos, assigns in planned:
        name = s.index.names[pos]
        cpu[name] = (req.cpu_milli, req.memory_mib)
        if stmt is not None:
            stmt.touch(pos)
        s.take(pos, assigns, req.cpu_milli, req.memory_mib)
    usage_add(ctx, job.team, charge[0], charge[1], job.priority_class, job.priority)
    if job.team in s.restricted:
        model_usage_add(ctx, job.team, assignments, 1)
    placement = Placement(job.id, assignments, borrowed, cpu)
    if stmt is not None:
        stmt.usage.append((job.team, charge[0], charge[1], job.priority_class, job.priority))
        if job.team in s.restricted:
            stmt.model_usage.append((job.team, assignments, 1))
        if home:
            stmt.homes.append((job, placement))
            return True
        stmt.placement = placement
    else:
        s.placements.append(placement)
        s.placed_jobs.append(job)
    s.status.pop(job.id, None)
    s.blocked.discard(job.id)
    return True
