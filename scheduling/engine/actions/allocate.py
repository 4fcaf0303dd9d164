"""Action `allocate`: in queue order, place each admitted job on its best node(s) and cards.

A job that does not fit is blocked (reclaim and preempt may help it). When the profile backfills, the first
blocked jobs also reserve the cards they will get (`reservation.reserve`) and later jobs see those as taken.
"""

from __future__ import annotations

from scheduling.engine.actions.base import Action
from scheduling.engine.placement import effective, try_place
from scheduling.engine.reservation import reserve
from scheduling.engine.session import Session
from scheduling.engine.types import Status

NAME = "allocate"


class Allocate(Action):
    NAME = NAME

    def prepare(self, session: Session) -> None:
        session.allocates = True

    def execute(self, session: Session) -> None:
        s = session
        max_res = int(s.param("reservations_max") or 0) if s.reserves else 0
        min_prio = s.param("reservation_min_priority")
        # Only the first blocked jobs reserve (each try may walk every running job's end); a job that cannot
        # reserve anywhere (it fits on no node even empty) does not use up a reservation, but a try.
        tries_left = 2 * max_res
        for job in s.queue:
            if job.id in s.status:
                continue
            if try_place(s, job):
                continue
            if job.id in s.status:  # refused by quota at its exact charge
                continue
            s.blocked.add(job.id)
            if (
                len(s.reservations) < max_res
                and tries_left > 0
                and (min_prio is None or job.priority >= min_prio)
            ):
                tries_left -= 1
                view = effective(s, job)
                if not isinstance(view, Status):
                    reserve(s, view)
