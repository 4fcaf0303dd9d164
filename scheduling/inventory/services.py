"""Writes for the inventory: node state (cordon, drain, lost) and agent tokens."""

from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from scheduling.choices import NodeState
from scheduling.cycle.requests import cycle_request_after_commit
from scheduling.errors import ServiceError
from scheduling.inventory.models import Node
from scheduling.realtime import events, groups


def _hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def node_issue_token(*, node: Node) -> str:
    """Give the node a new agent token (rotation); only its hash is kept. Returns the token, shown once."""
    token = f"tna_{secrets.token_urlsafe(32)}"
    node.agent_token_hash = _hash_token(token)
    node.agent_token_prefix = token[:12]
    node.save(update_fields=["agent_token_hash", "agent_token_prefix"])
    return token


def node_authenticate(*, token: str) -> Node | None:
    """The node this agent token belongs to, or None. A token is good for its own node only."""
    if not token:
        return None
    return Node.objects.filter(agent_token_hash=_hash_token(token)).first()


@transaction.atomic
def node_set_state(*, node: Node, state: str, actor: AbstractBaseUser | None, reason: str = "") -> Node:
    """Cordon (no new work), drain (no new work; running jobs finish), uncordon, or mark lost."""
    if state not in NodeState.values:
        raise ServiceError(f"Unknown node state {state!r}.", field="state")
    node.state = state
    node.save(update_fields=["state"])
    events.publish_after_commit(groups.CLUSTER, {"type": "node.changed", "node": node.name, "state": state})
    cycle_request_after_commit()
    return node
