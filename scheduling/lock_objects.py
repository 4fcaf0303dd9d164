"""The `select_for_update()` querysets of the scheduling writes, in one place so every writer locks in one order.

Order (to keep writers from deadlocking each other): the scheduler lease, then nodes by id, then jobs by id;
GPU ledger rows are taken last, implicitly, by the guarded UPDATEs of `slice_allocate` / `job_release_slices`.
Node sync rows (desired states) are locked by node id.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import QuerySet

from portal import database
from scheduling.cycle.models import NodeSync, SchedulerLease
from scheduling.inventory.models import Node
from scheduling.jobs.models import Job


def scheduler_lease_for_update() -> QuerySet[SchedulerLease]:
    return SchedulerLease.objects.select_for_update()


def nodes_for_update(
    *, names: Iterable[str] | None = None, ids: Iterable[int] | None = None
) -> QuerySet[Node]:
    nodes = Node.objects.select_for_update().order_by("id")
    if names is not None:
        nodes = nodes.filter(name__in=list(names))
    if ids is not None:
        nodes = nodes.filter(pk__in=list(ids))
    return nodes


def nodes_for_placement(*, names: Iterable[str]) -> list[Node]:
    """These nodes, locked against a change of state (lost, cordoned, drained: every such write takes
    nodes_for_update) until the transaction ends, but not against heartbeats: on PostgreSQL FOR KEY SHARE, which
    a plain UPDATE of a non-key column (last_heartbeat_at) does not wait for. A cycle's apply held FOR UPDATE on
    the nodes it placed on for its whole transaction, seconds at 1,000 nodes, and the agents' heartbeat threads
    stood waiting on those rows, every other node's heartbeat behind them (bench/cluster_scale.py)."""
    names = sorted(set(names))
    if not database.postgresql():
        return list(nodes_for_update(names=names))
    table = Node._meta.db_table
    return list(
        Node.objects.raw(f"SELECT * FROM {table} WHERE name = ANY(%s) ORDER BY id FOR KEY SHARE", [names])
    )


def jobs_for_update(*, ids: Iterable[int], skip_locked: bool = False) -> QuerySet[Job]:
    # `of=("self",)`: lock the job rows only, never the team or priority class they join.
    return (
        Job.objects.select_for_update(of=("self",), skip_locked=skip_locked)
        .select_related("priority_class", "team")
        .filter(pk__in=list(ids))
        .order_by("id")
    )


def node_sync_for_update(*, node_id: int) -> QuerySet[NodeSync]:
    return NodeSync.objects.select_for_update().filter(node_id=node_id)


def node_syncs_for_update(*, node_ids: Iterable[int] | None = None) -> QuerySet[NodeSync]:
    """These nodes' sync rows (all when None), locked in node order."""
    syncs = NodeSync.objects.select_for_update().order_by("node_id")
    if node_ids is not None:
        syncs = syncs.filter(node_id__in=list(node_ids))
    return syncs
