"""Reads for the cluster map (/cluster/) and a node's page: nodes grouped by pool, per-GPU cells with their
slices, NVLink islands and live samples, and a node's state-change audit trail.

Every read is a fixed number of queries whatever the cluster's size (one per table it needs), so the map of
1,000 nodes x 8 GPUs renders as fast as that of two. Who holds a slice is shown under the API's tenancy rule,
`slice_holder`, which the REST node view uses too: other teams' slices are anonymous unless the viewer is staff.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, FloatField, Q, Sum, Value
from django.db.models.functions import Cast, Coalesce, Greatest, Least, NullIf

from quotas.selectors import team_ids_for_user
from scheduling.agents.live_metrics import live_metrics_for_nodes, live_utils_for_nodes
from scheduling.choices import GpuHealth, JobState, LinkKind, NodeState
from scheduling.inventory.models import Gpu, GpuLink, Node, NodeStateChange
from scheduling.inventory.selectors import (
    SILENT_AFTER_HEARTBEATS,
    NodeConditions,
    heartbeat_interval_s,
    node_conditions,
)
from scheduling.jobs.models import JobEvent, Slice
from scheduling.jobs.states import TERMINAL_STATES
from scheduling.jobs.usage import slice_share
from scheduling.jobs.wording import job_ref

# A group of at most this many nodes starts open on the map; larger ones open on request, a page at a time.
OPEN_GROUP_MAX_NODES = 12
GROUP_PAGE_NODES = 64
# The heartbeat rule (SILENT_AFTER_HEARTBEATS, heartbeat_interval_s) and a node's conditions live in
# scheduling.inventory.selectors, shared with the API and `tessera nodes`.
__all__ = ["SILENT_AFTER_HEARTBEATS", "heartbeat_interval_s"]


# --- Who holds a slice: one tenancy rule for the API and the pages ------------------------------------------


def visible_team_ids(user: Any) -> set[int] | None:
    """The teams whose slices this user sees in full; None means all (staff)."""
    return None if user.is_staff else team_ids_for_user(user=user)


@dataclass(frozen=True)
class SliceHolder:
    job_id: int | None
    job_name: str | None
    user: str | None
    team: str | None
    mine: bool  # the viewer may see who holds it (their team's, or staff)
    memory_mib: int
    compute_pct: int
    # Held by a job that has ended while its node was silent: taken until its stop is confirmed or its fence
    # has surely passed (scheduling.jobs.selectors.job_node_silence).
    releasing: bool = False


def slice_holder(
    *,
    visible: set[int] | None,
    team_id: int,
    team_slug: str,
    job_id: int,
    job_name: str,
    username: str,
    memory_mib: int,
    compute_pct: int,
    job_state: str = "",
) -> SliceHolder:
    """A slice as `visible` (visible_team_ids) may see it: another team's is anonymous, only its size shows."""
    mine = visible is None or team_id in visible
    return SliceHolder(
        job_id=job_id if mine else None,
        job_name=job_name if mine else None,
        user=username if mine else None,
        team=team_slug if mine else None,
        mine=mine,
        memory_mib=memory_mib,
        compute_pct=compute_pct,
        releasing=job_state in TERMINAL_STATES,
    )


def nvlink_peers(*, gpu_ids: Iterable[int]) -> dict[int, set[int]]:
    """GPU id -> the ids of the GPUs it has an NVLink to (one query)."""
    peers: dict[int, set[int]] = defaultdict(set)
    ids = list(gpu_ids)
    if not ids:
        return peers
    for a, b in GpuLink.objects.filter(gpu_a_id__in=ids, kind=LinkKind.NVLINK).values_list(
        "gpu_a_id", "gpu_b_id"
    ):
        peers[a].add(b)
        peers[b].add(a)
    return peers


# --- Groups: one row per pool ---------------------------------------------------------------------------------


@dataclass
class GroupSummary:
    name: str
    models: list[str]
    node_ids: list[int]
    nodes_by_state: dict[str, int]
    gpus: int
    allocated_gpus: float  # whole-GPU equivalents, as the cluster summary counts them
    free_whole_gpus: int  # cards with nothing allocated on ready nodes
    failed_gpus: int
    mean_util_pct: float | None  # over the cards with a fresh sample; None: no sample
    sampled_gpus: int

    @property
    def nodes(self) -> int:
        return len(self.node_ids)

    @property
    def allocated_pct(self) -> int:
        return round(100 * self.allocated_gpus / self.gpus) if self.gpus else 0

    @property
    def starts_open(self) -> bool:
        return self.nodes <= OPEN_GROUP_MAX_NODES

    @property
    def states(self) -> list[tuple[str, int]]:
        """Nodes by state in the order people read them, only states that occur."""
        return [(s, self.nodes_by_state[s]) for s in NodeState.values if self.nodes_by_state.get(s)]


def _group_name(labels: Any, models: Counter) -> str:
    pool = labels.get("pool") if isinstance(labels, dict) else None
    if isinstance(pool, str) and pool.strip():
        return pool.strip()
    return models.most_common(1)[0][0] if models else "no GPUs"


def _share_sql() -> Least:
    """slice_share in SQL: a card's allocated whole-GPU equivalents, the larger of its memory and compute shares,
    at most 1."""
    memory = Coalesce(
        Cast("allocated_memory_mib", FloatField()) / NullIf(Cast("memory_mib", FloatField()), Value(0.0)),
        Value(0.0),
    )
    return Least(Value(1.0), Greatest(memory, Cast("allocated_compute_pct", FloatField()) / Value(100.0)))


def cluster_groups(*, with_util: bool = True) -> list[GroupSummary]:
    """Every node in its group (its `pool` label, else its GPU model), each group's numbers: two queries (its cards
    summed per node and model in the database, not read one by one) and one read of the live samples."""
    nodes = list(Node.objects.order_by("name").values_list("pk", "name", "state", "labels"))
    per_node: dict[int, list[tuple]] = defaultdict(list)
    not_failed = ~Q(health=GpuHealth.FAILED)
    for row in (
        Gpu.objects.order_by("node_id", "model__name")
        .values("node_id", "model__name")
        .annotate(
            cards=Count("id"),
            share=Sum(_share_sql()),
            failed=Count("id", filter=Q(health=GpuHealth.FAILED)),
            idle=Count("id", filter=not_failed & Q(allocated_memory_mib=0, allocated_compute_pct=0)),
        )
        .values_list("node_id", "model__name", "cards", "share", "failed", "idle")
    ):
        per_node[row[0]].append(row[1:])
    samples = live_utils_for_nodes(node_names=[n[1] for n in nodes]) if with_util else {}
    groups: dict[str, GroupSummary] = {}
    utils: dict[str, list[float]] = defaultdict(list)
    for pk, name, state, labels in nodes:
        rows = per_node.get(pk, [])
        models = Counter({model: cards for model, cards, *_ in rows})
        key = _group_name(labels, models)
        group = groups.get(key)
        if group is None:
            group = groups[key] = GroupSummary(key, [], [], Counter(), 0, 0.0, 0, 0, None, 0)
        group.node_ids.append(pk)
        group.nodes_by_state[state] += 1
        for model, cards, share, failed, idle in rows:
            if model not in group.models:
                group.models.append(model)
            group.gpus += cards
            group.allocated_gpus += share or 0.0
            group.failed_gpus += failed
            group.free_whole_gpus += idle if state == NodeState.READY else 0
        utils[key].extend(samples.get(name, ()))
    for key, group in groups.items():
        group.allocated_gpus = round(group.allocated_gpus, 2)
        group.models.sort()
        if utils[key]:
            group.mean_util_pct = round(sum(utils[key]) / len(utils[key]), 1)
            group.sampled_gpus = len(utils[key])
    return sorted(groups.values(), key=lambda g: g.name.lower())


def cluster_group(*, name: str) -> GroupSummary | None:
    return next((g for g in cluster_groups() if g.name == name), None)


# --- Tiles: one per node, one cell per GPU ----------------------------------------------------------------------


@dataclass
class GpuCell:
    id: int
    index: int
    model: str
    memory_mib: int
    sharing_mode: str
    health: str
    compute_capacity_pct: int
    allocated_memory_mib: int
    allocated_compute_pct: int
    slices: list[SliceHolder] = field(default_factory=list)
    sample: dict[str, Any] | None = None  # the newest live sample of this card, None when none is fresh
    island: list[int] = field(default_factory=list)  # indices of the cards in its NVLink island (itself too)

    @property
    def allocated(self) -> bool:
        return bool(self.allocated_memory_mib or self.allocated_compute_pct)

    @property
    def allocated_share(self) -> float:
        return slice_share(
            memory_mib=self.allocated_memory_mib,
            compute_pct=self.allocated_compute_pct,
            gpu_memory_mib=self.memory_mib,
        )

    @property
    def util_pct(self) -> float | None:
        value = (self.sample or {}).get("util_pct")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def memory_used_mib(self) -> int | None:
        value = (self.sample or {}).get("memory_used_mib")
        return int(value) if isinstance(value, (int, float)) else None

    @property
    def shared(self) -> bool:
        return len(self.slices) > 1 or any(s.memory_mib < self.memory_mib for s in self.slices)


@dataclass
class NodeTile:
    id: int
    name: str
    state: str
    labels: dict
    conditions: NodeConditions  # heartbeat age, connected or why not, last error (the API's rule)
    gpus: list[GpuCell]
    islands: list[list[GpuCell]]  # GPUs in NVLink-connected groups, in index order; a lone card is its own

    @property
    def state_label(self) -> str:
        return NodeState(self.state).label

    @property
    def last_heartbeat_at(self) -> datetime | None:
        return self.conditions.last_heartbeat_at

    @property
    def heartbeat_age_s(self) -> float | None:  # None: never heard
        return self.conditions.heartbeat_age_s

    @property
    def silent(self) -> bool:
        return not self.conditions.connected

    @property
    def heartbeat_ticks(self) -> bool:
        """Whether the page keeps counting its heartbeat age (not once its socket closed: the words say when)."""
        return self.last_heartbeat_at is not None and self.conditions.connection in ("connected", "silent")

    @property
    def heartbeat_words(self) -> str:
        return self.conditions.connection_reason


def _islands(gpus: list[GpuCell], peers: dict[int, set[int]]) -> list[list[GpuCell]]:
    """Connected components of the node's NVLink graph, each in index order, ordered by their first card."""
    by_id = {g.id: g for g in gpus}
    seen: set[int] = set()
    out = []
    for gpu in gpus:
        if gpu.id in seen:
            continue
        component, stack = [], [gpu.id]
        seen.add(gpu.id)
        while stack:
            current = stack.pop()
            component.append(by_id[current])
            for peer in peers.get(current, ()):
                if peer in by_id and peer not in seen:
                    seen.add(peer)
                    stack.append(peer)
        out.append(sorted(component, key=lambda g: g.index))
    return out


def node_tiles(
    *, user: Any, node_ids: list[int] | None = None, names: list[str] | None = None
) -> list[NodeTile]:
    """The nodes (by id or name, in name order) with their GPUs, slices (as `user` may see them), NVLink
    islands and newest samples: four queries and one read of the live samples, whatever their number."""
    nodes_q = Node.objects.order_by("name")
    if node_ids is not None:
        nodes_q = nodes_q.filter(pk__in=node_ids)
    if names is not None:
        nodes_q = nodes_q.filter(name__in=names)
    nodes = list(nodes_q.values_list("pk", "name", "state", "labels", "last_heartbeat_at"))
    ids = [n[0] for n in nodes]
    cells: dict[int, GpuCell] = {}
    by_node: dict[int, list[GpuCell]] = defaultdict(list)
    for row in (
        Gpu.objects.filter(node_id__in=ids)
        .order_by("node_id", "index")
        .values_list(
            "pk",
            "node_id",
            "index",
            "model__name",
            "memory_mib",
            "sharing_mode",
            "health",
            "compute_capacity_pct",
            "allocated_memory_mib",
            "allocated_compute_pct",
        )
    ):
        cell = GpuCell(row[0], *row[2:])
        cells[cell.id] = cell
        by_node[row[1]].append(cell)
    visible = visible_team_ids(user)
    for gpu_id, team_id, slug, job_id, job_name, username, memory_mib, compute_pct, job_state in (
        Slice.objects.filter(gpu__node_id__in=ids)
        .order_by("gpu_id", "job_id")
        .values_list(
            "gpu_id",
            "job__team_id",
            "job__team__slug",
            "job_id",
            "job__name",
            "job__submitter__username",
            "memory_mib",
            "compute_pct",
            "job__state",
        )
    ):
        cells[gpu_id].slices.append(
            slice_holder(
                visible=visible,
                team_id=team_id,
                team_slug=slug,
                job_id=job_id,
                job_name=job_name,
                username=username,
                memory_mib=memory_mib,
                compute_pct=compute_pct,
                job_state=job_state,
            )
        )
    peers = nvlink_peers(gpu_ids=cells)
    samples = live_metrics_for_nodes(node_names=[n[1] for n in nodes])
    conditions = node_conditions(nodes=[(n[0], n[2], n[4]) for n in nodes])
    tiles = []
    for pk, name, state, labels, _heard in nodes:
        gpus = by_node.get(pk, [])
        node_samples = samples.get(name, {})
        for gpu in gpus:
            gpu.sample = node_samples.get(gpu.index)
        islands = _islands(gpus, peers)
        for island in islands:
            for gpu in island:
                gpu.island = [g.index for g in island]
        tiles.append(
            NodeTile(
                id=pk,
                name=name,
                state=state,
                labels=labels if isinstance(labels, dict) else {},
                conditions=conditions[pk],
                gpus=gpus,
                islands=islands,
            )
        )
    return tiles


def tile_group(tile: NodeTile) -> str:
    """The group a tile's node is in on the map."""
    return _group_name(tile.labels, Counter(g.model for g in tile.gpus))


def team_colours(tiles: Iterable[NodeTile]) -> list[str]:
    """The teams named on these tiles' slices, sorted: the map's legend."""
    return sorted({s.team for t in tiles for g in t.gpus for s in g.slices if s.team})


def team_colour_index(slug: str, palette_size: int) -> int:
    """A stable colour per team slug (the same on every page and every refresh): a hash of the slug (FNV-1a, so
    it does not change between processes as Python's hash() does) into the palette."""
    h = 0x811C9DC5
    for byte in slug.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h % palette_size


# --- A node's audit trail -----------------------------------------------------------------------------------


def node_state_changes(*, node: Node, limit: int = 50) -> list[NodeStateChange]:
    """The node's state changes by people, newest first."""
    return list(
        NodeStateChange.objects.filter(node=node).select_related("actor").order_by("-at", "-id")[:limit]
    )


# --- Work moved to make room ------------------------------------------------------------------------------------

RECENT_MOVES_S = 3600.0
RECENT_MOVES_MAX = 10


@dataclass(frozen=True)
class Move:
    at: datetime
    job_id: int | None  # None: another team's job (anonymous, as its slices are)
    job_name: str | None
    team: str
    from_nodes: tuple[str, ...]
    to_nodes: tuple[str, ...]
    why: str  # "to free an NVLink node for team llm's guaranteed 8-GPU job #12"
    state: str  # where the moved job is now


def recent_moves(*, user: Any, within_s: float = RECENT_MOVES_S, limit: int = RECENT_MOVES_MAX) -> list[Move]:
    """The jobs the scheduler moved to make room in the last hour, newest first: from where, to where, and why
    (one query). Another team's job is shown by its team only, as its slices are."""
    from django.utils import timezone

    visible = visible_team_ids(user)
    since = timezone.now() - timedelta(seconds=within_s)
    rows = (
        JobEvent.objects.filter(to_state=JobState.PREEMPTED, code="moved", at__gte=since)
        .order_by("-at", "-id")
        .values_list("at", "job_id", "job__name", "job__team_id", "job__team__slug", "job__state", "data")[
            :limit
        ]
    )
    out = []
    for at, job_id, name, team_id, slug, state, data in rows:
        mine = visible is None or team_id in visible
        why = job_ref(str((data or {}).get("why") or ""))
        to = tuple((data or {}).get("to_nodes") or ())
        prefix = f"moved to {', '.join(to)} "
        out.append(
            Move(
                at=at,
                job_id=job_id if mine else None,
                job_name=name if mine else None,
                team=slug,
                from_nodes=tuple((data or {}).get("nodes") or ()),
                to_nodes=to,
                why=why.removeprefix(prefix),
                state=state,
            )
        )
    return out
