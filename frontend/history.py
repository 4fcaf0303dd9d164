"""The history and capacity pages: GPU-hours by team, user and GPU model, queue times and queue length over 7 or
30 days (/history/); capacity by GPU model now and over 24 h or 7 days, fragmentation, and a utilisation heatmap
per pool or per node (/capacity/).

Every figure comes from scheduling.history.selectors (one aggregating query each). Tenancy as in the API: team
and model totals are everyone's (as /api/v1/cluster/ shows teams), per-user figures only for the viewer's own
teams (staff: all); the rest of the cluster's users are one row, "other teams".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from quotas.models import Team
from quotas.selectors import team_ids_for_user
from scheduling.choices import JobState
from scheduling.history.selectors.capacity import capacity_now, capacity_series, queue_series
from scheduling.history.selectors.nodes import Pool, node_pools, pool_heatmap
from scheduling.history.selectors.usage import usage_by_team_user_model, usage_daily, usage_series
from scheduling.history.selectors.waits import WAIT_P95_NOTE, wait_series, wait_stats
from scheduling.history.selectors.windows import Window, window
from scheduling.inventory.models import GpuModel, Node
from scheduling.jobs.models import Job
from scheduling.jobs.states import ACTIVE_STATES

HISTORY_WINDOWS = ("7d", "30d")
CAPACITY_WINDOWS = ("24h", "7d")
# Heatmap columns: hours over a day, 3-hour blocks over a week (24 and 56 cells a row), from hourly node rows.
HEATMAP_STEP_S = {"24h": 3600, "7d": 3 * 3600}
# The share of the heatmap's row a tick's label needs to its right ("20:00", "Thu, Dec 3" at 900 px).
HEATMAP_TICK_ROOM = 0.1
HEATMAP_NODES_PER_PAGE = 50
STACK_GROUPS = ("team", "user", "model")
# Time axes are drawn in the browser's timezone (charts.js), and the heatmap's times are put in it too (its
# template's script), so the capacity page says one timezone throughout. Daily bars are UTC days and say so.
TIME_AXIS = "Time (local)"
STACK_MAX_SERIES = 8  # the largest keys get a colour each, the rest are "others"
OTHER_TEAMS = "other teams"
# Utilisation bands of the heatmap, with the legend's words (lower bound, css class, label).
UTIL_BANDS = (
    (90, "u5", "90–100 %"),
    (75, "u4", "75–90 %"),
    (50, "u3", "50–75 %"),
    (25, "u2", "25–50 %"),
    (10, "u1", "10–25 %"),
    (0, "u0", "0–10 %"),
)


def _choice(value: str | None, allowed: tuple[str, ...]) -> str:
    return value if value in allowed else allowed[0]


def chart(
    *, title: str, t: list[int], series: list[dict], y_label: str, unit: str, **options: Any
) -> dict[str, Any]:
    """A chart for static/frontend/charts.js: time in Unix seconds, one list of values per series."""
    return {"title": title, "t": t, "series": series, "y": {"label": y_label, "unit": unit}, **options}


# --- /history/ ------------------------------------------------------------------------------------------------
@login_required
def history_page(request: HttpRequest) -> HttpResponse:
    w = window(_choice(request.GET.get("window"), HISTORY_WINDOWS), default="7d")
    stack = _choice(request.GET.get("by"), STACK_GROUPS)
    user = request.user
    own = None if user.is_staff else team_ids_for_user(user=user)
    breakdown = usage_by_team_user_model(since=w.since, until=w.until)
    teams = _totals_by(breakdown, "team")
    total_hours = sum(r["gpu_hours"] for r in teams)
    users = _totals_by([r for r in breakdown if own is None or r[0] in own], "user")
    if own is not None:
        own_hours = sum(r["gpu_hours"] for r in users)
        others = round(total_hours - own_hours, 3)
        if others > 0.0005:
            users.append(
                {"user": OTHER_TEAMS, "gpu_hours": others, "idle_gpu_hours": None, "aggregate": True}
            )
    # The cluster's count, mean, p95 and daily means: one read of the queue-time rollup (and the jobs' own rows
    # for the partial hours at the window's ends).
    waits = wait_series(w=w)
    context = {
        "nav": "history",
        "w": w,
        "windows": HISTORY_WINDOWS,
        "stack": stack,
        "stacks": STACK_GROUPS,
        "staff": user.is_staff,
        "teams": _with_share(teams, total_hours),
        "users": _with_share(users, total_hours),
        "models": _with_share(_totals_by(breakdown, "model"), total_hours),
        "total_hours": round(total_hours, 1),
        "waits": waits,
        "p95_note": WAIT_P95_NOTE,
        "own_waits": wait_stats(since=w.since, until=w.until, team_ids=own) if own else None,
        "now": _queue_now(),
        "usage_chart": _usage_chart(w=w, group=stack, own=own),
        "wait_chart": _wait_chart(waits["series"]),
        "queue_chart": _queue_chart(w=w),
    }
    if request.GET.get("part") == "now":
        return render(request, "frontend/history/_history_now.html", context)
    return render(request, "frontend/history/history.html", context)


def _totals_by(rows: list[tuple], group: str) -> list[dict]:
    """GPU-hours by team, user or model from the (team, user, model) sums, largest first, named."""
    position = STACK_GROUPS.index(group)
    sums: dict[int, list[float]] = {}
    for row in rows:
        entry = sums.setdefault(row[position], [0.0, 0.0])
        entry[0] += row[3]
        entry[1] += row[4]
    names = _names(group, list(sums))
    unknown = "(model not known)" if group == "model" else "(unknown)"
    return [
        {group: names.get(key, unknown), "gpu_hours": round(h, 3), "idle_gpu_hours": round(i, 3)}
        for key, (h, i) in sorted(sums.items(), key=lambda kv: -kv[1][0])
    ]


def _with_share(rows: list[dict], total: float) -> list[dict]:
    return [{**r, "share_pct": round(100 * r["gpu_hours"] / total, 1) if total else 0.0} for r in rows]


def _queue_now() -> dict[str, int]:
    return {
        "pending": Job.objects.filter(state=JobState.PENDING).count(),
        "running": Job.objects.filter(state__in=ACTIVE_STATES).count(),
    }


def _names(group: str, ids: list[int]) -> dict[int, str]:
    if group == "team":
        return dict(Team.objects.filter(pk__in=ids).values_list("pk", "slug"))
    if group == "user":
        return dict(get_user_model().objects.filter(pk__in=ids).values_list("pk", "username"))
    return dict(GpuModel.objects.filter(pk__in=ids).values_list("pk", "name"))


def _usage_chart(*, w: Window, group: str, own: set[int] | None) -> dict[str, Any]:
    """GPU-hours a day, stacked by team, user or model: the largest get a series each, the rest one "others";
    a member's user stack shows their own teams' users and everyone else as "other teams"."""
    day = 86400
    daily = usage_daily(w=w, group=group, team_ids=own if group == "user" else None)
    first = (int(w.since.timestamp()) // day) * day
    t = list(range(first, int(w.until.timestamp()) + 1, day))
    names = _names(group, list(daily))
    ranked = sorted(daily, key=lambda k: -sum(daily[k].values()))
    series = [
        {"label": names.get(k, "(model not known)" if group == "model" else "(unknown)"), "values": daily[k]}
        for k in ranked[:STACK_MAX_SERIES]
    ]
    rest: dict[int, float] = {}
    for k in ranked[STACK_MAX_SERIES:]:
        for b, v in daily[k].items():
            rest[b] = rest.get(b, 0.0) + v
    if rest:
        series.append({"label": "others", "values": rest})
    if group == "user" and own is not None:
        everyone = usage_series(w=w)
        mine = {b: sum(s["values"].get(b, 0.0) for s in series) for b in t}
        other = {
            b: max(0.0, (v or 0.0) - mine[b])
            for b, v in zip(everyone["t"], everyone["gpu_hours"], strict=True)
        }
        if any(v > 0.0005 for v in other.values()):
            series.append({"label": OTHER_TEAMS, "values": other})
    for s in series:
        s["values"] = [round(s["values"].get(b, 0.0), 2) for b in t]
    return chart(
        title=f"GPU-hours per day, by {group}",
        t=t,
        series=series,
        y_label="GPU-hours per day",
        unit="GPU-h",
        kind="bars",
        stacked=True,
        x_label="Day (UTC)",
        x_days=True,
    )


def _wait_chart(s: dict[str, list]) -> dict[str, Any]:
    minutes = [None if v is None else round(v / 60, 1) for v in s["wait_mean_s"]]
    return chart(
        title="Mean queue time of the jobs started each day",
        t=s["t"],
        series=[{"label": "mean wait", "values": minutes}],
        y_label="Minutes waited",
        unit="min",
        kind="bars",
        x_label="Day (UTC)",
        x_days=True,
    )


def _queue_chart(*, w: Window) -> dict[str, Any]:
    s = queue_series(w=w)
    return chart(
        title="Queue length",
        t=s["t"],
        series=[
            {"label": "pending (mean)", "values": s["pending_jobs"]},
            {"label": "pending (peak)", "values": s["pending_jobs_max"], "dash": True},
            {"label": "running (mean)", "values": s["running_jobs"]},
        ],
        y_label="Jobs",
        unit="jobs",
        x_label=f"{TIME_AXIS}, {w.step_s // 3600} h means",
    )


# --- /capacity/ -----------------------------------------------------------------------------------------------
@login_required
def capacity_page(request: HttpRequest) -> HttpResponse:
    now = capacity_now()
    context: dict[str, Any] = {
        "nav": "capacity",
        "models": now,
        "totals": _totals(now),
    }
    if request.GET.get("part") == "now":
        return render(request, "frontend/history/_capacity_now.html", context)
    name = _choice(request.GET.get("window"), CAPACITY_WINDOWS)
    w = window(name, default=CAPACITY_WINDOWS[0])
    series = capacity_series(w=w)
    pools = node_pools()
    pool_name = request.GET.get("pool", "")
    pool = next((p for p in pools if p.name == pool_name), None)
    context.update(
        {
            "w": w,
            "windows": CAPACITY_WINDOWS,
            "capacity_charts": [
                {**_capacity_chart(s), "json_id": f"chart-capacity-{i}"} for i, s in enumerate(series, 1)
            ],
            "stranded_chart": _stranded_chart(series, w=w),
            "heatmap": _heatmap(pools=pools, pool=pool, w=w, page=request.GET.get("page")),
            "pool": pool,
            "pools": pools,
            "bands": UTIL_BANDS,
        }
    )
    return render(request, "frontend/history/capacity.html", context)


def _totals(models: list[dict]) -> dict[str, Any]:
    used = [m["used_gpus"] for m in models if m["used_gpus"] is not None]
    return {
        "gpus": sum(m["gpus"] for m in models),
        "ready_gpus": sum(m["ready_gpus"] for m in models),
        "allocated_gpus": round(sum(m["allocated_gpus"] for m in models), 1),
        "used_gpus": round(sum(used), 1) if used else None,
        "free_gpus": sum(m["free_gpus"] for m in models),
        "stranded_gpus": round(sum(m["stranded_gpus"] for m in models), 2),
    }


def _capacity_chart(s: dict[str, Any]) -> dict[str, Any]:
    return chart(
        title=s["model"],
        t=s["t"],
        series=[
            {"label": "ready", "values": s["ready_gpus"], "dash": True},
            {"label": "allocated", "values": s["allocated_gpus"]},
            {"label": "used", "values": s["used_gpus"]},
            {"label": "wholly free", "values": s["free_gpus"]},
        ],
        y_label="GPUs",
        unit="GPUs",
        x_label=TIME_AXIS,
    )


def _stranded_chart(series: list[dict], *, w: Window) -> dict[str, Any]:
    first = series[0]["t"] if series else []
    return chart(
        title="Free capacity stranded on partly used cards",
        t=first,
        series=[{"label": s["model"], "values": s["stranded_gpus"]} for s in series],
        y_label="GPUs stranded",
        unit="GPUs",
        x_label=TIME_AXIS,
    )


@dataclass(frozen=True)
class HeatRow:
    label: str
    href: str
    title: str
    cells: list[dict]


def _band(util: float | None) -> str:
    if util is None:
        return "none"
    return next(css for low, css, _ in UTIL_BANDS if util >= low)


def _heatmap(*, pools: list[Pool], pool: Pool | None, w: Window, page: str | None):
    step = HEATMAP_STEP_S[w.name]
    hw = Window(w.name, w.since, w.until, step)
    first = (int(w.since.timestamp()) // step) * step
    columns = list(range(first, int(w.until.timestamp()) + 1, step))
    # A tick every 4 hours over a day, every day over a week; written in UTC here, and put in the browser's
    # timezone by the page (data-t), as the charts' time axes are.
    tick_every, fmt = (4 * 3600, "%H:%M") if w.name == "24h" else (86400, "%a %d %b")

    def when(b: int) -> str:
        start = datetime.fromtimestamp(b, UTC)
        return f"{start:%a %d %b %H:%M}–{start + timedelta(seconds=step):%H:%M} UTC"

    def cells(name: str, found: dict[int, tuple[float | None, float]]) -> list[dict]:
        out = []
        for b in columns:
            util, alloc = found.get(b, (None, None))
            if b not in found:
                text = f"{name}, {when(b)}: no record"
            elif util is None:
                text = f"{name}, {when(b)}: {alloc:.0f} % allocated, no utilisation sample"
            else:
                text = f"{name}, {when(b)}: {util:.0f} % utilised, {alloc:.0f} % allocated"
            out.append({"css": _band(util), "title": text, "t": b})
        return out

    # A label is written from its tick to the right: one in the last tenth of the row has no room for its words
    # and is left out (the last hour's read "16:0", cut at the row's edge in a 900 px window).
    room = math.ceil(len(columns) * HEATMAP_TICK_ROOM)
    ticks = [
        {"at": i, "t": b, "label": datetime.fromtimestamp(b, UTC).strftime(fmt)}
        for i, b in enumerate(columns)
        if b % tick_every == 0 and len(columns) - i >= room
    ]
    if pool is None:
        found = pool_heatmap(pools=pools, w=hw)
        rows = [
            HeatRow(
                label=p.name,
                href=f"?{urlencode({'window': w.name, 'pool': p.name})}#heatmap",
                title=f"{len(p.node_ids)} nodes, {p.gpus} GPUs: show each node",
                cells=cells(p.name, found.get(p.name, {})),
            )
            for p in pools
        ]
        return {"rows": rows, "columns": len(columns), "ticks": ticks, "page": None, "step_s": step}
    paginator = Paginator(list(pool.node_ids), HEATMAP_NODES_PER_PAGE)
    node_page = paginator.get_page(page)
    ids = list(node_page.object_list)
    names = dict(Node.objects.filter(pk__in=ids).values_list("pk", "name"))
    singles = [Pool(names.get(i, f"node {i}"), (i,), 0) for i in ids]
    found = pool_heatmap(pools=singles, w=hw)
    rows = [
        HeatRow(label=p.name, href="", title=p.name, cells=cells(p.name, found.get(p.name, {})))
        for p in singles
    ]
    return {"rows": rows, "columns": len(columns), "ticks": ticks, "page": node_page, "step_s": step}
