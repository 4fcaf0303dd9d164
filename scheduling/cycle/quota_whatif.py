"""What-if for a quota edit: what would change if this team's quota were this, before anything is saved.

On the what-if snapshot (`whatif.current_snapshot`), the edited quota is swapped in and the engine's own rules
answer: the guarantees of all teams against the installed capacity per GPU model; which running jobs the
team's standing would move onto or off borrowed capacity (`accounting.standing`, the rule the cycle labels
them by); and what the next cycle would decide differently (`run_cycle` on both snapshots): pending jobs that
would start or no longer start, running work that would be reclaimed or preempted. Nothing is written.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from quotas.models import Quota as QuotaRow
from scheduling.cycle.arrays import row_id
from scheduling.cycle.snapshot import cycle_profile, engine_shares
from scheduling.cycle.whatif import current_snapshot
from scheduling.engine import run_cycle
from scheduling.engine import types as eng
from scheduling.engine.accounting import beyond_guarantee, effective_quotas, standing
from scheduling.engine.framework import CycleContext, Profile
from scheduling.engine.resources import charge_of


@dataclass(frozen=True)
class CapacityLine:
    """One quota scope (all GPU models, or one model): the sum of every team's guarantee there against the
    cards installed (on nodes not lost), before and after the edit."""

    scope: str  # "all GPU models" or a model name
    gpus: int
    memory_mib: int
    guaranteed_gpus_before: float
    guaranteed_gpus_after: float
    guaranteed_memory_mib_before: int
    guaranteed_memory_mib_after: int

    @property
    def over_committed(self) -> bool:
        return self.guaranteed_gpus_after > self.gpus or self.guaranteed_memory_mib_after > self.memory_mib

    @property
    def changed(self) -> bool:
        return (self.guaranteed_gpus_before, self.guaranteed_memory_mib_before) != (
            self.guaranteed_gpus_after,
            self.guaranteed_memory_mib_after,
        )


@dataclass(frozen=True)
class JobChange:
    job_id: int
    team: str
    gpus: float  # whole-GPU equivalents it holds (or would hold)
    memory_mib: int


@dataclass(frozen=True)
class TeamStanding:
    guaranteed_gpus: float
    held_gpus: float
    borrowed_gpus: float


@dataclass(frozen=True)
class QuotaImpact:
    team: str
    scope: str
    capacity: tuple[CapacityLine, ...]
    before: TeamStanding
    after: TeamStanding
    becomes_borrowed: tuple[JobChange, ...]  # running work the team would hold beyond its guarantee
    stops_borrowed: tuple[JobChange, ...]
    would_start: tuple[JobChange, ...]  # in the next cycle, and not without the edit
    would_not_start: tuple[JobChange, ...]
    would_be_evicted: tuple[JobChange, ...]  # reclaimed (or preempted) in the next cycle, and not without it

    @property
    def over_committed(self) -> tuple[CapacityLine, ...]:
        return tuple(line for line in self.capacity if line.over_committed)

    @property
    def changes_nothing(self) -> bool:
        return not (
            self.becomes_borrowed
            or self.stops_borrowed
            or self.would_start
            or self.would_not_start
            or self.would_be_evicted
        )


def proposed_quotas(quotas: dict[str, eng.Quota] | object, *, row: QuotaRow) -> dict[str, eng.Quota]:
    """The engine's quotas with this (unsaved) row in place of the team's stored one: the all-models fields, or
    the per-model row of its GPU model."""
    out = dict(quotas)  # type: ignore[call-overload]
    slug = row.team.slug
    current = out.get(slug) or eng.Quota(team=slug)
    shares = engine_shares(row)
    if row.gpu_model_id is None:
        out[slug] = replace(current, weight=float(row.fair_share_weight), **shares)
    else:
        model = row.gpu_model.name
        rows = [r for r in current.per_model if r.model != model]
        rows.append(eng.ModelQuota(model=model, **shares))
        out[slug] = replace(current, per_model=tuple(sorted(rows, key=lambda r: r.model)))
    return out


def _capacity(snap: eng.Snapshot, before: dict, after: dict) -> tuple[CapacityLine, ...]:
    cards: dict[str, list[int]] = {}
    for node in snap.nodes:
        if node.state is eng.NodeState.LOST:
            continue
        for gpu in node.gpus:
            row = cards.setdefault(gpu.model, [0, 0])
            row[0] += 1
            row[1] += gpu.memory_mib

    def sums(quotas: dict, model: str | None) -> tuple[float, int]:
        gpus = memory = 0
        for q in quotas.values():
            rows = [q] if model is None else [r for r in q.per_model if r.model == model]
            for r in rows:
                gpus += r.guaranteed_compute_milli
                memory += r.guaranteed_gpu_memory_mib
        return gpus / eng.WHOLE_GPU_MILLI, memory

    models = sorted(set(cards) | {r.model for q in after.values() for r in q.per_model})
    lines = []
    for model in [None, *models]:
        gpus, memory = (
            (sum(c[0] for c in cards.values()), sum(c[1] for c in cards.values()))
            if model is None
            else tuple(cards.get(model, (0, 0)))
        )
        (g_before, m_before), (g_after, m_after) = sums(before, model), sums(after, model)
        if model is not None and not (g_before or g_after or m_before or m_after):
            continue  # a model no team has a per-model guarantee on: the all-models line covers it
        lines.append(
            CapacityLine(
                scope=model or "all GPU models",
                gpus=gpus,
                memory_mib=memory,
                guaranteed_gpus_before=g_before,
                guaranteed_gpus_after=g_after,
                guaranteed_memory_mib_before=m_before,
                guaranteed_memory_mib_after=m_after,
            )
        )
    return tuple(lines)


def _borrowed_now(snap: eng.Snapshot, profile: Profile) -> set[str]:
    """The running jobs on borrowed capacity as the teams stand now, by the cycle's rule (`standing`, on the
    quotas as the engine applies them)."""
    snap = replace(snap, quotas=effective_quotas(snap.quotas, snap.nodes))
    ctx = CycleContext(snapshot=snap, profile=profile, rng=random.Random(snap.seed))
    return standing(ctx, snap.running, {job.id: job.assignments for job in snap.running})


def _team_standing(snap: eng.Snapshot, team: str) -> TeamStanding:
    quota = effective_quotas(snap.quotas, snap.nodes).get(team)
    held = [0, 0]
    for job in snap.running:
        if job.team == team:
            mem, comp = charge_of(job.assignments)
            held[0] += mem
            held[1] += comp
    stated = snap.quotas.get(team)
    return TeamStanding(
        guaranteed_gpus=(stated.guaranteed_compute_milli if stated else 0) / eng.WHOLE_GPU_MILLI,
        held_gpus=held[1] / eng.WHOLE_GPU_MILLI,
        borrowed_gpus=beyond_guarantee(quota, held)[1] / eng.WHOLE_GPU_MILLI,
    )


def _change(job: eng.Job, assignments: tuple[eng.Assignment, ...]) -> JobChange:
    mem, comp = charge_of(assignments)
    return JobChange(job_id=row_id(job.id), team=job.team, gpus=comp / eng.WHOLE_GPU_MILLI, memory_mib=mem)


def quota_impact(*, row: QuotaRow, snapshot: eng.Snapshot | None = None) -> QuotaImpact:
    """What saving this quota row (edited, not saved; its team and GPU model loaded) would change."""
    snap = current_snapshot() if snapshot is None else snapshot
    edited = replace(snap, quotas=proposed_quotas(snap.quotas, row=row))
    profile = cycle_profile()
    running = {job.id: job for job in snap.running}
    pending = {job.id: job for job in snap.pending}

    borrowed_before, borrowed_after = _borrowed_now(snap, profile), _borrowed_now(edited, profile)
    before, after = run_cycle(snap, profile), run_cycle(edited, profile)
    placed_before = {p.job_id: p for p in before.placements}
    placed_after = {p.job_id: p for p in after.placements}
    evicted_before = {e.job_id for e in before.evictions}

    def held(ids: set[str]) -> tuple[JobChange, ...]:
        return tuple(sorted((_change(running[i], running[i].assignments) for i in ids), key=_order))

    def placed(ids: set[str], placements: dict[str, eng.Placement]) -> tuple[JobChange, ...]:
        return tuple(sorted((_change(pending[i], placements[i].assignments) for i in ids), key=_order))

    return QuotaImpact(
        team=row.team.slug,
        scope=row.gpu_model.name if row.gpu_model_id else "all GPU models",
        capacity=_capacity(snap, dict(snap.quotas), dict(edited.quotas)),
        before=_team_standing(snap, row.team.slug),
        after=_team_standing(edited, row.team.slug),
        becomes_borrowed=held(borrowed_after - borrowed_before),
        stops_borrowed=held(borrowed_before - borrowed_after),
        would_start=placed(set(placed_after) - set(placed_before), placed_after),
        would_not_start=placed(set(placed_before) - set(placed_after), placed_before),
        would_be_evicted=held({e.job_id for e in after.evictions} - evicted_before),
    )


def _order(change: JobChange) -> tuple:
    return (change.team, change.job_id)
