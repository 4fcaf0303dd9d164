"""Action `reclaim`: a blocked job whose team stays within its guarantee with it takes back capacity other
teams borrow, whatever the priorities.

Only borrowed work is taken: the victims' team must still hold at least its guarantee without them
(`accounting.keeps_guarantee`, for all the victims of one team together), so reclaim never takes a team below
its guarantee to serve another. A team's running jobs fill its guarantee in guarantee order (never-preempted
work first, then higher priority, then the longest running) and what is left over is labelled borrowed
(`accounting.running_borrowed`): those go first, but where only another of the team's jobs frees the right
cards (a whole node for an 8-GPU job) that one may go instead, as long as the team keeps its guarantee; the
labels then settle again. Never-preempted work is taken only when labelled borrowed (its owner is told at
placement). The minimum runtime does not protect borrowed work (`reclaim_min_runtime_s`, 0 by default): the
guarantee comes back within the victims' grace. Victims come first from the team that borrows the most per
weight, then labelled borrowed work, then those that lose the least work since their last checkpoint.
"""

from __future__ import annotations

from scheduling.engine.accounting import (
    borrowed_per_weight,
    has_guarantee,
    job_charge,
    keeps_guarantee,
    others_keep_guarantees,
    running_borrowed,
    running_charges,
    team_usage,
    within_guarantee,
)
from scheduling.engine.actions.base import Action
from scheduling.engine.eviction import Victims, evict_for_blocked, work_lost_s
from scheduling.engine.session import Holding, Session
from scheduling.engine.types import Job

NAME = "reclaim"


class OtherTeamsBorrowed:
    """Victims: other teams' borrowed work, for a job whose team stays within its guarantee with it."""

    CODE = "reclaimed"
    MAX_ATTEMPTS_PARAM = "reclaim_max_attempts"
    MIN_RUNTIME_PARAM = "reclaim_min_runtime_s"
    EVICTS_PINNED = True

    def victims(self, s: Session, job: Job) -> Victims | None:
        ctx, quotas = s.ctx, s.snap.quotas
        quota = quotas.get(job.team)
        if not has_guarantee(quota):
            return None
        usage = team_usage(ctx)
        if not within_guarantee(quota, usage.get(job.team, (0, 0)), job_charge(ctx, job)):
            return None
        team, evicted, borrowed, charges = job.team, s.evicted, running_borrowed(ctx), running_charges(ctx)

        def taken(held: list[Holding]) -> list[Holding]:
            return [
                v
                for v in held
                if v.job.team != team
                and v.job.id not in evicted
                and (v.job.preemptible or v.job.id in borrowed)
                and keeps_guarantee(
                    quotas.get(v.job.team), usage.get(v.job.team, (0, 0)), charges.get(v.job.id, (0, 0))
                )
            ]

        return taken

    def allows(self, s: Session, job: Job, victims: list[Job]) -> bool:
        return others_keep_guarantees(s.ctx, job.team, victims)

    def scope(self, job: Job) -> str:
        return job.team  # the guarantee is the team's: another team's failed try says nothing

    def order(self, s: Session, v: Holding) -> tuple:
        quota = s.snap.quotas.get(v.job.team)
        over = borrowed_per_weight(quota, team_usage(s.ctx).get(v.job.team, (0, 0)))
        labelled = v.job.id in running_borrowed(s.ctx)
        return (-over, not labelled, work_lost_s(s.snap.now, v.job), v.job.priority, v.job.id)

    def cost(self, s: Session, chosen: list[Holding]) -> tuple:
        now = s.snap.now
        return (sum(work_lost_s(now, v.job) for v in chosen), len(chosen))


class Reclaim(Action):
    NAME = NAME
    VICTIMS = OtherTeamsBorrowed()

    def execute(self, session: Session) -> None:
        evict_for_blocked(session, self.VICTIMS)
