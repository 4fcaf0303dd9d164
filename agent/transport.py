"""Transport to the portal: a websocket client with token auth and reconnect backoff, and an in-process
channel pair so tests (and embedded demos) run the same agent loop against a given message source."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

from agent import protocol
from agent.runtime import Agent, Channel, ChannelClosed

log = logging.getLogger("tessera.agent.transport")
AGENT_PATH = "/ws/agent/"


def ws_url(portal_url: str) -> str:
    """http(s)://host[:port][/prefix] -> ws(s)://host[:port][/prefix]/ws/agent/ (ws(s) URLs kept)."""
    parts = urlsplit(portal_url)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ValueError(f"portal URL must be http(s):// or ws(s)://host, not {portal_url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith(AGENT_PATH.rstrip("/")):
        path += AGENT_PATH.rstrip("/")
    return urlunsplit((scheme, parts.netloc, path + "/", "", ""))


def auth_headers(token: str, node_name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "X-Tessera-Node": node_name}


class WebSocketChannel:
    def __init__(self, ws) -> None:  # a websockets.asyncio.client.ClientConnection
        self.ws = ws

    async def send(self, text: str) -> None:
        import websockets

        try:
            await self.ws.send(text)
        except websockets.ConnectionClosed as exc:
            raise ChannelClosed(str(exc)) from exc

    async def recv(self) -> str:
        import websockets

        try:
            data = await self.ws.recv()
        except websockets.ConnectionClosed as exc:
            raise ChannelClosed(str(exc)) from exc
        return data if isinstance(data, str) else data.decode()


@asynccontextmanager
async def connect_websocket(
    url: str, *, token: str, node_name: str, open_timeout_s: float = 10.0
) -> AsyncIterator[WebSocketChannel]:
    from websockets.asyncio.client import connect

    async with connect(
        url,
        additional_headers=auth_headers(token, node_name),
        open_timeout=open_timeout_s,
        ping_interval=20,
        ping_timeout=20,
        max_size=protocol.MAX_FRAME_BYTES,
    ) as ws:
        yield WebSocketChannel(ws)


class QueueChannel:
    """One end of an in-process channel pair: what one end sends, the other receives."""

    _CLOSED = object()

    def __init__(self, inbox: asyncio.Queue, outbox: asyncio.Queue) -> None:
        self._inbox, self._outbox = inbox, outbox
        self.closed = False

    @classmethod
    def pair(cls) -> tuple[QueueChannel, QueueChannel]:
        a, b = asyncio.Queue(), asyncio.Queue()
        return cls(a, b), cls(b, a)

    async def send(self, text: str) -> None:
        if self.closed:
            raise ChannelClosed("closed")
        await self._outbox.put(text)

    async def recv(self) -> str:
        if self.closed:
            raise ChannelClosed("closed")
        item = await self._inbox.get()
        if item is self._CLOSED:
            self.closed = True
            raise ChannelClosed("closed by peer")
        return item

    def close(self) -> None:
        """Close both directions (the peer's recv raises ChannelClosed)."""
        if not self.closed:
            self.closed = True
            self._outbox.put_nowait(self._CLOSED)
            self._inbox.put_nowait(self._CLOSED)


class Backoff:
    """Exponential reconnect delays with jitter, reset after a session that got going."""

    def __init__(
        self, initial_s: float = 0.5, max_s: float = 30.0, factor: float = 2.0, jitter: float = 0.2
    ) -> None:
        self.initial_s, self.max_s, self.factor, self.jitter = initial_s, max_s, factor, jitter
        self._next = initial_s

    def next_delay(self) -> float:
        delay = self._next * random.uniform(1 - self.jitter, 1 + self.jitter)
        self._next = min(self._next * self.factor, self.max_s)
        return min(delay, self.max_s)

    def reset(self) -> None:
        self._next = self.initial_s


Connector = Callable[[], AbstractAsyncContextManager[Channel]]


async def run_agent(
    agent: Agent,
    connect: Connector,
    *,
    stop: asyncio.Event,
    backoff: Backoff | None = None,
    healthy_after_s: float = 10.0,
) -> None:
    """Run the agent until stop is set: ticks all along, and sessions over `connect()` with reconnects."""
    backoff = backoff or Backoff()
    ticks = asyncio.create_task(agent.run_ticks(stop))
    try:
        while not stop.is_set():
            started = asyncio.get_running_loop().time()
            try:
                async with connect() as channel:
                    session = asyncio.create_task(agent.run_session(channel))
                    stopper = asyncio.create_task(stop.wait())
                    await asyncio.wait({session, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    stopper.cancel()
                    if not session.done():
                        session.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await session
            except ChannelClosed as exc:
                log.info("portal connection closed: %s", exc)
            except (TimeoutError, OSError) as exc:
                log.warning("cannot reach the portal: %s", exc)
            except Exception as exc:  # noqa: BLE001 - websockets raises InvalidStatus/InvalidHandshake etc.
                log.warning("portal connection failed: %s: %s", type(exc).__name__, exc)
            if stop.is_set():
                break
            if asyncio.get_running_loop().time() - started >= healthy_after_s:
                backoff.reset()
            delay = backoff.next_delay()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
    finally:
        stop.set()
        await ticks
