"""Transport to the portal: a websocket client with token auth and reconnect backoff, and an in-process
channel pair so tests (and embedded demos) run the same agent loop against a given message source.

Reconnecting is what keeps jobs alive through a portal outage: each job's supervisor stops it once the portal has
not acknowledged a heartbeat for the fence (agent/supervisor.py), so the time an agent stays away after the portal
is back comes straight off the outage the fence tolerates. The backoff is capped near the heartbeat interval, and
while the portal does not answer at all (connection refused, no handshake) the agent knocks once a second (a bare
TCP connect) and reconnects as soon as something accepts: back within about a second of the portal, however long
it was down. A portal that answers and refuses (a 503 while it starts, a bad token) gets the plain backoff."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
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


# How often an agent that cannot reach the portal knocks (a TCP connect), and how long one knock may take.
KNOCK_INTERVAL_S = 1.0
KNOCK_TIMEOUT_S = 1.0
# The reconnect backoff's cap: the heartbeat interval, within these bounds. A portal that comes back after a refusing
# outage sees its agents within about two knock intervals, each after a random part of one, not all in one instant.
BACKOFF_MIN_CAP_S = 1.0
BACKOFF_MAX_CAP_S = 30.0


class Backoff:
    """Exponential reconnect delays with jitter, reset after a session that got going."""

    def __init__(
        self, initial_s: float = 0.5, max_s: float = 5.0, factor: float = 2.0, jitter: float = 0.2
    ) -> None:
        self.initial_s, self.max_s, self.factor, self.jitter = initial_s, max_s, factor, jitter
        self._next = initial_s

    def next_delay(self) -> float:
        delay = self._next * random.uniform(1 - self.jitter, 1 + self.jitter)
        self._next = min(self._next * self.factor, self.max_s)
        return min(delay, self.max_s)

    def reset(self) -> None:
        self._next = self.initial_s

    @classmethod
    def for_heartbeat(cls, heartbeat_s: float) -> Backoff:
        """Capped at one heartbeat interval (within BACKOFF_MIN_CAP_S..BACKOFF_MAX_CAP_S)."""
        return cls(max_s=min(BACKOFF_MAX_CAP_S, max(BACKOFF_MIN_CAP_S, heartbeat_s)))


Connector = Callable[[], AbstractAsyncContextManager[Channel]]


class WebSocketConnector:
    """Opens a websocket session to the portal (the Connector run_agent takes), and knocks: whether anything
    accepts a TCP connection at the portal's address now."""

    def __init__(self, url: str, *, token: str, node_name: str) -> None:
        self.url, self.token, self.node_name = url, token, node_name
        parts = urlsplit(url)
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (443 if parts.scheme == "wss" else 80)

    def __call__(self) -> AbstractAsyncContextManager[Channel]:
        return connect_websocket(self.url, token=self.token, node_name=self.node_name)

    async def knock(self) -> bool:
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), timeout=KNOCK_TIMEOUT_S
            )
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True


async def _wait_to_reconnect(
    stop: asyncio.Event, delay_s: float, knock: Callable[[], Awaitable[bool]] | None
) -> bool:
    """Wait `delay_s` (or until stop is set); with `knock`, end the wait soon after a knock is answered: within a
    random part of a knock interval, so the agents of a portal that comes back do not all connect in the same
    instant. Whether a knock ended it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + delay_s
    while not stop.is_set():
        left = deadline - loop.time()
        if left <= 0:
            return False
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=min(left, KNOCK_INTERVAL_S) if knock else left)
        if knock is not None and not stop.is_set() and await knock():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=random.uniform(0, KNOCK_INTERVAL_S))
            return True
    return False


async def run_agent(
    agent: Agent,
    connect: Connector,
    *,
    stop: asyncio.Event,
    backoff: Backoff | None = None,
    healthy_after_s: float = 10.0,
) -> None:
    """Run the agent until stop is set: ticks all along, and sessions over `connect()` with reconnects. A connector
    with a `knock()` (WebSocketConnector) is knocked at while the portal does not answer, and the agent reconnects
    as soon as it does."""
    backoff = backoff or Backoff.for_heartbeat(agent.heartbeat_s)
    knock = getattr(connect, "knock", None)
    ticks = asyncio.create_task(agent.run_ticks(stop))
    away_since: float | None = None  # the first failed attempt of this spell away from the portal
    knocked = False  # the last wait ended on an answered knock
    try:
        while not stop.is_set():
            started = asyncio.get_running_loop().time()
            unanswered = False  # nothing at the portal's address answered: knock until something does
            failure = None
            try:
                async with connect() as channel:
                    if away_since is not None:
                        log.info("connected to the portal again after %.1f s", time.monotonic() - away_since)
                        away_since = None
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
                unanswered = True
                failure = f"cannot reach the portal: {exc}"
            except Exception as exc:  # noqa: BLE001 - websockets raises InvalidStatus/InvalidHandshake etc.
                failure = f"portal connection failed: {type(exc).__name__}: {exc}"
            if failure is not None:
                # Once a spell away, then quietly: an agent knocking each second must not flood its log.
                if away_since is None:
                    away_since = time.monotonic()
                    log.warning("%s; trying again until it answers", failure)
                else:
                    log.debug("%s", failure)
            if stop.is_set():
                break
            if asyncio.get_running_loop().time() - started >= healthy_after_s:
                backoff.reset()
            # A knock answered and then no session again (a proxy that accepts and resets): the plain backoff.
            knocked = await _wait_to_reconnect(
                stop, backoff.next_delay(), knock if unanswered and not knocked else None
            )
    finally:
        stop.set()
        await ticks
