"""Queue times: how long the jobs that started in a window waited from submit to start, from the hourly wait
rollups where the roll has closed an hour and from the jobs' own rows for the rest."""

from __future__ import annotations

import math
import operator
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from functools import reduce
from typing import Any

from django.db.models import (
    Case,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    IntegerField,
    Q,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Cast, Floor, Greatest, Least, Ln

from portal.database import Seconds, plain_rows
from scheduling.history.models import WAIT_BUCKETS, WAIT_RATIO, WaitHour, wait_quantile
from scheduling.history.selectors.windows import Window, bucket_start, bucketed, columns
from scheduling.jobs.models import Job

WAIT_P95_NOTE = "from a histogram of waits, within 10 %"


def _hour_floor(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def waits(
    *,
    since: datetime,
    until: datetime,
    team_ids: Collection[int] | None = None,
    step_s: int | None = None,
) -> dict[str, Any]:
    """Jobs that started in the window: how many, and their wait from submit to start: the mean (exact) and the
    p95 (s; from the histogram of waits, within 10 %), with per-bucket columns (`series`: the mean wait and the
    jobs started each `step_s` seconds) when `step_s` is given. `team_ids`: only these teams' jobs.

    The whole hours the roll has closed come from `WaitHour` (one aggregating query over its rows); the rest (the
    window's partial first hour, and from the newest hour rolled up to now) from the jobs' own rows, a small
    range of the `job_started_at` index."""
    out: dict[str, Any] = {"jobs": 0, "wait_mean_s": None, "wait_p95_s": None}
    if team_ids is not None and not team_ids:
        return out if step_s is None else {**out, "series": _wait_columns({}, since, until, step_s)}
    # Hours before the newest one rolled (each hour rolled has a row) are closed: the roll recomputed them after
    # they ended. (A row dated ahead of the clock is no sign of a roll.)
    newest = (
        WaitHour.objects.filter(hour__lte=datetime.now(UTC))
        .order_by("-hour")
        .values_list("hour", flat=True)
        .first()
    )
    first = _hour_floor(since) + (timedelta(hours=1) if _hour_floor(since) < since else timedelta(0))
    last = min(_hour_floor(until), newest) if newest is not None else first
    counts: dict[int, int] = {}
    per_step: dict[int, list[float]] = {}  # bucket start (Unix s) -> [jobs, summed wait]
    total = [0, 0.0]

    def add(bucket: int, b: int | None, n: int, wait_s: float) -> None:
        if not n:  # an hour's mark that it was rolled
            return
        counts[bucket] = counts.get(bucket, 0) + n
        total[0] += n
        total[1] += wait_s
        if b is not None:
            entry = per_step.setdefault(b, [0, 0.0])
            entry[0] += n
            entry[1] += wait_s

    if last > first:
        hours = WaitHour.objects.filter(hour__gte=first, hour__lt=last)
        if team_ids is not None:
            hours = hours.filter(team_id__in=list(team_ids))
        if step_s is None:
            for bucket, n, wait_s in plain_rows(
                hours.values("bucket")
                .annotate(n=Sum("jobs"), wait_s=Sum("wait_s_sum"))
                .values_list("bucket", "n", "wait_s")
                .order_by()
            ):
                add(int(bucket), None, int(n), float(wait_s))
        else:
            for b, bucket, n, wait_s in plain_rows(
                bucketed(hours, at="hour", step_s=step_s)
                .values("time_bucket", "bucket")
                .annotate(b=bucket_start(), n=Sum("jobs"), wait_s=Sum("wait_s_sum"))
                .values_list("b", "bucket", "n", "wait_s")
                .order_by()
            ):
                add(int(bucket), int(b), int(n), float(wait_s))
        ranges = [(since, first), (last, until)]
    else:
        ranges = [(since, until)]
    for b, bucket, n, wait_s in _job_waits(ranges=ranges, team_ids=team_ids, step_s=step_s):
        add(bucket, b, n, wait_s)
    if total[0]:
        out = {
            "jobs": total[0],
            "wait_mean_s": round(total[1] / total[0], 1),
            "wait_p95_s": round(wait_quantile(counts, 0.95), 1),
        }
    if step_s is not None:
        out["series"] = _wait_columns(per_step, since, until, step_s)
    return out


def _job_waits(
    *, ranges: list[tuple[datetime, datetime]], team_ids: Collection[int] | None, step_s: int | None
) -> list[tuple[int | None, int, int, float]]:
    """(bucket start or None, wait bucket, jobs, summed wait) of the jobs started in the ranges, from their own
    rows (the `job_started_at` index), aggregated in the database."""
    ranges = [(start, end) for start, end in ranges if start < end]
    if not ranges:
        return []
    jobs = Job.objects.filter(
        reduce(operator.or_, (Q(started_at__gte=start, started_at__lt=end) for start, end in ranges))
    )
    if team_ids is not None:
        jobs = jobs.filter(team_id__in=list(team_ids))
    waited = ExpressionWrapper(F("started_at") - F("submitted_at"), output_field=DurationField())
    jobs = jobs.alias(w=Greatest(Value(0.0), Seconds(waited)))
    # wait_bucket in SQL: 0 under a second, else floor(log_ratio(wait)) + 1, the last bucket past 30 days.
    jobs = jobs.annotate(
        wait_bucket=Case(
            When(w__lt=1, then=Value(0)),
            default=Least(
                Value(WAIT_BUCKETS - 1),
                Cast(Floor(Ln("w") / Value(math.log(WAIT_RATIO))), IntegerField()) + 1,
            ),
            output_field=IntegerField(),
        )
    )
    if step_s is None:
        rows = plain_rows(
            jobs.values("wait_bucket")
            .annotate(n=Count("id"), wait_s=Sum("w"))
            .values_list("wait_bucket", "n", "wait_s")
            .order_by()
        )
        return [(None, int(bucket), int(n), float(wait_s)) for bucket, n, wait_s in rows]
    rows = plain_rows(
        bucketed(jobs, at="started_at", step_s=step_s)
        .values("time_bucket", "wait_bucket")
        .annotate(b=bucket_start(), n=Count("id"), wait_s=Sum("w"))
        .values_list("b", "wait_bucket", "n", "wait_s")
        .order_by()
    )
    return [(int(b), int(bucket), int(n), float(wait_s)) for b, bucket, n, wait_s in rows]


def _wait_columns(per_step: dict[int, list[float]], since: datetime, until: datetime, step_s: int) -> dict:
    rows = [(b, wait_s / n if n else None, n) for b, (n, wait_s) in per_step.items()]
    return columns(rows, ("wait_mean_s", "started_jobs"), w=Window("", since, until, step_s))


def wait_stats(
    *, since: datetime, until: datetime, team_ids: Collection[int] | None = None
) -> dict[str, Any]:
    """Jobs that started in the window: how many, their mean wait from submit to start (exact) and its p95 (s,
    from the histogram of waits, within 10 %)."""
    return waits(since=since, until=until, team_ids=team_ids)


def wait_series(*, w: Window, step_s: int = 86400) -> dict[str, Any]:
    """The cluster's jobs started in the window: count, mean and p95 wait (s), and the mean wait and the jobs
    started in each bucket (`series`, a day by default)."""
    return waits(since=w.since, until=w.until, step_s=step_s)
