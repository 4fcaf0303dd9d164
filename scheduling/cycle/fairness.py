"""Fairness as everyone may read it: the organisation -> team tree with each team's guarantee, what it holds,
what it borrows and its fair share; who borrows from whom; and, for one pending job, how the teams whose work
went ahead of it stand.

Aggregates only: team numbers, never another team's jobs or people. Each number comes from the readings the
API uses (`selectors.borrowed_by_team`, `fair_shares_gpus`, `queue_shares`, `jobs.usage.allocations_by_team`)
or from the engine's accounting on the what-if snapshot, so it is what the scheduler decides by.

GPUs here are compute in whole-GPU equivalents (a quarter of a card is 0.25): what a guarantee in GPUs counts.

**Who lends to whom.** Borrowed capacity is first capacity nobody is guaranteed (the cluster's GPUs beyond the
sum of all guarantees): using it takes from no one. Only what is borrowed beyond that comes out of teams'
unused guarantees (guarantee minus what they hold within it), and it is attributed to those teams in
proportion to their unused guarantee; each borrower's borrowing is split the same way. These lenders are the
teams that may reclaim it: a lender that submits work within its guarantee gets it back within the victims'
grace (docs/engine.md, "Guarantees").
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from quotas.models import Team
from scheduling.choices import JobState
from scheduling.cycle.selectors import borrowed_by_team, fair_shares_gpus, queue_shares
from scheduling.cycle.snapshot import cycle_profile, engine_quotas
from scheduling.cycle.whatif import current_snapshot
from scheduling.engine import types as eng
from scheduling.engine.accounting import (
    beyond_guarantee,
    borrowed_per_weight,
    effective_quotas,
    team_usage,
)
from scheduling.engine.framework import CycleContext
from scheduling.engine.plugins.guarantee import within_guarantee_ids
from scheduling.inventory.selectors import schedulable_gpu_count
from scheduling.jobs.models import Job
from scheduling.jobs.usage import TeamAllocation, allocations_by_team

UNGUARANTEED = "capacity nobody is guaranteed"


@dataclass
class TeamFairness:
    slug: str
    name: str
    guaranteed_gpus: float | None  # None: no quota row
    held_gpus: float
    borrowed_gpus: float
    fair_share_gpus: float | None
    weight: float
    queue_share: float  # the fair-share number the queue orders a priority's jobs by (lower first)
    running_jobs: int
    pending_jobs: int
    lent_gpus: float = 0.0
    children: list[TeamFairness] = field(default_factory=list)

    @property
    def unused_gpus(self) -> float:
        """What of its guarantee the team does not hold now (what it lends when others borrow beyond the
        unguaranteed capacity)."""
        return max(0.0, (self.guaranteed_gpus or 0.0) - (self.held_gpus - self.borrowed_gpus))

    @property
    def borrowed_per_weight(self) -> float:
        return self.borrowed_gpus / self.weight if self.weight > 0 else self.borrowed_gpus

    @property
    def within_gpus(self) -> float:
        return max(0.0, self.held_gpus - self.borrowed_gpus)

    @property
    def tier(self) -> str:
        if self.borrowed_gpus > 0:
            return "borrowing"
        return "within its guarantee" if self.held_gpus > 0 else "holds nothing"


@dataclass(frozen=True)
class Loan:
    borrower: str
    lender: str  # a team slug, or UNGUARANTEED
    gpus: float


@dataclass
class Fairness:
    capacity_gpus: int
    guaranteed_gpus: float
    unguaranteed_gpus: float
    borrowed_gpus: float
    orgs: list[TeamFairness]  # top-level rows (an organisation with children, or a team of its own)
    loans: list[Loan]
    scale_gpus: float  # what a full bar is: the cluster's GPUs (or the most any row holds)

    @property
    def teams(self) -> list[TeamFairness]:
        """The teams that run work (leaves), for lookups."""
        return [t for org in self.orgs for t in (org.children or [org])]


def _sum(children: list[TeamFairness], slug: str, name: str) -> TeamFairness:
    def total(attr: str) -> float:
        return round(sum(getattr(c, attr) or 0.0 for c in children), 3)

    guaranteed = [c.guaranteed_gpus for c in children if c.guaranteed_gpus is not None]
    shares = [c.fair_share_gpus for c in children if c.fair_share_gpus is not None]
    return TeamFairness(
        slug=slug,
        name=name,
        guaranteed_gpus=round(sum(guaranteed), 3) if guaranteed else None,
        held_gpus=total("held_gpus"),
        borrowed_gpus=total("borrowed_gpus"),
        fair_share_gpus=round(sum(shares), 3) if shares else None,
        weight=total("weight"),
        queue_share=0.0,
        running_jobs=int(total("running_jobs")),
        pending_jobs=int(total("pending_jobs")),
        lent_gpus=total("lent_gpus"),
        children=children,
    )


def lending(teams: list[TeamFairness], unguaranteed_gpus: float) -> list[Loan]:
    """Who borrows from whom (the module's docstring has the rule): each borrower's borrowing split between the
    unguaranteed capacity and the teams with unused guarantee, in proportion to it. Sets each team's
    `lent_gpus`."""
    borrowed = sum(t.borrowed_gpus for t in teams)
    if borrowed <= 0:
        return []
    from_pool = min(borrowed, max(0.0, unguaranteed_gpus))
    from_lenders = borrowed - from_pool
    unused = {t.slug: t.unused_gpus for t in teams if t.unused_gpus > 0}
    total_unused = sum(unused.values())
    lent = {slug: from_lenders * u / total_unused for slug, u in unused.items()} if total_unused else {}
    for t in teams:
        t.lent_gpus = round(lent.get(t.slug, 0.0), 3)
    loans = []
    for t in sorted(teams, key=lambda t: -t.borrowed_gpus):
        if t.borrowed_gpus <= 0:
            continue
        part = t.borrowed_gpus / borrowed
        if from_pool > 0:
            loans.append(Loan(t.slug, UNGUARANTEED, round(from_pool * part, 3)))
        for slug, amount in sorted(lent.items(), key=lambda kv: -kv[1]):
            if slug != t.slug and amount * part >= 0.0005:
                loans.append(Loan(t.slug, slug, round(amount * part, 3)))
    return loans


def fairness() -> Fairness:
    """The whole tree, who borrows from whom, and the scale to draw them on."""
    allocations = allocations_by_team()
    quotas = engine_quotas()
    borrowed = borrowed_by_team(allocations=allocations, quotas=quotas)
    shares = fair_shares_gpus()
    standing = queue_shares(allocations=allocations, quotas=quotas)
    teams = list(Team.objects.order_by("slug").values_list("pk", "slug", "display_name", "parent_id"))
    parents = {parent for *_, parent in teams if parent is not None}
    rows: dict[int, TeamFairness] = {}
    for pk, slug, name, _parent in teams:
        if pk in parents:
            continue
        alloc = allocations.get(pk) or TeamAllocation()
        quota = quotas.get(slug)
        rows[pk] = TeamFairness(
            slug=slug,
            name=name,
            guaranteed_gpus=quota.guaranteed_compute_milli / eng.WHOLE_GPU_MILLI
            if quota is not None
            else None,
            held_gpus=round(alloc.compute_milli / eng.WHOLE_GPU_MILLI, 3),
            borrowed_gpus=round(borrowed[pk].gpus, 3),
            fair_share_gpus=round(shares[pk], 3) if pk in shares else None,
            weight=quota.weight if quota is not None else 1.0,
            queue_share=(standing.get(pk) or {}).get("queue_share", 0.0),
            running_jobs=alloc.running_jobs,
            pending_jobs=alloc.pending_jobs,
        )
    capacity = schedulable_gpu_count()
    guaranteed = sum(t.guaranteed_gpus or 0.0 for t in rows.values())
    unguaranteed = max(0.0, capacity - guaranteed)
    loans = lending(list(rows.values()), unguaranteed)
    orgs = []
    for pk, slug, name, parent in teams:
        if parent is not None:
            continue
        if pk in parents:
            children = [rows[c] for c, *_rest, p in teams if p == pk and c in rows]
            orgs.append(_sum(children, slug, name))
        elif pk in rows:
            orgs.append(rows[pk])
    # One scale for every bar: the cluster (or the most any row holds). A guarantee larger than the cluster
    # (an over-committed one) is drawn at the right edge rather than squashing every other bar.
    scale = max([1.0, float(capacity)] + [t.held_gpus for org in orgs for t in [org, *org.children]])
    return Fairness(
        capacity_gpus=capacity,
        guaranteed_gpus=round(guaranteed, 3),
        unguaranteed_gpus=round(unguaranteed, 3),
        borrowed_gpus=round(sum(t.borrowed_gpus for t in rows.values()), 3),
        orgs=orgs,
        loans=loans,
        scale_gpus=scale,
    )


# -- "why is team X ahead of me" --------------------------------------------------------------------------


@dataclass(frozen=True)
class TeamAhead:
    """How one team stands, as the queue ranks by it (`guarantee`, then priority, then `fairshare`)."""

    team: str
    mine: bool  # the asking job's team
    started_since: int  # its jobs that started after the asking job was submitted (still running)
    ahead_in_queue: int  # its pending jobs ahead of the asking job
    guaranteed_gpus: float
    held_gpus: float
    borrowed_gpus: float
    weight: float
    borrowed_per_weight: float

    @property
    def borrowing(self) -> bool:
        return self.borrowed_gpus > 0

    @property
    def tier(self) -> str:
        return "borrowing" if self.borrowing else "within its guarantee"


@dataclass(frozen=True)
class WhyAhead:
    job_within_guarantee: bool  # the asking job would run within its team's guarantee (it ranks first then)
    teams: tuple[TeamAhead, ...]  # the job's own team first


def why_ahead(*, job: Job, snapshot: eng.Snapshot | None = None) -> WhyAhead | None:
    """For a pending job: its team's standing and that of each team whose jobs started since it was submitted or
    wait ahead of it, by the engine's own accounting on the what-if snapshot (`team_usage`, `beyond_guarantee`,
    `borrowed_per_weight`, and the `guarantee` plugin's tier for the job). None when the job is not pending or
    the snapshot does not hold it yet."""
    if job.state != JobState.PENDING:
        return None
    snap = current_snapshot() if snapshot is None else snapshot
    me = next((j for j in snap.pending if j.id == str(job.pk)), None)
    if me is None:
        return None
    snap = replace(snap, quotas=effective_quotas(snap.quotas, snap.nodes))
    ctx = CycleContext(snapshot=snap, profile=cycle_profile(), rng=random.Random(snap.seed))
    usage = team_usage(ctx)
    started: dict[str, int] = {}
    for other in snap.running:
        if other.start_time is not None and other.start_time > me.submit_time:
            started[other.team] = started.get(other.team, 0) + 1
    ahead: dict[str, int] = {}
    if job.queue_position:
        rows = Job.objects.filter(state=JobState.PENDING, queue_position__lt=job.queue_position)
        for slug in rows.values_list("team__slug", flat=True):
            ahead[slug] = ahead.get(slug, 0) + 1
    stated = engine_quotas()
    out = []
    for team in [me.team, *sorted((set(started) | set(ahead)) - {me.team})]:
        quota = snap.quotas.get(team)
        held = usage.get(team, (0, 0))
        out.append(
            TeamAhead(
                team=team,
                mine=team == me.team,
                started_since=started.get(team, 0),
                ahead_in_queue=ahead.get(team, 0),
                guaranteed_gpus=(stated[team].guaranteed_compute_milli if team in stated else 0)
                / eng.WHOLE_GPU_MILLI,
                held_gpus=held[1] / eng.WHOLE_GPU_MILLI,
                borrowed_gpus=beyond_guarantee(quota, held)[1] / eng.WHOLE_GPU_MILLI,
                weight=quota.weight if quota is not None else 1.0,
                borrowed_per_weight=borrowed_per_weight(quota, held) / eng.WHOLE_GPU_MILLI,
            )
        )
    return WhyAhead(job_within_guarantee=me.id in within_guarantee_ids(ctx), teams=tuple(out))
