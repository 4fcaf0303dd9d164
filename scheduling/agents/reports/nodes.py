"""The node's own record as its agent's connection moves it: revived when a lost node speaks again, the desired
version it acknowledged, when it disconnected, and its newest error (shown in its conditions); and whether a
connection's token is still the node's."""

from __future__ import annotations

from django.utils import timezone

from scheduling.agents.reports.outcome import db_text
from scheduling.choices import NodeState
from scheduling.cycle.models import NodeSync
from scheduling.cycle.requests import cycle_request_after_commit
from scheduling.cycle.watchdog import jobs_on_node_changed
from scheduling.inventory.models import Node
from scheduling.realtime import events, groups


def node_revive(node: Node) -> None:
    """A lost node that speaks again is ready again: jobs of it requeued after its fence run elsewhere, and those
    it still runs (back before their fence) say so on their pages again."""
    if node.state == NodeState.LOST:
        node.state = NodeState.READY
        node.save(update_fields=["state"])
        events.publish_after_commit(
            groups.CLUSTER, {"type": "node.changed", "node": node.name, "state": node.state}
        )
        jobs_on_node_changed(node=node, code="node_responding")
        cycle_request_after_commit()


LAST_ERROR_CHARS = 500  # NodeSync.last_error


class NodeErrorKind:
    """What a node's last error is about, which decides what clears it."""

    REFUSED = "refused"  # a report refused: cleared by the next one of its kind accepted, or a new connection
    GPU_MISSING = "gpu_missing"  # cleared by a hello whose inventory has every GPU
    GPU_HEALTH = "gpu_health"  # cleared once every GPU of the node reports OK again
    MPS = "mps"  # cleared by a hello that says the agent has MPS's control binary


def node_error_note(*, node_id: int, message: str, kind: str) -> None:
    """Keep the node's newest problem (a refused report, MPS unavailable, a GPU gone bad): one row update, shown
    in the node's conditions (the API, `tessera nodes`, its tile and page) until its condition ends."""
    text = db_text(message)[:LAST_ERROR_CHARS]
    now = timezone.now()
    fields = {"last_error": text, "last_error_at": now, "last_error_kind": kind}
    if not NodeSync.objects.filter(node_id=node_id).update(**fields):
        NodeSync.objects.get_or_create(node_id=node_id, defaults=fields)


def node_error_clear(*, node_id: int, kinds: tuple[str, ...]) -> bool:
    """The condition behind the node's last error has ended: cleared, if it is of one of these kinds (a newer
    error of another kind stays). Whether one was cleared."""
    return bool(
        NodeSync.objects.filter(node_id=node_id, last_error_kind__in=kinds)
        .exclude(last_error="")
        .update(last_error="", last_error_at=None, last_error_kind="")
    )


def node_disconnected(*, node_id: int) -> None:
    NodeSync.objects.filter(node_id=node_id).update(disconnected_at=timezone.now())


def node_acked(*, node_id: int, version: int | None) -> None:
    if version is not None:
        NodeSync.objects.filter(node_id=node_id, acked_version__lt=version).update(acked_version=version)


def node_token_current(*, node_id: int, token_hash: str) -> bool:
    """Whether the token a connection authenticated with is still its node's (not rotated, the node not removed)."""
    return Node.objects.filter(pk=node_id, agent_token_hash=token_hash).exists()
