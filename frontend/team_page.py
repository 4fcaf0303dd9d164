"""A team's page (/teams/<slug>/): its quota and what it holds, borrows and lends now and over time, the seed's
figures for it, its members' GPU-hours and a chargeback table with CSV export.

What a team holds and borrows are aggregates every signed-in user may see (as /api/v1/cluster/ shows them); its
members, their hours and the chargeback are for its members and staff only.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, time, timedelta

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from frontend.history import TIME_AXIS, chart
from quotas.models import Membership, Team
from quotas.selectors import team_by_slug, team_ids_for_user
from quotas.services import quota_may_edit
from scheduling.cycle.fairness import fairness
from scheduling.cycle.selectors import team_standings
from scheduling.history.selectors.teams import (
    preemptions_suffered,
    priority_inversions,
    quota_satisfaction,
    team_series,
)
from scheduling.history.selectors.usage import usage_totals
from scheduling.history.selectors.waits import wait_stats
from scheduling.history.selectors.windows import window
from scheduling.jobs.chargeback import MAX_WINDOW, usage_rows
from scheduling.jobs.models import Job

TEAM_WINDOWS = ("24h", "7d", "30d")
CHARGEBACK_GROUPS = ("team", "user", "model")
CHARGEBACK_COLUMNS = (*CHARGEBACK_GROUPS, "gpu_hours", "gpu_memory_gib_hours", "jobs")
DEFAULT_CHARGEBACK_DAYS = 30


def _team_or_404(slug: str) -> Team:
    team = team_by_slug(slug=slug)
    if team is None:
        raise Http404(f"No team {slug}.")
    return team


def _may_see_people(user, team: Team) -> bool:
    return user.is_staff or team.pk in team_ids_for_user(user=user)


def _date_param(request: HttpRequest, name: str, default: date) -> tuple[date, str | None]:
    raw = (request.GET.get(name) or "").strip()
    if not raw:
        return default, None
    try:
        return date.fromisoformat(raw), None
    except ValueError:
        return default, f"{name} must be a date such as 2026-11-01 (got {raw[:30]!r})."


def chargeback_range(request: HttpRequest) -> tuple[date, date, list[str]]:
    """The chargeback's first and last day (UTC, both included) from ?since= and ?until=, with errors to show
    (a bad value falls back to the default and says so; nothing is silently clamped)."""
    today = timezone.now().astimezone(UTC).date()
    until, e1 = _date_param(request, "until", today)
    since, e2 = _date_param(request, "since", until - timedelta(days=DEFAULT_CHARGEBACK_DAYS - 1))
    errors = [e for e in (e1, e2) if e]
    if since > until:
        errors.append("since must be on or before until.")
        since = until - timedelta(days=DEFAULT_CHARGEBACK_DAYS - 1)
    if (until - since) + timedelta(days=1) > MAX_WINDOW:
        errors.append(f"The range may span at most {MAX_WINDOW.days} days.")
        since = until - timedelta(days=DEFAULT_CHARGEBACK_DAYS - 1)
    return since, until, errors


def chargeback_rows(*, team: Team, since: date, until: date) -> list[dict]:
    """GPU-hours by team, user and GPU model over the days, as /api/v1/usage/?group_by=team,user,model counts
    them (the same function)."""
    start = datetime.combine(since, time.min, tzinfo=UTC)
    end = min(datetime.combine(until + timedelta(days=1), time.min, tzinfo=UTC), timezone.now())
    if end <= start:
        return []
    return usage_rows(jobs=Job.objects.filter(team=team), since=start, until=end, group_by=CHARGEBACK_GROUPS)


def member_hours(*, team: Team, since: datetime, until: datetime) -> list[dict]:
    """Each member's GPU-hours in the team over the window, as the chargeback and /api/v1/usage/ count them (the
    same function over the jobs' records), and the idle-allocated part the recorder sampled each minute."""
    used = {
        r["user"]: r["gpu_hours"]
        for r in usage_rows(jobs=Job.objects.filter(team=team), since=since, until=until, group_by=("user",))
    }
    idle = {
        r["user"]: r["idle_gpu_hours"]
        for r in usage_totals(since=since, until=until, group="user", team_ids=[team.pk])
    }
    members = Membership.objects.filter(team=team).select_related("user").order_by("user__username")
    return [
        {
            "membership": m,
            "hours": {
                "gpu_hours": used.get(m.user.username, 0.0),
                "idle_gpu_hours": min(idle.get(m.user.username, 0.0), used.get(m.user.username, 0.0)),
            },
        }
        for m in members
    ]


def _now(team: Team) -> dict:
    t = team_standings()[team.pk]
    quotas = list(team.quotas.select_related("gpu_model", "default_priority_class"))
    loans = [loan for loan in fairness().loans if loan.lender == team.slug]
    return {
        "quotas": quotas,
        "guaranteed_gpus": t.guaranteed_gpus,
        "limit_gpus": t.limit_gpus,
        "held_gpus": round(t.held_gpus, 3),
        "borrowed_gpus": round(t.borrowed_gpus, 3),
        "unused_guarantee_gpus": round(max(0.0, t.guaranteed_gpus - t.held_gpus), 3),
        "lent_gpus": round(sum(loan.gpus for loan in loans), 3),
        "lent_to": sorted({loan.borrower for loan in loans}),
        "fair_share_gpus": t.fair_share_gpus,
        "running_jobs": t.running_jobs,
        "pending_jobs": t.pending_jobs,
    }


@login_required
def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    team = _team_or_404(slug)
    if request.GET.get("part") == "now":
        return render(request, "frontend/teams/_now.html", {"team": team, "now": _now(team)})
    w = window(request.GET.get("window", ""), default="7d")
    if w.name not in TEAM_WINDOWS:
        w = window("7d")
    people = _may_see_people(request.user, team)
    series = team_series(team_id=team.pk, w=w)
    context = {
        "nav": "teams",
        "team": team,
        "children": list(team.children.order_by("slug")),
        "now": _now(team),
        "window": w,
        "windows": TEAM_WINDOWS,
        "chart": chart(
            title=f"GPUs over the last {w.name}",
            t=series["t"],
            series=[
                {"label": label, "values": series[key], "dash": key in ("guaranteed_gpus", "limit_gpus")}
                for key, label in (
                    ("held_gpus", "held"),
                    ("guaranteed_gpus", "guaranteed"),
                    ("limit_gpus", "limit"),
                    ("borrowed_gpus", "borrowed beyond the guarantee"),
                    ("pending_gpus", "asked for by pending jobs"),
                )
            ],
            y_label="GPUs",
            unit="GPUs",
            kind="line",
            x_label=TIME_AXIS,
        ),
        "figures": {
            "quota_satisfaction": quota_satisfaction(team_id=team.pk, since=w.since, until=w.until),
            **wait_stats(since=w.since, until=w.until, team_ids=[team.pk]),
            "priority_inversions": priority_inversions(team_id=team.pk, since=w.since, until=w.until),
            "preemptions_suffered": preemptions_suffered(team_id=team.pk, since=w.since, until=w.until),
        },
        "may_see_people": people,
        "may_edit_quota": quota_may_edit(actor=request.user, team=team),
    }
    if people:
        context["members"] = member_hours(team=team, since=w.since, until=w.until)
        since, until, errors = chargeback_range(request)
        context.update(
            chargeback=chargeback_rows(team=team, since=since, until=until),
            chargeback_since=since,
            chargeback_until=until,
            chargeback_errors=errors,
        )
    return render(request, "frontend/teams/detail.html", context)


@login_required
def team_chargeback_csv(request: HttpRequest, slug: str) -> HttpResponse:
    team = _team_or_404(slug)
    if not _may_see_people(request.user, team):
        # The team's page is everyone's; its chargeback names its people, as the usage API keeps them to it.
        raise PermissionDenied(
            f"the chargeback of {team.slug} names its people: only its members and the site's admins may "
            "download it"
        )
    since, until, errors = chargeback_range(request)
    if errors:
        return HttpResponse(" ".join(errors), status=400, content_type="text/plain; charset=utf-8")
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CHARGEBACK_COLUMNS, lineterminator="\r\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(chargeback_rows(team=team, since=since, until=until))
    name = f"tessera-chargeback-{team.slug.replace('/', '-')}-{since}-{until}.csv"
    return HttpResponse(
        out.getvalue(),
        content_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )
