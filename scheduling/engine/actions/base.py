"""What an action is: a step of the cycle a profile names in `actions`, run over the session in that order."""

from __future__ import annotations

from typing import ClassVar

from scheduling.engine.session import Session


class Action:
    """One step of the cycle. `prepare` runs for every action of the profile before any `execute`, so an action
    can tell the session what it enables for the others (allocate's reservations come from backfill)."""

    NAME: ClassVar[str]

    def prepare(self, session: Session) -> None:
        """Say what this action enables, before any action runs (nothing, unless it overrides this)."""

    def execute(self, session: Session) -> None:
        raise NotImplementedError
