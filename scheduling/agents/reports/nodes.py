"""The node's own record as its agent's connection moves it: revived when a lost node speaks again, the desired
version it acknowledged, when it disconnected, and its newest error (shown in its conditions); and whether a
connection's token is still the node's."""

from __future__ import annotations

from django.utils import timezone

from scheduling.agents.reports.outcome import db_text
from scheduling.choices import NodeState
from scheduling.cycle.models import NodeSync
from scheduling.cycle.requests import cycle_request_after_commit
from scheduling.inventory.models import Node
from scheduling.realtime import events, groups


def node_revive(node: Node) -> None:
    """A lost node that speaks again is ready again; its old jobs were already requeued."""
    if node.state == NodeState.LOST:
        node.state = NodeState.READY
        node.save(update_fields=["state"])
        events.publish_after_commit(
            groups.CLUSTER, {"type": "node.changed", "node": node.name, "state": node.state}
        )
        cycle_request_after_commit()


LAST_ERROR_CHARS = 500  # NodeSync.last_error


def node_error_note(*, node_id: int, message: str) -> None:
    """Keep the node's newest problem (a refused report, MPS unavailable, a GPU gone bad): one row update, shown
    in the node's conditions (the API, `tessera nodes`, its tile and page)."""
    text = db_text(message)[:LAST_ERROR_CHARS]
    if not NodeSync.objects.filter(node_id=node_id).update(last_error=text, last_error_at=timezone.now()):
        NodeSync.objects.get_or_create(
            node_id=node_id, defaults={"last_error": text, "last_error_at": timezone.now()}
        )


def node_disconnected(*, node_id: int) -> None:
    NodeSync.objects.filter(node_id=node_id).update(disconnected_at=timezone.now())


def node_acked(*, node_id: int, version: int | None) -> None:
    if version is not None:
        NodeSync.objects.filter(node_id=node_id, acked_version__lt=version).update(acked_version=version)


def node_token_current(*, node_id: int, token_hash: str) -> bool:
    """Whether the token a connection authenticated with is still its node's (not rotated, the node not removed)."""
    return Node.objects.filter(pk=node_id, agent_token_hash=token_hash).exists()
