"""One scheduling cycle: `run_cycle(snapshot, profile) -> Decisions`.

A session over an immutable snapshot (`session.py`) runs the profile's actions (`actions/`) in the order the
profile lists them, then every job left pending gets its reason (`pending.py`). docs/engine.md walks through it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace

from scheduling.engine.accounting import effective_quotas, standing
from scheduling.engine.actions import get_action
from scheduling.engine.collector import collector_paused
from scheduling.engine.framework import Profile
from scheduling.engine.pending import explain_pending
from scheduling.engine.profiles import check_profile
from scheduling.engine.session import Session
from scheduling.engine.state import EngineState, load_plugins
from scheduling.engine.types import Decisions, Job, Snapshot

_STATE_SLOTS = 16
_STATES: OrderedDict[int, EngineState] = OrderedDict()
_STATES_LOCK = threading.Lock()


def _state_for(profile: Profile) -> EngineState:
    """The profile's engine state: checked, plugins and actions loaded once, kept for the same Profile object."""
    with _STATES_LOCK:
        state = _STATES.get(id(profile))
        if state is not None and state.profile is profile:
            _STATES.move_to_end(id(profile))
            return state
        check_profile(profile)
        state = _STATES[id(profile)] = EngineState(
            profile=profile,
            plugins=load_plugins(profile),
            actions=[get_action(name) for name in profile.actions],
        )
        while len(_STATES) > _STATE_SLOTS:
            _STATES.popitem(last=False)
        return state


def _queue(session: Session) -> list[Job]:
    """Pending jobs by the profile's queue-order keys, then submit time, then id."""
    jobs = list(session.snap.pending)
    if len(jobs) <= 1:
        return jobs
    plugins, ctx = session.plugins.queue, session.ctx

    def key(job: Job) -> tuple:
        parts: list = []
        for p in plugins:
            parts.extend(p.sort_key(ctx, job))
        parts.append(job.submit_time)
        parts.append(job.id)
        return tuple(parts)

    jobs.sort(key=key)
    return jobs


def run_cycle(snapshot: Snapshot, profile: Profile) -> Decisions:
    """Decide placements, evictions, reservations and pending reasons for one snapshot. Deterministic for the
    same snapshot (and its seed) and profile; caches kept between calls never change the answer, only its cost."""
    state = _state_for(profile)
    quotas = effective_quotas(snapshot.quotas, snapshot.nodes)
    if quotas is not snapshot.quotas:
        snapshot = replace(snapshot, quotas=quotas)
    with state.lock, collector_paused():
        session = Session(state, snapshot)
        try:
            session.queue = _queue(session)
            for action in state.actions:
                action.prepare(session)
            for action in state.actions:
                action.execute(session)
            pending = explain_pending(session)
            borrowed = _borrowed_after(session)
        finally:
            session.close()
        return Decisions(
            placements=tuple(
                p if p.borrowed == (p.job_id in borrowed) else replace(p, borrowed=p.job_id in borrowed)
                for p in session.placements
            ),
            evictions=tuple(session.evictions),
            pending=tuple(pending),
            reservations=tuple(session.reservations),
            borrowed=frozenset(borrowed),
        )


def _borrowed_after(session: Session) -> set[str]:
    """The running and placed jobs on borrowed capacity once the decisions hold: the teams' standing after the
    cycle (`accounting.standing`)."""
    snap, evicted = session.snap, session.evicted
    jobs = [j for j in snap.running if j.id not in evicted]
    if snap.focus:
        # A what-if wants its placements' labels, not the whole cluster's: only the teams that placed are ranked.
        placed_teams = {j.team for j in session.placed_jobs}
        jobs = [j for j in jobs if j.team in placed_teams]
    assignments = {j.id: j.assignments for j in jobs}
    for job, placement in zip(session.placed_jobs, session.placements, strict=True):
        assignments[job.id] = placement.assignments
        # Placed within or beyond the guarantee: the label it was placed with is kept while it can be.
        jobs.append(job if job.borrowed == placement.borrowed else replace(job, borrowed=placement.borrowed))
    return standing(session.ctx, jobs, assignments)
