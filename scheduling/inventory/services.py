"""Writes for the inventory: node state (cordon, drain, lost) and agent tokens."""

from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from scheduling.choices import NodeState
from scheduling.cycle.requests import cycle_request_after_commit
from scheduling.errors import ServiceError
from scheduling.inventory.models import Node, NodeStateChange
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


# What a person may set a node to; `lost` is the watchdog's to decide (and the agent's hello to undo).
SETTABLE_NODE_STATES = (NodeState.READY, NodeState.CORDONED, NodeState.DRAINING)
NODE_STATE_REASON_MAX = NodeStateChange._meta.get_field("reason").max_length


@transaction.atomic
def node_set_state(*, node: Node, state: str, actor: AbstractBaseUser | None, reason: str) -> Node:
    """Cordon (place no new work there; what runs, runs on), drain (the same, said as "emptying it": it still
    counts as capacity), or uncordon (ready). Records who did it and why (a reason is required) in the node's
    audit trail. Setting the state it already has records nothing and publishes nothing."""
    if state not in SETTABLE_NODE_STATES:
        allowed = ", ".join(SETTABLE_NODE_STATES)
        raise ServiceError(f"Unknown node state {state!r}: use one of {allowed}.", field="state")
    reason = (reason or "").strip()
    if not reason:
        raise ServiceError("Say why (the node's audit trail keeps it).", field="reason")
    if len(reason) > NODE_STATE_REASON_MAX:
        raise ServiceError(f"A reason has at most {NODE_STATE_REASON_MAX} characters.", field="reason")
    locked = Node.objects.select_for_update().get(pk=node.pk)
    if locked.state == state:
        node.state = state
        return node
    NodeStateChange.objects.create(
        node=locked, actor=actor, from_state=locked.state, to_state=state, reason=reason
    )
    locked.state = state
    locked.save(update_fields=["state"])
    node.state = state
    events.publish_after_commit(groups.CLUSTER, {"type": "node.changed", "node": node.name, "state": state})
    cycle_request_after_commit()
    return node
