"""Action `allocate`: in queue order, place each admitted job on its best node(s) and cards.

A job that does not fit is blocked (reclaim and preempt may help it). When the profile backfills, the first
blocked jobs also reserve the cards they will get (`reservation.reserve`) and later jobs see those as taken.
"""

from __future__ import annotations

from scheduling.engine.actions.base import Action
from scheduling.engine.moves import hold_returning, make_room_at_turn
from scheduling.engine.placement import effective, try_place
from scheduling.engine.plugins.guarantee import within_guarantee_ids
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
        # Jobs owed their guarantee reserve besides, where the profile serves guarantees first (its queue order).
        ranks_guarantees = "guarantee" in s.profile.queue_order
        max_within = int(s.param("reservations_within_max") or 0) if s.reserves and ranks_guarantees else 0
        min_prio = s.param("reservation_min_priority")
        # The first blocked jobs reserve (each try may walk every running job's end), and the first blocked jobs
        # within their team's guarantee besides; a job that cannot reserve anywhere (it fits on no node even
        # empty) does not use up a reservation, but a try.
        tries_left = 2 * max_res
        made = within_made = 0
        within = within_guarantee_ids(s.ctx) if max_within else frozenset()
        now = s.snap.now
        for job in s.queue:
            if job.id in s.status:
                continue
            if job.ready_at is not None and job.ready_at > now:
                # Being moved: it still stops where it ran; its new place is held until it is ready.
                hold_returning(s, job)
                continue
            if try_place(s, job):
                continue
            if job.id in s.status:  # refused by quota at its exact charge
                continue
            s.blocked.add(job.id)
            eligible = min_prio is None or job.priority >= min_prio
            head = eligible and made < max_res and tries_left > 0
            owed = eligible and job.id in within and within_made < max_within
            if s.moves_left > 0 and (make_room_at_turn(s, job, may_reserve=head) or job.id in s.held_at):
                continue  # placed by moving work, or its room is held for reclaim or preemption to free
            if not (head or owed):
                if job.reserved_on:
                    s.reservation_notes[job.id] = (
                        f"its reservation on {', '.join(sorted(job.reserved_on))} was dropped: jobs ahead of it "
                        "in the queue hold the reservations now"
                    )
                continue
            if head:
                tries_left -= 1
            view = effective(s, job)
            if isinstance(view, Status):
                continue
            before = len(s.reservations)
            reserve(s, view)
            if len(s.reservations) > before:
                if head:
                    made += 1
                else:
                    within_made += 1
