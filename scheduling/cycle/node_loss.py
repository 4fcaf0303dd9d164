"""How long a silent node's jobs keep running, and when the portal may place them elsewhere: the one rule that
keeps a placement from running twice.

Each job's supervisor on its node stops the job once the portal has not acknowledged a heartbeat from the node's
agent for `fence_after_s` (the agent died, or lost the portal), giving it its preemption grace. So from the
node's last recorded heartbeat, the job has surely ended after fence + grace; the margin covers the agent's tick
and the supervisor's poll. The portal re-places (or fails, or finishes cancelling) a lost node's job only after
that deadline (docs/operations.md, "Failures").
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from scheduling.choices import NodeState
from scheduling.inventory.models import Node


def fence_after_s() -> float:
    """How long a job runs on with its node unheard, the value each placement carries to its supervisor."""
    return float(settings.TESSERA_AGENT_FENCE_AFTER_S)


def surely_stopped_at(*, last_heard_at: datetime, grace_s: float) -> datetime:
    """When a job on a node last heard at `last_heard_at` has surely been stopped by its supervisor."""
    return last_heard_at + timedelta(
        seconds=fence_after_s() + max(0.0, grace_s) + settings.TESSERA_FENCE_MARGIN_S
    )


def silent_filter(*, now: datetime) -> Q:
    """The silent nodes, as a filter on Node: declared lost, or not heard for longer than TESSERA_NODE_LOST_AFTER_S
    (a node that never reported counts from its registration). The one rule: the watchdog, the releasing cards and
    the jobs' `node_condition` all read it (`node_is_silent` is it for one node in hand)."""
    threshold = now - timedelta(seconds=settings.TESSERA_NODE_LOST_AFTER_S)
    return (
        Q(state=NodeState.LOST)
        | Q(last_heartbeat_at__lt=threshold)
        | Q(last_heartbeat_at__isnull=True, created_at__lt=threshold)
    )


def node_is_silent(*, node: Node, now: datetime) -> bool:
    """`silent_filter` for one node already read (the same rule, for a page that has its job's nodes in hand)."""
    threshold = now - timedelta(seconds=settings.TESSERA_NODE_LOST_AFTER_S)
    if node.state == NodeState.LOST:
        return True
    heard = node.last_heartbeat_at
    return heard < threshold if heard is not None else node.created_at < threshold


def silent_nodes(*, node_ids, now: datetime) -> dict[int, datetime]:
    """Of these nodes, the silent ones (`silent_filter`): node id -> when last heard. One query."""
    rows = (
        Node.objects.filter(pk__in=list(node_ids))
        .filter(silent_filter(now=now))
        .values_list("pk", "last_heartbeat_at", "created_at")
    )
    return {pk: heard or created for pk, heard, created in rows}
