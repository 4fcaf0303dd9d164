"""Counters read from the jobs' events at scrape time: placements lost, and jobs sent back to the queue.

Why from the events and not an increment where it happens: the watchdog runs in whichever Celery worker took the
task, on any host, while /metrics is answered by web processes that see only their own host's counter files; a
JobEvent is written in the transaction that loses or requeues the job, so counting events counts exactly what
committed, the same in every web process, across restarts.

Counting the whole (never pruned) event table at every scrape would grow with it, so each process remembers the
counts of events older than SETTLED_S, up to the highest id among them, and counts only the newer ids again each
scrape (an index range on the primary key). An event is missed only if the transaction that wrote it stayed open
for longer than SETTLED_S after writing it; the longest a cycle may write is TESSERA_CYCLE_MAX_S (120 s).
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

from django.db.models import Count, Max, Q
from django.utils import timezone

from scheduling.choices import JobState
from scheduling.jobs.models import JobEvent

SETTLED_S = 600.0

# Lost placements (any cause), and returns to the queue of jobs that had been placed (a submit has no from_state).
_COUNTED = Q(to_state=JobState.LOST) | (Q(to_state=JobState.PENDING) & ~Q(from_state=""))


class _Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.settled_upto_id = 0
        self.settled: Counter[tuple[str, str]] = Counter()

    def _counts(self, ids: Q) -> Counter[tuple[str, str]]:
        rows = (
            JobEvent.objects.filter(ids, _COUNTED)
            .values_list("to_state", "code")
            .annotate(n=Count("id"))
            .order_by()
        )
        return Counter({(to_state, code): n for to_state, code, n in rows})

    def read(self) -> Counter[tuple[str, str]]:
        with self.lock:
            settled_before = timezone.now() - timedelta(seconds=SETTLED_S)
            upto = JobEvent.objects.filter(id__gt=self.settled_upto_id, at__lt=settled_before).aggregate(
                m=Max("id")
            )["m"]
            if upto is not None:
                self.settled.update(self._counts(Q(id__gt=self.settled_upto_id, id__lte=upto)))
                self.settled_upto_id = upto
            return self.settled + self._counts(Q(id__gt=self.settled_upto_id))

    def forget(self) -> None:
        with self.lock:
            self.settled_upto_id, self.settled = 0, Counter()


_tally = _Tally()


def job_event_counts() -> Counter[tuple[str, str]]:
    """(to_state, code) -> events so far: to_state `lost` (placements lost) or `pending` (requeues)."""
    return _tally.read()


def job_event_counts_forget() -> None:
    """Drop what this process remembers (tests that empty the database)."""
    _tally.forget()
