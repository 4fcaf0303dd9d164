"""Pushes to browsers and agents. Every publish waits for the surrounding transaction to commit.

Groups: `cluster` (everyone's anonymous view), `team-<id>`, `job-<id>`, and `node-<name>` for agents.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction

from scheduling.realtime import groups, listeners

log = logging.getLogger(__name__)


class _Publisher:
    """Sends group messages from sync code through one long-lived event loop per process.

    `async_to_sync(layer.group_send)` builds a fresh loop, and with channels_redis a fresh Redis connection, for
    every message: several milliseconds of a request's time. A sender thread draining a queue in order keeps
    one connection pool instead. Pushes are best effort (the database is the truth): queued messages not yet
    sent when the process exits are lost, and clients catch up by re-reading.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue | None = None

    def _start(self) -> None:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            self._queue = asyncio.Queue()
            loop.create_task(self._drain())
            ready.set()
            loop.run_forever()

        threading.Thread(target=run, name="tessera-events", daemon=True).start()
        ready.wait(5)
        self._loop, self._pid = loop, os.getpid()

    async def _drain(self) -> None:
        assert self._queue is not None
        while True:
            layer, messages = await self._queue.get()
            await _send_in_order(layer, messages, listened=await _listened_now(messages))

    def send(self, layer: Any, messages: list[tuple[str, dict[str, Any]]]) -> None:
        """Queue (group, message) pairs, sent in this order; one wake-up of the sender thread for all."""
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked worker: the parent's thread is not here
                self._start()
        assert self._loop is not None and self._queue is not None
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (layer, messages))


async def _listened_now(messages: list[tuple[str, dict[str, Any]]]) -> set[str] | None:
    """The browser groups listened to as of now, read afresh once per batch that names one (a cycle's batch names
    thousands of queued jobs' groups, most with no one on them); None: unknown, send to all."""
    if not any(groups.for_browsers(group) for group, _ in messages):
        return None
    listeners.forget()
    return await listeners.listened()


_publisher = _Publisher()


def _send(group: str, message: dict[str, Any]) -> None:
    _send_all([(group, message)])


def _send_all(messages: list[tuple[str, dict[str, Any]]]) -> None:
    for group, message in messages:
        # One id per change, the same in every browser group it goes to: a part shown on many pages is rendered
        # once for it (realtime/parts.py).
        # (Not setdefault, which would draw an id for every message, those that have one too.)
        if "event_id" not in message and groups.for_browsers(group):
            message["event_id"] = secrets.token_hex(8)
    layer = get_channel_layer()
    if layer is None:
        return
    if not isinstance(layer, InMemoryChannelLayer):
        _publisher.send(layer, messages)
        return
    # The in-memory layer lives in the caller's event loop (embedded mode, tests): send from there, the batch in
    # one call (one async_to_sync per message was a thread each: 20 s for a cycle's 40,000 messages).
    async_to_sync(_send_in_order)(layer, messages)


async def _send_in_order(
    layer: Any, messages: list[tuple[str, dict[str, Any]]], *, listened: set[str] | None = None
) -> None:
    """Send (group, message) pairs in order; with `listened`, browser groups outside it are skipped."""
    for group, message in messages:
        if listened is not None and groups.for_browsers(group) and group not in listened:
            continue  # no browser in it: a send would cost a round trip for no one
        try:
            await layer.group_send(group, message)
        except Exception:  # a dead channel layer must never break a committed write
            log.warning("could not publish to %s", group, exc_info=True)


def publish_after_commit(group: str, message: dict[str, Any]) -> None:
    transaction.on_commit(lambda: _send(group, message))


def _job_messages(
    job_id: int,
    team_id: int,
    submitter_id: int | None,
    state: str,
    code: str,
    message: str,
    array_id: int | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    payload = {
        "type": "job.changed",
        "job_id": job_id,
        "team_id": team_id,
        "submitter_id": submitter_id,
        "state": state,
        "code": code,
        "message": message,
        "event_id": secrets.token_hex(8),
    }
    messages = [(groups.job(job_id), payload), (groups.team(team_id), dict(payload))]
    if array_id is not None and array_id != job_id:
        # A task of an array: the array's page counts its tasks by state (its own state is not this one's).
        array = {
            "type": "array.changed",
            "job_id": array_id,
            "task_id": job_id,
            "event_id": payload["event_id"],
        }
        messages.append((groups.job(array_id), array))
    return messages


def job_changed(
    *,
    job_id: int,
    team_id: int,
    state: str,
    code: str = "",
    message: str = "",
    submitter_id: int | None = None,
    array_id: int | None = None,
) -> None:
    job_messages = _job_messages(job_id, team_id, submitter_id, state, code, message, array_id)
    messages = [
        *job_messages,
        # The cluster group sees no names or messages, only that the queue moved: the same change, the same id.
        (
            groups.CLUSTER,
            {"type": "queue.changed", "state": state, "event_id": job_messages[0][1]["event_id"]},
        ),
    ]
    # One commit hook for the three: they are sent together, in this order, or (rolled back) not at all.
    transaction.on_commit(lambda: _send_all(messages))


def jobs_changed(*, changes: list[tuple[int, int, int | None, str, str, str]]) -> None:
    """job_changed for many jobs at once, (job id, team id, submitter id, state, code, message[, array id]) each:
    one commit hook, and the cluster group told once per state rather than once per job."""
    if not changes:
        return
    messages = [m for change in changes for m in _job_messages(*change)]
    messages += [
        (groups.CLUSTER, {"type": "queue.changed", "state": s}) for s in sorted({c[3] for c in changes})
    ]
    transaction.on_commit(lambda: _send_all(messages))


def node_desired_state_changed(*, node_name: str, state: dict[str, Any] | None = None) -> None:
    """Tell the node's agent socket its desired state moved; with `state` (version, jobs, the jobs' team ids),
    what it moved to, so the socket need not read it back."""
    message: dict[str, Any] = {"type": "desired.changed", "node": node_name}
    if state is not None:
        message["state"] = state
    publish_after_commit(groups.node(node_name), message)
