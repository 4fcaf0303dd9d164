"""A team over a window: its guarantee, holding and queue (from its minute rows), how well its quota was met, and
what it suffered: priority inversions and preemptions."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Avg, Exists, F, OuterRef, Q, Sum
from django.db.models.functions import Least

from portal.database import plain_rows
from scheduling.choices import JobState
from scheduling.history.models import TeamMinute
from scheduling.history.selectors.windows import MILLI, Window, bucket_start, bucketed, columns
from scheduling.jobs.models import Job, JobEvent

TEAM_MEASURES = (
    "guaranteed_gpus",
    "limit_gpus",
    "held_gpus",
    "borrowed_gpus",
    "pending_gpus",
    "fair_share_gpus",
)


def team_series(*, team_id: int, w: Window) -> dict[str, list]:
    minutes = TeamMinute.objects.filter(team_id=team_id, at__gte=w.since, at__lt=w.until)
    rows = plain_rows(
        bucketed(minutes, at="at", step_s=w.step_s)
        .values("time_bucket")
        .annotate(
            b=bucket_start(),
            guaranteed=Avg("guaranteed_milli") / MILLI,
            limit=Avg("limit_milli") / MILLI,
            held=Avg("held_milli") / MILLI,
            borrowed=Avg("borrowed_milli") / MILLI,
            pending=Avg("pending_milli") / MILLI,
            fair_share=Avg("fair_share_milli") / MILLI,
        )
        .values_list("b", "guaranteed", "limit", "held", "borrowed", "pending", "fair_share")
        .order_by()
    )
    return columns(rows, TEAM_MEASURES, w=w)


def quota_satisfaction(*, team_id: int, since: datetime, until: datetime) -> float | None:
    """The seed's quota satisfaction rate from the minute rows: of what the team was owed within its guarantee
    (the smaller of its guarantee and what it held or asked for), the part it held. None: it was owed nothing."""
    owed = Least("guaranteed_milli", F("held_milli") + F("pending_milli"))
    found = TeamMinute.objects.filter(team_id=team_id, at__gte=since, at__lt=until).aggregate(
        owed=Sum(owed), met=Sum(Least("held_milli", owed))
    )
    owed_milli, met_milli = found["owed"], found["met"]
    return None if not owed_milli else round(float(met_milli) / float(owed_milli), 4)


def priority_inversions(*, team_id: int, since: datetime, until: datetime) -> int:
    """The team's jobs that started in the window while an earlier-submitted job of the team at a higher
    priority was still waiting (jobs with a declared max runtime excepted: they are backfill), as the simulator
    counts them."""
    waiting_ahead = Job.objects.filter(
        Q(started_at__isnull=True) | Q(started_at__gt=OuterRef("started_at")),
        Q(finished_at__isnull=True) | Q(finished_at__gt=OuterRef("started_at")),
        team_id=OuterRef("team_id"),
        priority_class__value__gt=OuterRef("priority_class__value"),
        submitted_at__lt=OuterRef("submitted_at"),
    )
    return Job.objects.filter(
        Exists(waiting_ahead),
        team_id=team_id,
        started_at__gte=since,
        started_at__lt=until,
        max_runtime_s__isnull=True,
    ).count()


def preemptions_suffered(*, team_id: int, since: datetime, until: datetime) -> int:
    return JobEvent.objects.filter(
        job__team_id=team_id, to_state=JobState.PREEMPTED, at__gte=since, at__lt=until
    ).count()
