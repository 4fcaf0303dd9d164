"""Action `admit`: each admit plugin may refuse a job before allocation; the first refusal is its status."""

from __future__ import annotations

from scheduling.engine.actions.base import Action
from scheduling.engine.session import Session

NAME = "admit"


class Admit(Action):
    NAME = NAME

    def execute(self, session: Session) -> None:
        ctx, status, plugins = session.ctx, session.status, session.plugins.admit
        for job in session.queue:
            for plugin in plugins:
                refused = plugin.admit(ctx, job)
                if refused is not None:
                    status[job.id] = refused
                    break
