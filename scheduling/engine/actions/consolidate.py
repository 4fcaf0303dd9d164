"""Action `consolidate`: a blocked job that needs several cards on a node, within its team's guarantee or a big
job at the head of the queue, frees the node(s) it needs by moving work that can run elsewhere now
(`moves.py`). It happens inside allocation, at the job's turn (the room must not go to the jobs after it first),
so this action only tells the session how many jobs may try; it has nothing left to run afterwards."""

from __future__ import annotations

from scheduling.engine.actions.base import Action
from scheduling.engine.session import Session

NAME = "consolidate"


class Consolidate(Action):
    NAME = NAME

    def prepare(self, session: Session) -> None:
        session.moves_left = int(session.param("move_max_attempts") or 0)

    def execute(self, session: Session) -> None:
        """Nothing: allocate moved work as it went."""
