"""The cluster map (/cluster/): nodes grouped by pool, one aggregated row per group that opens into node tiles
with one cell per GPU; a node's page (/cluster/<name>/) with its live per-GPU table and state-change audit trail;
and cordon / drain / uncordon for staff.

Reads go through scheduling.inventory.cluster_map (the REST node view's tenancy rule), the write through
scheduling.inventory.services.node_set_state, as the API's POST /api/v1/cluster/nodes/<name>/state/ does.
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from quotas.selectors import team_ids_for_user
from scheduling.errors import ServiceError
from scheduling.history.selectors.nodes import gpu_events, node_gpu_history
from scheduling.history.selectors.usage import usage_totals
from scheduling.history.selectors.windows import window
from scheduling.inventory import cluster_map
from scheduling.inventory.models import Node
from scheduling.inventory.services import NODE_STATE_REASON_MAX, node_set_state

# Distinct colours for teams' slices (hues apart, readable against white); a team's is fixed by its slug.
TEAM_PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#393b79",
    "#637939",
    "#e7ba52",
    "#843c39",
]
# What a staff member may do to a node in each state: (target state, button label).
STATE_ACTIONS = {
    "ready": [("cordoned", "Cordon"), ("draining", "Drain")],
    "cordoned": [("ready", "Uncordon"), ("draining", "Drain")],
    "draining": [("ready", "Uncordon"), ("cordoned", "Cordon")],
    "lost": [("ready", "Mark ready"), ("cordoned", "Cordon")],
}


def _legend(tiles: list[cluster_map.NodeTile]) -> list[tuple[str, str]]:
    return [(team, team_colour(team)) for team in cluster_map.team_colours(tiles)]


def team_colour(slug: str | None) -> str:
    if not slug:
        return ""
    return TEAM_PALETTE[cluster_map.team_colour_index(slug, len(TEAM_PALETTE))]


def _groups_context(request: HttpRequest, groups: list[cluster_map.GroupSummary]) -> dict[str, dict]:
    """group name -> its open part's context (a page of its tiles), read for all of them at once."""
    wanted_group = request.GET.get("group")
    pages = {
        g.name: Paginator(g.node_ids, cluster_map.GROUP_PAGE_NODES).get_page(
            request.GET.get("page") if g.name == wanted_group else 1
        )
        for g in groups
    }
    wanted = [pk for page in pages.values() for pk in page.object_list]
    by_id = {t.id: t for t in cluster_map.node_tiles(user=request.user, node_ids=wanted)}
    out = {}
    for g in groups:
        tiles = [by_id[pk] for pk in pages[g.name].object_list if pk in by_id]
        out[g.name] = {"group": g, "tiles": tiles, "page": pages[g.name], "legend": _legend(tiles)}
    return out


def _common(request: HttpRequest) -> dict:
    return {
        "nav": "cluster",
        "can_set_state": request.user.is_staff,
        "state_actions": STATE_ACTIONS,
        "reason_max": NODE_STATE_REASON_MAX,
        "silent_after_s": cluster_map.SILENT_AFTER_HEARTBEATS * cluster_map.heartbeat_interval_s(),
    }


@login_required
def cluster(request: HttpRequest) -> HttpResponse:
    """The map. `?group=<name>&part=group` is one group's tiles (a page of them, `page=`), fetched when the
    group is opened and re-fetched on events; `?part=summaries` the groups' rows, re-fetched on events;
    `?part=moves` the work moved to make room in the last hour; `?part=idle` the last day's idle GPU-hours."""
    part = request.GET.get("part")
    # The parts that need none of the groups' sums come first.
    if part == "idle":  # loaded after the map: the last day's hourly usage rows
        return render(
            request, "frontend/cluster/_idle.html", {"idle": _idle_gpu_hours(request), "loaded": True}
        )
    if part == "moves":
        return render(
            request, "frontend/cluster/_moves.html", {"moves": cluster_map.recent_moves(user=request.user)}
        )
    wanted = request.GET.get("group")
    # A group's part needs only which nodes are in it; the rows need everyone's samples for their means.
    groups = cluster_map.cluster_groups(with_util=part != "group")
    context = _common(request)
    context["groups"] = groups
    context["totals"] = {
        "nodes": sum(g.nodes for g in groups),
        "gpus": sum(g.gpus for g in groups),
        "allocated_gpus": round(sum(g.allocated_gpus for g in groups), 2),  # the rows' sum, as they round
        "free_whole_gpus": sum(g.free_whole_gpus for g in groups),
    }
    if part == "summaries":
        return render(request, "frontend/cluster/_summaries.html", context)
    if part == "group":
        group = next((g for g in groups if g.name == wanted), None)
        if group is None:
            raise Http404("No such group.")
        context.update(_groups_context(request, [group])[group.name])
        return render(request, "frontend/cluster/_group.html", context)
    context["moves"] = cluster_map.recent_moves(user=request.user)
    # Small groups start open, as many as fit in one page's worth of tiles; the one asked for always.
    to_open, budget = [], cluster_map.GROUP_PAGE_NODES
    for group in groups:
        if group.name == wanted or (group.starts_open and group.nodes <= budget):
            to_open.append(group)
            budget -= min(group.nodes, cluster_map.GROUP_PAGE_NODES)
    opened = _groups_context(request, to_open)
    legend = sorted({entry for ctx in opened.values() for entry in ctx["legend"]})
    context.update(
        {
            "opened": opened,
            "legend": legend,
            "palette": TEAM_PALETTE,
        }
    )
    return render(request, "frontend/cluster/map.html", context)


IDLE_WINDOW = timedelta(hours=24)


def _idle_gpu_hours(request: HttpRequest) -> dict:
    """GPU-hours held on idle cards (under 5 %) in the last 24 hours: by team for everyone (as the history page
    shows teams), by person for the viewer's own teams (everyone's for staff)."""
    until = timezone.now()
    since = until - IDLE_WINDOW
    teams = [t for t in usage_totals(since=since, until=until, group="team") if t["idle_gpu_hours"] > 0.0005]
    own = None if request.user.is_staff else team_ids_for_user(user=request.user)
    users = [
        u
        for u in usage_totals(since=since, until=until, group="user", team_ids=own)
        if u["idle_gpu_hours"] > 0.0005
    ]

    def ranked(rows: list[dict]) -> list[dict]:
        rows = [
            {**r, "idle_pct": round(100 * r["idle_gpu_hours"] / r["gpu_hours"]) if r["gpu_hours"] else 0}
            for r in rows
        ]
        return sorted(rows, key=lambda r: -r["idle_gpu_hours"])[:10]

    return {"teams": ranked(teams), "users": ranked(users), "staff": request.user.is_staff}


@login_required
def node(request: HttpRequest, name: str) -> HttpResponse:
    """One node: its live per-GPU table (temperature, power, SM clock, memory, health, slices) and audit
    trail. `?part=gpus` is the table alone, re-fetched on events and every few seconds."""
    found = cluster_map.node_tiles(user=request.user, names=[name])
    if not found:
        raise Http404("No such node.")
    tile = found[0]
    context = _common(request)
    context.update({"tile": tile, "legend": _legend(found), "tiles": found})
    if request.GET.get("part") == "gpus":
        return render(request, "frontend/cluster/_node_gpus.html", context)
    node_row = Node.objects.get(pk=tile.id)
    context["changes"] = cluster_map.node_state_changes(node=node_row)
    context["group_name"] = cluster_map.tile_group(tile)
    context.update(
        _node_history(request, node_row, card_mib=max((g.memory_mib for g in tile.gpus), default=0))
    )
    return render(request, "frontend/cluster/node.html", context)


NODE_WINDOWS = ("1h", "6h", "24h", "7d", "30d")
# (key in the history, chart title, y label, unit, the y axis' top: None for the data's)
NODE_CHARTS = (
    ("util_pct", "Utilisation", "SM utilisation", "%", 100),
    ("memory_used_gib", "Memory used", "GPU memory used", "GiB", "card"),
    ("temperature_c", "Temperature", "Temperature", "°C", None),
    ("power_w", "Power", "Power draw", "W", None),
    ("sm_clock_mhz", "SM clock", "SM clock", "MHz", None),
)


def _node_history(request: HttpRequest, node_row: Node, *, card_mib: int) -> dict:
    """The node's GPUs over the chosen window (the time picker), one chart per measure with a line per GPU (the
    charts share one legend key: a GPU hidden in one is hidden in all), and its XID events in the window."""
    name = request.GET.get("window", "")
    w = window(name if name in NODE_WINDOWS else "", default="24h")
    found = node_gpu_history(node_id=node_row.pk, node_name=node_row.name, w=w)
    charts = []
    for key, title, y_label, unit, top in NODE_CHARTS:
        series = [{"label": f"GPU {g['index']}", "values": g[key]} for g in found.gpus]
        if top == "card":
            top = round(card_mib / 1024, 2) if card_mib else None
        charts.append(
            {
                "json_id": f"chart-node-{key}",
                "title": f"{title} over the last {w.name}",
                "t": found.gpus[0]["t"] if found.gpus else [],
                "series": series,
                "y": {"label": f"{y_label} ({unit})", "unit": unit, "min": 0, "max": top},
                "kind": "line",
                "sync": f"node-{node_row.name}",
            }
        )
    return {
        "history_window": w,
        "history_windows": NODE_WINDOWS,
        "history_source": found,
        "history_charts": charts,
        "history_empty": not any(v is not None for g in found.gpus for k, *_ in NODE_CHARTS for v in g[k]),
        "gpu_events": gpu_events(node_id=node_row.pk, w=w),
    }


@login_required
@require_POST
def node_state(request: HttpRequest, name: str) -> HttpResponse:
    """Cordon, drain or uncordon, from the map or the node's page: staff only (403 and nothing changed for
    anyone else), with a reason, through the same service as the API."""
    if not request.user.is_staff:
        raise PermissionDenied("Only staff may cordon, drain or uncordon a node.")
    node_row = get_object_or_404(Node, name=name)
    state = request.POST.get("state", "")
    try:
        node_set_state(node=node_row, state=state, actor=request.user, reason=request.POST.get("reason", ""))
    except ServiceError as exc:
        messages.error(request, f"{name} not changed: {exc.message}")
    else:
        messages.success(request, f"{name} is now {node_row.get_state_display().lower()}.")
    back = request.POST.get("next") or reverse("frontend:node", args=[name])
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
        back = reverse("frontend:node", args=[name])
    return redirect(back)
