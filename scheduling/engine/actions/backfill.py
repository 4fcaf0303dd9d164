"""Action `backfill`: reservations for the first blocked jobs, and backfill into them.

Both happen inside allocation, at each blocked job's turn (a reservation must bind the jobs after it in the
queue), so this action only tells the session that allocation reserves; it has nothing left to run afterwards.
"""

from __future__ import annotations

from scheduling.engine.actions.base import Action
from scheduling.engine.session import Session

NAME = "backfill"


class Backfill(Action):
    NAME = NAME

    def prepare(self, session: Session) -> None:
        session.reserves = True

    def execute(self, session: Session) -> None:
        """Nothing: allocate reserved and backfilled as it went."""
