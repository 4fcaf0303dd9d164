"""Pushes to browsers and agents. Every publish waits for the surrounding transaction to commit.

Groups: `cluster` (everyone's anonymous view), `team-<id>`, `job-<id>`, and `node-<name>` for agents.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)


def _send(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:  # a dead channel layer must never break a committed write
        log.warning("could not publish to %s", group, exc_info=True)


def publish_after_commit(group: str, message: dict[str, Any]) -> None:
    transaction.on_commit(lambda: _send(group, message))


def job_changed(*, job_id: int, team_id: int, state: str, code: str = "", message: str = "") -> None:
    payload = {"type": "job.changed", "job_id": job_id, "team_id": team_id, "state": state, "code": code}
    publish_after_commit(f"job-{job_id}", {**payload, "message": message})
    publish_after_commit(f"team-{team_id}", {**payload, "message": message})
    # The cluster group sees no names or messages, only that the queue moved.
    publish_after_commit("cluster", {"type": "queue.changed", "state": state})


def node_desired_state_changed(*, node_name: str) -> None:
    publish_after_commit(f"node-{node_name}", {"type": "desired.changed", "node": node_name})
