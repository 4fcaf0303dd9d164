"""The cycle's actions, one module each; `ACTIONS` maps the names a profile's `actions` lists to their classes.

A cycle runs the profile's actions in the order it lists them (docs/engine.md, "Adding an action").
"""

from __future__ import annotations

from scheduling.engine.actions.admit import Admit
from scheduling.engine.actions.allocate import Allocate
from scheduling.engine.actions.backfill import Backfill
from scheduling.engine.actions.base import Action
from scheduling.engine.actions.consolidate import Consolidate
from scheduling.engine.actions.preempt import Preempt
from scheduling.engine.actions.reclaim import Reclaim
from scheduling.engine.actions.share import Share

ACTIONS: dict[str, type[Action]] = {
    cls.NAME: cls for cls in (Admit, Allocate, Backfill, Consolidate, Reclaim, Share, Preempt)
}


def get_action(name: str) -> Action:
    """A fresh instance of the action registered under `name`."""
    try:
        return ACTIONS[name]()
    except KeyError:
        raise KeyError(f"unknown action {name!r}; known: {', '.join(ACTIONS)}") from None


__all__ = ["ACTIONS", "Action", "get_action"]
