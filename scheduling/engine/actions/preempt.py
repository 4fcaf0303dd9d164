"""Action `preempt`: within a team, priority decides: a blocked job may evict its own team's lower-priority work.

Across teams only reclaim evicts (actions/reclaim.py), and only borrowed work, for a team below its guarantee:
another team's priority never takes a team's guarantee, and borrowed capacity is shared by weight (fair share),
not by priority, so borrowers do not evict each other back and forth."""

from __future__ import annotations

from scheduling.engine.actions.base import Action
from scheduling.engine.eviction import Victims, evict_for_blocked, work_floor, work_lost
from scheduling.engine.session import Holding, Session
from scheduling.engine.types import Job

NAME = "preempt"


class LowerPriority:
    """Victims: running jobs of the blocked job's team with a lower priority than it."""

    CODE = "preempted"
    MAX_ATTEMPTS_PARAM = "preempt_max_attempts"
    MIN_RUNTIME_PARAM = "min_runtime_s"
    EVICTS_PINNED = False

    def victims(self, s: Session, job: Job) -> Victims | None:
        priority, evicted, team = job.priority, s.evicted, job.team

        def lower(held: list[Holding]) -> list[Holding]:
            out = []
            for v in held:
                if v.job.priority >= priority:
                    break  # held is lowest priority first
                if v.job.id not in evicted and v.job.team == team:
                    out.append(v)
            return out

        return lower

    def allows(self, s: Session, job: Job, victims: list[Job]) -> bool:
        return True  # its own team's work only

    def scope(self, job: Job) -> str:
        return job.team  # whom it may evict depends on its team's standing

    def order(self, s: Session, v: Holding) -> tuple:
        return (v.job.priority, work_lost(s, v.job), v.job.id)

    def cost(self, s: Session, chosen: list[Holding]) -> tuple:
        return (
            max(v.job.priority for v in chosen),
            sum(work_lost(s, v.job) for v in chosen),
            len(chosen),
        )

    def cost_floor(self, s: Session, job: Job, pos: int, eligible: list[Holding]) -> tuple:
        # The highest victim priority is at least the lowest; at that priority the work lost is at least the
        # floor of any set that lets the job fit.
        return (min(v.job.priority for v in eligible), work_floor(s, job, pos, eligible), 1)


class Preempt(Action):
    NAME = NAME
    VICTIMS = LowerPriority()

    def prepare(self, session: Session) -> None:
        # A reservation's estimated start counts on lower-priority jobs there going once past the minimum runtime.
        session.preempts = True

    def execute(self, session: Session) -> None:
        evict_for_blocked(session, self.VICTIMS)
