"""Action `share`: capacity beyond the guarantees is shared by weight (weighted max-min), also once it is lent.

Fair share orders the queue so that idle capacity goes first to the team that borrows least per weight, but what
was lent while a team was quiet stays with its borrower. Here a blocked job whose team would borrow with it takes
borrowed work from teams that borrow more per weight, as long as, once it runs, its team still borrows no more
per weight than each of them does without its victims: a move only ever narrows the gap, so borrowers never
evict each other back and forth. Only work beyond the victims' guarantees is taken (`keeps_guarantee`), never
never-preempted work, never work younger than the minimum runtime. The evictions' code is "reclaimed".
"""

from __future__ import annotations

from scheduling.engine.accounting import (
    borrowed_per_weight,
    job_charge,
    keeps_guarantee,
    running_charges,
    team_usage,
    within_guarantee,
)
from scheduling.engine.actions.base import Action
from scheduling.engine.eviction import (
    Victims,
    evict_for_blocked,
    work_lost,
    work_then_count,
    work_then_count_floor,
)
from scheduling.engine.session import Holding, Session
from scheduling.engine.types import Job

NAME = "share"


def _after(s: Session, job: Job) -> float:
    """What the job's team would borrow per weight once the job runs."""
    used, charge = team_usage(s.ctx).get(job.team, (0, 0)), job_charge(s.ctx, job)
    return borrowed_per_weight(s.snap.quotas.get(job.team), (used[0] + charge[0], used[1] + charge[1]))


class BorrowingMore:
    """Victims: other teams' work beyond their guarantees, from teams borrowing more per weight than the blocked
    job's team would with it."""

    CODE = "reclaimed"
    MAX_ATTEMPTS_PARAM = "share_max_attempts"
    MIN_RUNTIME_PARAM = "share_min_runtime_s"
    EVICTS_PINNED = False

    def victims(self, s: Session, job: Job) -> Victims | None:
        ctx, quotas = s.ctx, s.snap.quotas
        usage = team_usage(ctx)
        if within_guarantee(quotas.get(job.team), usage.get(job.team, (0, 0)), job_charge(ctx, job)):
            return None  # within its guarantee: reclaim's business
        mine_after, team, evicted, charges = _after(s, job), job.team, s.evicted, running_charges(ctx)

        def taken(held: list[Holding]) -> list[Holding]:
            out = []
            for v in held:
                other = v.job.team
                if other == team or v.job.id in evicted:
                    continue
                theirs, quota = usage.get(other, (0, 0)), quotas.get(other)
                if borrowed_per_weight(quota, theirs) > mine_after and keeps_guarantee(
                    quota, theirs, charges.get(v.job.id, (0, 0))
                ):
                    out.append(v)
            return out

        return taken

    def allows(self, s: Session, job: Job, victims: list[Job]) -> bool:
        ctx, quotas = s.ctx, s.snap.quotas
        usage, charges = team_usage(ctx), running_charges(ctx)
        removed: dict[str, list[int]] = {}
        for v in victims:
            row = removed.setdefault(v.team, [0, 0])
            mem, comp = charges.get(v.id, (0, 0))
            row[0] += mem
            row[1] += comp
        mine_after = _after(s, job)
        for other, row in removed.items():
            theirs, quota = usage.get(other, (0, 0)), quotas.get(other)
            if not keeps_guarantee(quota, theirs, row):
                return False
            if borrowed_per_weight(quota, (theirs[0] - row[0], theirs[1] - row[1])) < mine_after:
                return False
        return True

    def scope(self, job: Job) -> str:
        return job.team

    def order(self, s: Session, v: Holding) -> tuple:
        quota = s.snap.quotas.get(v.job.team)
        over = borrowed_per_weight(quota, team_usage(s.ctx).get(v.job.team, (0, 0)))
        return (-over, work_lost(s, v.job), v.job.priority, v.job.id)

    def cost(self, s: Session, chosen: list[Holding]) -> tuple:
        return work_then_count(s, chosen)

    def cost_floor(self, s: Session, job: Job, pos: int, eligible: list[Holding]) -> tuple:
        return work_then_count_floor(s, job, pos, eligible)


class Share(Action):
    NAME = NAME
    VICTIMS = BorrowingMore()

    def execute(self, session: Session) -> None:
        evict_for_blocked(session, self.VICTIMS)
