"""How long placed jobs waited in the queue, for `kueue_admission_wait_time_seconds` (observed by the cycle)."""

from __future__ import annotations

from django.db.models import F, OuterRef, Subquery
from django.db.models.functions import Coalesce

from scheduling.choices import JobState
from scheduling.jobs.models import Job, JobEvent


def admission_waits(*, job_ids: list[int]) -> list[tuple[str, str, float]]:
    """(team slug, priority class, seconds from the job's last entry into the queue to its placement) of these
    placed jobs, in one query. The last entry into the queue is its newest event into pending before the
    placement: its submit, or its latest requeue (node lost, preempted, moved). `submitted_at` is kept across
    requeues for the queue's order, so counting from it would add the time a requeued job ran, every time."""
    queued_at = Subquery(
        JobEvent.objects.filter(job=OuterRef("pk"), to_state=JobState.PENDING, at__lte=OuterRef("placed_at"))
        .order_by("-at", "-id")
        .values("at")[:1]
    )
    rows = (
        Job.objects.filter(pk__in=job_ids, placed_at__isnull=False)
        .annotate(queued_at=Coalesce(queued_at, F("submitted_at")))
        .values_list("team__slug", "priority_class__name", "queued_at", "placed_at")
    )
    return [(slug, pc, max(0.0, (placed - queued).total_seconds())) for slug, pc, queued, placed in rows]
