"""The node agents' websocket (/ws/agent/): the connection itself (`AgentConsumer`), from the handshake to its
close. It authenticates the agent, reads each frame and hands it on without waiting for the database, and
forwards what the node's group receives (its desired state).

Agents send no cookies and no Origin, so this route has neither session auth nor an Origin check: the bearer
token alone says which node is speaking, and every report is checked against that node (the token again before
each write). Wire format: agent/protocol.py and docs/agent.md.

It is a plain ASGI websocket application (https://asgi.readthedocs.io/en/latest/specs/www.html#websocket),
which Channels' router serves as it does its own consumers, over the channel layer's public API. Channels'
consumer loop does two things wrong for this socket that no extension point of it changes: it ends the
connection when the channel layer fails (here agents are served while Redis is away: layer.py), and before
every message it hops to the one thread every consumer's database work shares, to close stale connections
(this socket's threads close their own: db_threads.py). At 1,000 nodes that hop was a thread switch for every
sample and heartbeat, a quarter of the socket's CPU (bench/agent_traffic.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from agent import protocol
from scheduling.agents.reports import nodes
from scheduling.agents.socket.db_threads import db
from scheduling.agents.socket.desired import DesiredStateOut
from scheduling.agents.socket.handlers import ReportHandlers
from scheduling.agents.socket.lanes import NodeLanes
from scheduling.agents.socket.layer import NodeChannel
from scheduling.agents.socket.link import CLOSE_UNAUTHENTICATED, CLOSE_WRONG_NODE, NodeLink
from scheduling.agents.socket.log_pulls import LogPulls
from scheduling.inventory.services import node_authenticate

log = logging.getLogger(__name__)

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def _header(scope: dict[str, Any], name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


def _bearer(scope: dict[str, Any]) -> str:
    scheme, _, token = _header(scope, b"authorization").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class AgentConsumer:
    """One agent's connection. Its parts, made once the token is good: the link (the connection as the others
    see it), its channel on the layer, the desired state it sends, its log pulls, the report handlers and the
    node's lanes."""

    @classmethod
    def as_asgi(cls) -> Callable[[dict[str, Any], Receive, Send], Awaitable[None]]:
        """The ASGI application for the route: a consumer per connection."""

        async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
            await cls(scope, send).serve(receive)

        return app

    def __init__(self, scope: dict[str, Any], send: Send) -> None:
        self.scope = scope
        self._asgi_send = send
        self.link: NodeLink | None = None

    async def serve(self, receive: Receive) -> None:
        """The ASGI websocket conversation: the handshake; once accepted, the agent's frames and the layer's
        messages, one at a time, until the agent disconnects."""
        event = await receive()
        while event["type"] != "websocket.disconnect":
            if event["type"] == "websocket.connect" and await self.connect():
                await self._accepted(receive)
                return
            event = await receive()

    async def _accepted(self, receive: Receive) -> None:
        sources: tuple[Receive, ...] = (receive, self.channel.next_message)
        waiting = [asyncio.ensure_future(source()) for source in sources]
        try:
            while True:
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for i, task in enumerate(waiting):
                    if not task.done():
                        continue
                    message = task.result()
                    if sources[i] is not receive:
                        await self.group_message(message)
                    elif message["type"] == "websocket.disconnect":
                        await self.disconnect(message.get("code", 1000))
                        return
                    elif message["type"] == "websocket.receive":
                        await self.receive(message.get("text"), message.get("bytes"))
                    waiting[i] = asyncio.ensure_future(sources[i]())
        finally:
            for task in waiting:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
            self.link.cancel_tasks()  # however the connection ended, its tasks end with it

    # -- the handshake and the close -------------------------------------------------------------------------
    async def connect(self) -> bool:
        node = await db(node_authenticate, pool="connect")(token=_bearer(self.scope))
        if node is None:
            await self._close(CLOSE_UNAUTHENTICATED)
            return False
        claimed = _header(self.scope, b"x-tessera-node")
        if claimed and claimed != node.name:
            log.warning("agent token of %s used to speak for %s: refused", node.name, claimed)
            await self._close(CLOSE_WRONG_NODE)
            return False
        self.link = link = NodeLink(
            node_id=node.pk,
            node_name=node.name,
            token_hash=node.agent_token_hash,
            send_text=self._send_text,
            close=self._close,
        )
        self.channel = await NodeChannel.open(node_name=node.name)
        self.desired = DesiredStateOut(link)
        self.pulls = LogPulls(link, self.desired)
        self.handlers = ReportHandlers(link, self.channel, self.desired, self.pulls)
        self.lanes = NodeLanes(link, self.handlers)
        await self.channel.join()
        await self._asgi_send({"type": "websocket.accept"})
        # The whole desired state follows the agent's hello (its first message), once the GPUs it names are
        # reconciled with the inventory: before that, a fresh node's GPU UUIDs may still be the registered ones.
        self.lanes.start()
        link.beside(self.pulls.forever(), "log pulls")
        return True

    async def disconnect(self, code: int) -> None:
        await self.lanes.drain()
        self.link.cancel_tasks()
        await self.channel.leave()
        await db(nodes.node_disconnected)(node_id=self.link.node_id)

    # -- frames ------------------------------------------------------------------------------------------------
    async def receive(self, text: str | None, data: bytes | None) -> None:
        """Read one frame. Nothing here waits for the database (but to note a sample's failure): heartbeats and
        reports go to the node's lanes, samples to their handler."""
        try:
            msg = protocol.decode(text if text is not None else data)
        except protocol.ProtocolError as exc:
            log.warning("node %s sent a malformed message: %s", self.link.node_name, exc)
            return
        if self.link.closing:
            return
        kind = msg["type"]
        if kind == "heartbeat":
            payload = msg["payload"]
            samples = payload.pop("samples", None)
            self.lanes.heartbeat(payload)
            if isinstance(samples, list):  # the samples since the last heartbeat (protocol FEATURES)
                await self.handlers.on_metrics({**msg, "type": "metrics", "payload": {"batch": samples}})
        elif kind == "metrics":
            await self.handlers.on_metrics(msg)
        else:
            await self.lanes.report(msg)

    async def group_message(self, message: dict[str, Any]) -> None:
        """A message to the node's group: the cycle's desired state, or a notice that it changed."""
        if message.get("type") == "desired.changed":
            await self.desired.notice(message)
        else:
            log.warning(
                "node %s: a group message of unknown type %r ignored",
                self.link.node_name,
                message.get("type"),
            )

    async def _send_text(self, text: str) -> None:
        await self._asgi_send({"type": "websocket.send", "text": text})

    async def _close(self, code: int) -> None:
        await self._asgi_send({"type": "websocket.close", "code": code})
