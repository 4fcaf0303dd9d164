"""Action `preempt`: a blocked job may evict lower-priority work."""

from __future__ import annotations

from scheduling.engine.actions.base import Action
from scheduling.engine.eviction import Victims, evict_for_blocked
from scheduling.engine.session import Holding, Session
from scheduling.engine.types import Job

NAME = "preempt"


class LowerPriority:
    """Victims: running jobs of lower priority than the blocked job (any team)."""

    CODE = "preempted"
    MAX_ATTEMPTS_PARAM = "preempt_max_attempts"

    def victims(self, s: Session, job: Job) -> Victims | None:
        priority, evicted = job.priority, s.evicted

        def lower(held: list[Holding]) -> list[Holding]:
            out = []
            for v in held:
                if v.job.priority >= priority:
                    break  # held is lowest priority first
                if v.job.id not in evicted:
                    out.append(v)
            return out

        return lower

    def scope(self, job: Job) -> str:
        return ""


class Preempt(Action):
    NAME = NAME
    VICTIMS = LowerPriority()

    def prepare(self, session: Session) -> None:
        # A reservation's estimated start counts on lower-priority jobs there going once past the minimum runtime.
        session.preempts = True

    def execute(self, session: Session) -> None:
        evict_for_blocked(session, self.VICTIMS)
