"""A `Statement`: changes staged for one evicting job (its victims' evictions and its own placement) that commit
or roll back whole, as Volcano's statement does."""

from __future__ import annotations

from scheduling.engine.accounting import model_usage_add, usage_add
from scheduling.engine.session import Session
from scheduling.engine.types import Assignment, Eviction, Job, Node, Placement


class Statement:
    """Staged changes (evictions and the evicting job's placement) that commit or roll back whole."""

    def __init__(self, session: Session):
        self.session = session
        self.saved: dict[int, tuple[Node, Node | None]] = {}
        self.usage: list[tuple[str, int, int, str, int]] = []
        self.model_usage: list[tuple[str, tuple[Assignment, ...], int]] = []
        self.evicted: list[tuple[Job, str]] = []
        self.placement: Placement | None = None
        # Evicted jobs placed again elsewhere (moves): their new places, held for them while they stop.
        self.homes: list[tuple[Job, Placement]] = []

    def touch(self, pos: int) -> None:
        """Save a node position before the first change, so a rollback can put it back."""
        if pos not in self.saved:
            s = self.session
            self.saved[pos] = (s.index.nodes[pos], s.real.get(pos))

    def rollback(self) -> None:
        s = self.session
        for pos, (view, real) in self.saved.items():
            if real is None:
                s.real.pop(pos, None)
            else:
                s.real[pos] = real
            s.index.set(pos, view, consumed_only=False)
        for team, mem, comp, priority_class, priority in self.usage:
            usage_add(s.ctx, team, -mem, -comp, priority_class, priority)
        for team, assignments, sign in self.model_usage:
            model_usage_add(s.ctx, team, assignments, -sign)
        for job, _ in self.evicted:
            s.evicted.discard(job.id)

    def commit(self, preemptor: Job, moves: dict[str, tuple[tuple[str, ...], str]] | None = None) -> None:
        """Record the evictions (a move's with the nodes it restarts on and why) and the evicting job's
        placement."""
        s = self.session
        moves = moves or {}
        for job, code in self.evicted:
            to, why = moves.get(job.id, ((), ""))
            s.evictions.append(Eviction(job.id, preemptor.id, code, job.grace_s, to, why))
        if self.placement is not None:
            s.placements.append(self.placement)
            s.placed_jobs.append(preemptor)
