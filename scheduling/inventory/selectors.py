"""Reads for the inventory: nodes and their GPUs, capacity totals, and what one node could ever give a job."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.db.models import Count, F, Q, QuerySet, Sum
from django.utils import timezone

from portal.database import fetch_rows
from scheduling.choices import GpuHealth, LinkKind, NodeState, Topology
from scheduling.cycle.models import NodeSync
from scheduling.engine import types as eng
from scheduling.engine.capacity import most_whole_gpus
from scheduling.inventory.engine_view import engine_gpu, engine_node
from scheduling.inventory.models import Gpu, GpuLink, GpuModel, Node


@dataclass(frozen=True)
class GpuModelRow:
    id: int
    name: str
    memory_mib: int
    compute_capability: Decimal
    installed: bool = True  # the cluster has a healthy GPU of it
    # The least and the most memory of the cluster's cards of this model (failed ones too); None: it has none.
    smallest_card_mib: int | None = None
    largest_card_mib: int | None = None


@dataclass(frozen=True)
class Catalogue:
    """What a submit checks a request against, read in one query."""

    models: list[GpuModelRow]
    largest_node_cpu_milli: int | None  # None: no node yet
    largest_node_memory_mib: int | None


def catalogue() -> Catalogue:
    """The GPU models (each saying whether the cluster has a healthy GPU of it, and the memory of its smallest and
    largest card) and the largest node."""
    model, gpu, node = GpuModel._meta.db_table, Gpu._meta.db_table, Node._meta.db_table
    rows = fetch_rows(
        f"""SELECT m.id, m.name, m.memory_mib, m.compute_capability,
                   EXISTS (SELECT 1 FROM {gpu} g WHERE g.model_id = m.id AND g.health <> %s),
                   (SELECT MIN(g.memory_mib) FROM {gpu} g WHERE g.model_id = m.id),
                   (SELECT MAX(g.memory_mib) FROM {gpu} g WHERE g.model_id = m.id),
                   n.cpu, n.mem
            FROM (SELECT MAX(cpu_milli) AS cpu, MAX(memory_mib) AS mem FROM {node}) n
            LEFT JOIN {model} m ON TRUE ORDER BY m.name""",
        [GpuHealth.FAILED],
    )
    models = [
        GpuModelRow(
            i,
            name,
            mib,
            Decimal(str(cc)),
            bool(has),
            None if smallest is None else int(smallest),
            None if largest is None else int(largest),
        )
        for i, name, mib, cc, has, smallest, largest, _, _ in rows
        if i is not None
    ]
    cpu, mem = rows[0][7:9] if rows else (None, None)
    return Catalogue(models, None if cpu is None else int(cpu), None if mem is None else int(mem))


def gpu_model_rows(*, installed_only: bool = False) -> list[GpuModelRow]:
    """The GPU models of the catalogue, each saying whether the cluster has a healthy GPU of it."""
    found = catalogue().models
    return [m for m in found if m.installed] if installed_only else found


def _healthy_gpu_counts(*, allowed_models: set[int], gpus: int) -> tuple[int, int]:
    """For GPUs of allowed models, in one query: the most healthy ones one node holds, and how many nodes hold
    at least `gpus` of them (healthy or not)."""
    marks = ", ".join(["%s"] * len(allowed_models))
    rows = fetch_rows(
        f"""
        SELECT COALESCE(MAX(healthy), 0), COUNT(CASE WHEN total >= %s THEN 1 END) FROM (
            SELECT node_id, COUNT(*) AS total, COUNT(CASE WHEN health <> %s THEN 1 END) AS healthy
            FROM {Gpu._meta.db_table} WHERE model_id IN ({marks}) GROUP BY node_id
        ) per_node""",
        [gpus, GpuHealth.FAILED, *sorted(allowed_models)],
    )
    largest, nodes = rows[0]
    return int(largest), int(nodes)


def cluster_nodes() -> QuerySet[Node]:
    return Node.objects.prefetch_related("gpus__model", "gpus__slices")


def gpu_capacity_totals() -> dict[str, int]:
    agg = Gpu.objects.aggregate(
        memory_mib=Sum("memory_mib"),
        allocated_memory_mib=Sum("allocated_memory_mib"),
        allocated_compute_pct=Sum("allocated_compute_pct"),
    )
    agg["gpus"] = Gpu.objects.count()
    return {k: v or 0 for k, v in agg.items()}


def overcommitted_gpus() -> QuerySet[Gpu]:
    """GPUs whose ledger exceeds capacity: must always be empty (the first invariant)."""
    return Gpu.objects.filter(
        Q(allocated_memory_mib__gt=F("memory_mib")) | Q(allocated_compute_pct__gt=F("compute_capacity_pct"))
    )


def schedulable_gpu_count() -> int:
    return (
        Gpu.objects.filter(node__state__in=[NodeState.READY, NodeState.DRAINING])
        .exclude(health=GpuHealth.FAILED)
        .count()
    )


def whole_gpu_capacity(*, allowed_models: set[int], topology: str, gpus: int) -> tuple[int, int]:
    """For a job of `gpus` whole GPUs per node of the allowed models, with its topology need: the most such GPUs
    any one node could ever give it at once (every card idle), and how many nodes hold at least `gpus` of them.

    Without a topology need it is a count, in one aggregate query. With one, the engine decides
    (`engine.capacity.most_whole_gpus`: exact NVLink cliques, NUMA groups) on the nodes as the cycle sees them;
    the answer is kept per process until the inventory changes (its fingerprint, one aggregate query), so a
    submit to a 1,000-node cluster does not convert it every time."""
    if not allowed_models:
        return 0, 0
    most, nodes_with_enough = _healthy_gpu_counts(allowed_models=allowed_models, gpus=gpus)
    if topology == Topology.NONE:
        return most, nodes_with_enough
    key = (_inventory_fingerprint(), frozenset(allowed_models), topology)
    best = _most_by_topology.get(key)
    if best is None:
        request = eng.Request(gpus=1, topology=eng.TopologyNeed(topology))
        best = max(
            (most_whole_gpus(request, node) for node in _engine_nodes(allowed_models=allowed_models)),
            default=0,
        )
        if len(_most_by_topology) >= _MOST_BY_TOPOLOGY_SLOTS:
            _most_by_topology.clear()
        _most_by_topology[key] = best
    return best, nodes_with_enough


# (inventory fingerprint, allowed GPU model ids, topology) -> the most whole GPUs one node gives.
_most_by_topology: dict[tuple, int] = {}
_MOST_BY_TOPOLOGY_SLOTS = 256


def _inventory_fingerprint() -> tuple:
    """What the answers above depend on, summed up in one query: which GPUs exist where (node, NUMA node, model),
    which have failed, and the NVLink links. Any change to these changes it."""
    gpu, link = Gpu._meta.db_table, GpuLink._meta.db_table
    rows = fetch_rows(
        f"""
        SELECT (SELECT COUNT(*) FROM {gpu}),
               (SELECT COALESCE(SUM(id * 7919 + node_id * 104729 + numa_node * 31 + model_id), 0) FROM {gpu}),
               (SELECT COALESCE(SUM(id), 0) FROM {gpu} WHERE health = %s),
               (SELECT COUNT(*) FROM {link} WHERE kind = %s),
               (SELECT COALESCE(SUM(gpu_a_id * 7919 + gpu_b_id), 0) FROM {link} WHERE kind = %s)""",
        [GpuHealth.FAILED, LinkKind.NVLINK, LinkKind.NVLINK],
    )
    return tuple(int(v) for v in rows[0])


def _engine_nodes(*, allowed_models: set[int], at_least: int = 1) -> list[eng.Node]:
    """Nodes as the engine sees them, with only their GPUs of the allowed models (healthy or not), limited to
    nodes with at least `at_least` healthy ones of them."""
    usable = Gpu.objects.filter(model_id__in=allowed_models).exclude(health=GpuHealth.FAILED)
    node_ids = list(
        usable.values("node_id")
        .annotate(n=Count("id"))
        .filter(n__gte=at_least)
        .values_list("node_id", flat=True)
    )
    gpus: dict[int, list[eng.Gpu]] = defaultdict(list)
    for g in (
        Gpu.objects.filter(node_id__in=node_ids, model_id__in=allowed_models)
        .select_related("model")
        .order_by("node_id", "index")
    ):
        gpus[g.node_id].append(engine_gpu(g))
    links: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for node_id, a, b in GpuLink.objects.filter(
        kind=LinkKind.NVLINK, gpu_a__node_id__in=node_ids
    ).values_list("gpu_a__node_id", "gpu_a__index", "gpu_b__index"):
        links[node_id].add((min(a, b), max(a, b)))
    return [
        engine_node(n, gpus=gpus[n.pk], nvlink=links[n.pk])
        for n in Node.objects.filter(pk__in=node_ids).order_by("name")
    ]


def node_state_counts() -> dict[str, int]:
    return dict(Node.objects.values_list("state").annotate(n=Count("id")).order_by())


def capacity_by_model() -> list[dict]:
    """Per GPU model: cards, cards on ready nodes, and cards wholly free there."""
    ready = Q(node__state__in=[NodeState.READY, NodeState.DRAINING]) & ~Q(health=GpuHealth.FAILED)
    rows = (
        Gpu.objects.values("model__name")
        .annotate(
            gpus=Count("id"),
            ready_gpus=Count("id", filter=ready),
            free_gpus=Count("id", filter=ready & Q(allocated_memory_mib=0, allocated_compute_pct=0)),
            memory_mib=Sum("memory_mib"),
            allocated_memory_mib=Sum("allocated_memory_mib"),
        )
        .order_by("model__name")
    )
    return [{**r, "model": r.pop("model__name")} for r in rows]


# --- A node's conditions: one rule for the API, `tessera nodes` and the portal's node tiles and pages ----------

# A node whose agent was last heard longer ago than this many heartbeat intervals reads "agent silent".
SILENT_AFTER_HEARTBEATS = 2


def heartbeat_interval_s() -> float:
    """How often agents are configured to send a heartbeat (the agent's --heartbeat-s)."""
    return float(getattr(settings, "TESSERA_AGENT_HEARTBEAT_S", 5.0))


def silent_after_s() -> float:
    return SILENT_AFTER_HEARTBEATS * heartbeat_interval_s()


def age_words(seconds: float) -> str:
    """'12 s', '3 min', '5 h', '2 d'."""
    s = max(0, int(seconds))
    if s < 90:
        return f"{s} s"
    if s < 5400:
        return f"{round(s / 60)} min"
    if s < 172800:
        return f"{round(s / 3600)} h"
    return f"{round(s / 86400)} d"


class Connection:
    """Whether a node's agent is connected, and if not, why (NodeConditions.connection)."""

    CONNECTED = "connected"  # heard within SILENT_AFTER_HEARTBEATS heartbeat intervals
    NEVER = "never_connected"  # no agent has ever said hello nor sent a heartbeat
    SILENT = "silent"  # its socket may be open, but no heartbeat for longer than that
    DISCONNECTED = "disconnected"  # its socket closed (and no agent has said hello since)


@dataclass(frozen=True)
class NodeConditions:
    state: str  # ready, cordoned, draining, lost (Node.state)
    heartbeat_age_s: float | None  # None: never heard
    last_heartbeat_at: datetime | None
    connection: str  # a Connection value
    connected_at: datetime | None
    disconnected_at: datetime | None
    last_error: str | None
    last_error_at: datetime | None

    @property
    def connected(self) -> bool:
        return self.connection == Connection.CONNECTED

    @property
    def cordoned(self) -> bool:
        return self.state == NodeState.CORDONED

    @property
    def draining(self) -> bool:
        return self.state == NodeState.DRAINING

    @property
    def schedulable(self) -> bool:
        """Whether the scheduler places new work there (ready, whatever its agent; a silent one soon is lost)."""
        return self.state == NodeState.READY

    @property
    def connection_reason(self) -> str:
        """Why, in words: 'heartbeat 3 s ago', 'never connected', 'agent silent for 40 s',
        'disconnected at 2025-01-01 10:00:00 UTC (4 min ago)'. The watchdog marks a node silent for
        TESSERA_NODE_LOST_AFTER_S lost (its state), and requeues its jobs."""
        age = self.heartbeat_age_s
        if self.connection == Connection.NEVER:
            return "never connected"
        if self.connection == Connection.DISCONNECTED:
            at = self.disconnected_at
            when = at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if at else "an unknown time"
            ago = f" ({age_words((timezone.now() - at).total_seconds())} ago)" if at else ""
            return f"disconnected at {when}{ago}"
        if (
            self.connection == Connection.SILENT
        ):  # the words frontend/static/frontend/cluster.js keeps counting
            return f"agent silent for {age_words(age or 0)}"
        return f"heartbeat {age_words(age or 0)} ago"


def node_condition(
    *,
    state: str,
    last_heartbeat_at: datetime | None,
    connected_at: datetime | None = None,
    disconnected_at: datetime | None = None,
    last_error: str = "",
    last_error_at: datetime | None = None,
    now: datetime | None = None,
) -> NodeConditions:
    """The rule, on values already read: never heard -> never connected; its socket closed after its last hello
    -> disconnected; heard longer ago than SILENT_AFTER_HEARTBEATS intervals -> silent; else connected."""
    now = now or timezone.now()
    age = None if last_heartbeat_at is None else max(0.0, (now - last_heartbeat_at).total_seconds())
    if age is None and connected_at is None:
        connection = Connection.NEVER
    elif disconnected_at is not None and (connected_at is None or disconnected_at >= connected_at):
        connection = Connection.DISCONNECTED
    elif age is None or age > silent_after_s():
        connection = Connection.SILENT
    else:
        connection = Connection.CONNECTED
    return NodeConditions(
        state=state,
        heartbeat_age_s=None if age is None else round(age, 1),
        last_heartbeat_at=last_heartbeat_at,
        connection=connection,
        connected_at=connected_at,
        disconnected_at=disconnected_at,
        last_error=last_error or None,
        last_error_at=last_error_at if last_error else None,
    )


def node_conditions(*, nodes: list[tuple[int, str, datetime | None]]) -> dict[int, NodeConditions]:
    """Node id -> its conditions, for (id, state, last_heartbeat_at) already read: one query (their NodeSync)."""
    syncs = {
        row[0]: row[1:]
        for row in NodeSync.objects.filter(node_id__in=[n[0] for n in nodes]).values_list(
            "node_id", "connected_at", "disconnected_at", "last_error", "last_error_at"
        )
    }
    now = timezone.now()
    out = {}
    for pk, state, heard in nodes:
        connected_at, disconnected_at, last_error, last_error_at = syncs.get(pk, (None, None, "", None))
        out[pk] = node_condition(
            state=state,
            last_heartbeat_at=heard,
            connected_at=connected_at,
            disconnected_at=disconnected_at,
            last_error=last_error,
            last_error_at=last_error_at,
            now=now,
        )
    return out
