"""GPU-hours used, and the part of them that sat idle, by team, user and GPU model, from the hourly usage rows."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet, Sum

from portal.database import plain_rows
from quotas.models import Team
from scheduling.history.models import UsageHour
from scheduling.history.selectors.windows import Window, bucket_start, bucketed, columns
from scheduling.inventory.models import GpuModel

USAGE_GROUPS = ("team", "user", "model")
_COLUMN_OF = {"team": "team_id", "user": "user_id", "model": "model_id"}


def _hours(*, since: datetime, until: datetime, team_ids: Collection[int] | None) -> QuerySet:
    """The hourly rows of the hours that start in the window; `team_ids`: only these teams' (None: all)."""
    hours = UsageHour.objects.filter(hour__gte=since, hour__lt=until)
    return hours if team_ids is None else hours.filter(team_id__in=list(team_ids))


def _column(group: str) -> str:
    if group not in USAGE_GROUPS:
        raise ValueError(f"group is one of {', '.join(USAGE_GROUPS)}")
    return _COLUMN_OF[group]


def usage_totals(
    *, since: datetime, until: datetime, group: str, team_ids: Collection[int] | None = None
) -> list[dict[str, Any]]:
    """GPU-hours and idle-allocated GPU-hours by team, user or model from the hourly rows (hours that start in
    the window), largest first. `team_ids`: only these teams (None: all)."""
    column = _column(group)
    if team_ids is not None and not team_ids:
        return []
    rows = (
        _hours(since=since, until=until, team_ids=team_ids)
        .values(column)
        .annotate(hours=Sum("gpu_seconds") / 3600, idle=Sum("idle_gpu_seconds") / 3600)
        .values_list(column, "hours", "idle")
        .order_by("-hours")
    )
    rows = list(rows)
    ids = [r[0] for r in rows]
    if group == "team":
        names = dict(Team.objects.filter(pk__in=ids).values_list("pk", "slug"))
    elif group == "user":
        names = dict(get_user_model().objects.filter(pk__in=ids).values_list("pk", "username"))
    else:
        names = dict(GpuModel.objects.filter(pk__in=ids).values_list("pk", "name"))
    return [
        {
            group: names.get(key, "(unknown)" if key else "(model not known)"),
            "gpu_hours": round(float(hours or 0), 3),
            "idle_gpu_hours": round(float(idle or 0), 3),
        }
        for key, hours, idle in rows
    ]


def usage_series(
    *, w: Window, step_s: int = 86400, team_ids: Collection[int] | None = None
) -> dict[str, list]:
    """GPU-hours per bucket (a day by default) over the window, with the idle-allocated part."""
    rows = plain_rows(
        bucketed(_hours(since=w.since, until=w.until, team_ids=team_ids), at="hour", step_s=step_s)
        .values("time_bucket")
        .annotate(b=bucket_start(), hours=Sum("gpu_seconds") / 3600, idle=Sum("idle_gpu_seconds") / 3600)
        .values_list("b", "hours", "idle")
        .order_by()
    )
    return columns(rows, ("gpu_hours", "idle_gpu_hours"), w=Window(w.name, w.since, w.until, step_s))


def usage_by_team_user_model(*, since: datetime, until: datetime) -> list[tuple[int, int, int, float, float]]:
    """(team id, user id, model id, GPU-hours, idle-allocated GPU-hours) for the hours that start in the window:
    one scan of the hourly rows that the history page sums by team, user and model (a row per person and card
    model they used, not per hour)."""
    rows = plain_rows(
        _hours(since=since, until=until, team_ids=None)
        .values("team_id", "user_id", "model_id")
        .annotate(hours=Sum("gpu_seconds") / 3600, idle=Sum("idle_gpu_seconds") / 3600)
        .values_list("team_id", "user_id", "model_id", "hours", "idle")
        .order_by()
    )
    return [(t, u, m, float(h or 0), float(i or 0)) for t, u, m, h, i in rows]


def usage_daily(
    *, w: Window, group: str, team_ids: Collection[int] | None = None, step_s: int = 86400
) -> dict[int, dict[int, float]]:
    """GPU-hours per bucket (a day by default) for each team, user or model id: id -> bucket (Unix s) -> hours.
    One query; the page names the ids and stacks them. `team_ids`: only these teams' rows (None: all)."""
    column = _column(group)
    if team_ids is not None and not team_ids:
        return {}
    rows = plain_rows(
        bucketed(_hours(since=w.since, until=w.until, team_ids=team_ids), at="hour", step_s=step_s)
        .values(column, "time_bucket")
        .annotate(b=bucket_start(), hours=Sum("gpu_seconds") / 3600)
        .values_list(column, "b", "hours")
        .order_by()
    )
    out: dict[int, dict[int, float]] = {}
    for key, b, hours in rows:
        out.setdefault(key, {})[int(b)] = round(float(hours or 0), 3)
    return out
