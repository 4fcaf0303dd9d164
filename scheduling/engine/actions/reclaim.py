"""Action `reclaim`: a blocked job whose team stays within its (all-models) guarantee may evict other teams'
borrowed work, whatever its priority."""

from __future__ import annotations

from scheduling.engine.accounting import min_charge, team_usage, within_guarantee
from scheduling.engine.actions.base import Action
from scheduling.engine.eviction import Victims, evict_for_blocked
from scheduling.engine.session import Holding, Session
from scheduling.engine.types import Job

NAME = "reclaim"


class OtherTeamsBorrowed:
    """Victims: other teams' borrowed work, for a job whose team stays within its guarantee with it."""

    CODE = "reclaimed"
    MAX_ATTEMPTS_PARAM = "reclaim_max_attempts"

    def victims(self, s: Session, job: Job) -> Victims | None:
        quota = s.snap.quotas.get(job.team)
        if quota is None:
            return None
        used = team_usage(s.ctx).get(job.team, (0, 0))
        if not within_guarantee(quota, used, min_charge(job.request)):
            return None
        team, evicted = job.team, s.evicted

        def borrowed(held: list[Holding]) -> list[Holding]:
            return [v for v in held if v.job.borrowed and v.job.team != team and v.job.id not in evicted]

        return borrowed

    def scope(self, job: Job) -> str:
        return job.team  # the guarantee is the team's: another team's failed try says nothing


class Reclaim(Action):
    NAME = NAME
    VICTIMS = OtherTeamsBorrowed()

    def execute(self, session: Session) -> None:
        evict_for_blocked(session, self.VICTIMS)
