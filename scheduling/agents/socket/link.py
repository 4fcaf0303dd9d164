"""The node's connection as the parts below the transport see it (`NodeLink`): which node it speaks for, frames
out, refusing the agent, and the connection's own tasks, which end with it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from agent import protocol

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401  # no token, an unknown one, or one rotated since the connection opened
CLOSE_WRONG_NODE = 4403  # the token of one node speaking for another


async def logged(work: Awaitable[Any], what: str, node_name: str) -> None:
    """Await `work`, which nobody else awaits (a lane's next turn, work started beside the frames' path); a
    failure is logged, and the next turn (the next heartbeat, the next pull) tries again."""
    try:
        await work
    # A boundary: the task it runs in (a lane, a pull loop) must outlive any one failure, or the node's
    # heartbeats, reports or logs would go unheard while its connection stays up.
    except Exception:
        log.warning("node %s: %s failed", node_name, what, exc_info=True)


class NodeLink:
    """One agent's connection, authenticated: its node and token, the frames it sends out, and the tasks it runs
    beside the frames' path (cancelled when it closes)."""

    def __init__(
        self,
        *,
        node_id: int,
        node_name: str,
        token_hash: str,
        send_text: Callable[[str], Awaitable[None]],
        close: Callable[[int], Awaitable[None]],
    ) -> None:
        self.node_id = node_id
        self.node_name = node_name
        self.token_hash = (
            token_hash  # the token it authenticated with: every write re-checks it is still the node's
        )
        self._send_text = send_text
        self._close = close
        self.closing = (
            False  # refused (a rotated token, another node's name) or closed: nothing more is handled
        )
        self._tasks: set[asyncio.Future] = set()
        self._single: dict[str, asyncio.Future] = {}

    async def send_msg(self, msg: dict[str, Any]) -> bool:
        """Send one message; False when its frame is over the limit (the agent would drop the connection, and
        with it every report and log of the node): it is not sent, and the portal's log says so."""
        try:
            text = protocol.encode(msg)
        except protocol.FrameTooLarge as exc:
            log.error("node %s: not sending %s %s: %s", self.node_name, msg["type"], msg["id"], exc)
            return False
        await self._send_text(text)
        return True

    async def refuse(self, code: int) -> None:
        """Close the connection with `code`; nothing it sends afterwards is handled."""
        if not self.closing:
            self.closing = True
            await self._close(code)

    def beside(self, work: Awaitable[Any], what: str) -> asyncio.Future:
        """Run `work` as a task of this connection's own (cancelled when it closes); a failure is logged."""
        task = asyncio.ensure_future(logged(work, what, self.node_name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def beside_once(self, name: str, start: Callable[[], Awaitable[Any]], what: str) -> None:
        """As `beside`, unless the work called `name` started before is still under way (then nothing starts)."""
        running = self._single.get(name)
        if running is None or running.done():
            self._single[name] = self.beside(start(), what)

    def cancel_tasks(self) -> None:
        """The connection has closed: its tasks end with it."""
        self.closing = True
        for task in list(self._tasks):
            task.cancel()
