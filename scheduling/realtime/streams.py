"""Browser websocket streams: /ws/cluster/, /ws/queue/ and /ws/jobs/<id>/, with the REST API's permissions.

Consumers only subscribe and authorize: they join the groups scheduling.realtime.events publishes to (`cluster`,
`team-<id>`, `job-<id>`), check access when a socket connects and again before forwarding each event, and send
nothing the REST API would not show the same user. Routes are wrapped in AllowedHostsOriginValidator (foreign
Origins are refused) and AuthMiddlewareStack (the session cookie); agents have their own route.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from asgiref.sync import sync_to_async
from autobahn.exception import Disconnected
from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.security.websocket import AllowedHostsOriginValidator, WebsocketDenier
from django.conf import settings
from django.contrib.auth import get_user_model
from django.urls import path

from quotas.models import Team
from quotas.selectors import team_ids_for_user
from scheduling.choices import JobState
from scheduling.jobs.selectors import job_in_teams, job_team_and_state
from scheduling.realtime import groups, listeners, parts, sockets

log = logging.getLogger(__name__)

# Membership is re-read at most this often per socket: revoking access takes effect within it.
AUTHZ_TTL_S = 5.0
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
# A bad frame's close codes are RFC 6455's (1003, 1007, 1009) moved into the private range, 4000 + the last three
# digits: a server may send only 1000 and 3000-4999 (daphne refuses the others with a traceback, and then neither
# closes the socket nor tells the consumer).
CLOSE_UNSUPPORTED = 4003  # a binary frame: streams speak JSON text
CLOSE_INVALID = 4007  # text that is not JSON (or nests too deep to read)
CLOSE_TOO_BIG = 4009
CLOSE_TOO_MANY = 4429  # the user (or session) has as many sockets open as it may
# What a browser sends is a ping or the list of parts its page shows: a small object. Anything larger is refused
# before it is parsed.
MAX_FRAME_CHARS = 4096


@dataclass(frozen=True)
class _Access:
    is_active: bool
    is_staff: bool
    team_ids: set[int] | None  # None: staff, all teams; empty for an inactive user


def _access_load(user_id: int) -> _Access:
    user = get_user_model().objects.only("is_active", "is_staff").get(pk=user_id)
    if not user.is_active:
        return _Access(False, user.is_staff, set())
    return _Access(True, user.is_staff, None if user.is_staff else team_ids_for_user(user=user))


class _SharedReads:
    """What this process last read for a key (when, what), and the read under way: the sockets of one user (or one
    session) ask the database once per AUTHZ_TTL_S between them, not once each. `limit`: past this many keys the
    values held are dropped (keys of sockets long closed), each read again when next asked."""

    def __init__(self, load: Callable[[Any], Any], *, limit: int = 10_000):
        self.load, self.limit = load, limit
        self.held: dict[Any, tuple[float, Any]] = {}
        self.reading: dict[Any, asyncio.Future] = {}

    async def __call__(self, key: Any) -> Any:
        held = self.held.get(key)
        if held is not None and time.monotonic() - held[0] <= AUTHZ_TTL_S:
            return held[1]
        reading = self.reading.get(key)
        if reading is None or reading.get_loop() is not asyncio.get_running_loop():
            reading = asyncio.ensure_future(database_sync_to_async(self.load)(key))
            self.reading[key] = reading
            reading.add_done_callback(
                lambda done: self.reading.pop(key, None) if self.reading.get(key) is done else None
            )
        started = time.monotonic()
        value = await asyncio.shield(reading)
        if len(self.held) >= self.limit:
            self.held.clear()
        self.held[key] = (started, value)
        return value


def _session_load(session_key: str) -> bool:
    return importlib.import_module(settings.SESSION_ENGINE).SessionStore().exists(session_key)


# A user's access; whether the session a socket was opened with still exists (signing out, signing out
# everywhere and a password change end it).
_access_of = _SharedReads(_access_load)
_session_alive = _SharedReads(_session_load)


class _StreamConsumer(AsyncJsonWebsocketConsumer):
    """Shared parts: refuse anonymous sockets, cache the user's team ids briefly, answer pings, push the page's
    parts (parts.py)."""

    groups_joined: list[str]

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        self.groups_joined = []
        self._watched: list[tuple[parts.Watch, Any]] = []  # each part shown and its key (URL, audience)
        self._watched_for: set[int] | None = None  # the team ids the keys were made with
        self._team_ids: set[int] | None = None
        self._team_ids_at = 0.0
        if self.user is None or not self.user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        session = self.scope.get("session")
        self._socket_key = sockets.SocketKey(
            user_id=self.user.pk,
            session_key=getattr(session, "session_key", None) or "",
            channel=self.channel_name,
        )
        refused = await sync_to_async(sockets.socket_open, thread_sensitive=False)(self._socket_key)
        if refused:
            self._socket_key = None
            log.warning("stream %s: refused a socket of user %s: %s", self.stream_name, self.user.pk, refused)
            await self.close(code=CLOSE_TOO_MANY)
            return
        groups = await self.groups_for_user()
        if groups is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined = groups
        await sync_to_async(listeners.listening_add, thread_sensitive=False)(
            groups=groups, channel=self.channel_name
        )
        self._counted = asyncio.ensure_future(self._keep_counted())
        await self.accept()
        await self.send_json({"type": "hello", "stream": self.stream_name, "user": self.user.get_username()})

    async def dispatch(self, message: dict[str, Any]) -> None:
        # A message type this stream has no handler for is dropped, never forwarded and never fatal.
        if self._handler_name(message) is None:
            return
        await super().dispatch(message)

    async def send(
        self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
    ) -> None:
        """A frame to the browser, unless the socket is closing or closed: a group message (GPU samples, a job's
        change) handled after a refused frame closed it, or after the browser left and before its disconnect is
        handled, is dropped, not an error of the server's."""
        if getattr(self, "_gone", False):
            return
        try:
            await super().send(text_data=text_data, bytes_data=bytes_data, close=close)
        except Disconnected:
            self._gone = True

    async def send_json(self, content: Any, close: bool = False) -> None:
        await self.send(text_data=await self.encode_json(content), close=close)

    def _handler_name(self, message: dict[str, Any]) -> str | None:
        kind = message.get("type", "")
        if kind.startswith("websocket."):
            return kind
        name = kind.replace(".", "_")
        return name if name and not name.startswith("_") and hasattr(self, name) else None

    async def disconnect(self, code: int) -> None:
        await self._leave()

    async def _leave(self) -> None:
        """Everything the socket held, given back: its parts, groups and its place under the caps. Run when the
        socket closes and before the server closes it (so a refused frame frees its place even if the close never
        comes back as a disconnect); a second run finds nothing left."""
        self._gone = True
        if (counted := getattr(self, "_counted", None)) is not None:
            counted.cancel()
            self._counted = None
        parts.hub.unsubscribe(channel=self.channel_name)
        joined, self.groups_joined = getattr(self, "groups_joined", []), []
        for group in joined:
            await self.channel_layer.group_discard(group, self.channel_name)
        if joined:
            await sync_to_async(listeners.listening_remove, thread_sensitive=False)(
                groups=joined, channel=self.channel_name
            )
        if getattr(self, "_socket_key", None) is not None:
            key, self._socket_key = self._socket_key, None
            await sync_to_async(sockets.socket_closed, thread_sensitive=False)(key)

    async def _keep_counted(self) -> None:
        """While the socket is open its record is renewed, so the caps count live sockets only: the record of a
        socket whose server died stops counting SOCKET_STALE_S after its last renewal."""
        while True:
            await asyncio.sleep(sockets.SOCKET_RENEW_S)
            if self._socket_key is not None:
                await sync_to_async(sockets.socket_renewed, thread_sensitive=False)(self._socket_key)

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        """A frame from the browser: a small JSON text, else the socket is closed with the WebSocket code that
        says why (and one log line), never a server error."""
        if bytes_data is not None:
            await self._refuse_frame(CLOSE_UNSUPPORTED, "a binary frame")
            return
        if text_data is None or len(text_data) > MAX_FRAME_CHARS:
            await self._refuse_frame(CLOSE_TOO_BIG, f"a frame over {MAX_FRAME_CHARS} characters")
            return
        try:
            content = json.loads(text_data)
        except (ValueError, RecursionError):
            await self._refuse_frame(CLOSE_INVALID, "a frame that is not JSON")
            return
        await self.receive_json(content)

    async def _refuse_frame(self, code: int, what: str) -> None:
        log.info(
            "stream %s: closed a socket of user %s on %s",
            self.stream_name,
            getattr(self.user, "pk", None),
            what,
        )
        await self._leave()
        await self.close(code=code)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # Clients only ping; any other message is checked against the user's current access first.
        if not await self.still_allowed():
            await self.close(code=CLOSE_FORBIDDEN)
            return
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})
        elif isinstance(content, dict) and content.get("type") == "watch":
            await self._watch(content)

    # --- the page's parts, pushed ----------------------------------------------------------------------------

    async def _watch(self, content: dict[str, Any]) -> None:
        """The parts the page shows: each one its view pushes to this user is followed (it is sent on its events,
        rendered once for every socket of the same audience); the page keeps asking for the others itself."""
        watches, refused = parts.watches_from(content)
        if refused:
            log.info("stream %s: refused a watch of user %s: %s", self.stream_name, self.user.pk, refused)
            return
        self._watched_for = await self.team_ids()
        host = _header(self.scope, b"host")
        keys = await database_sync_to_async(
            lambda: [parts.audience_of(watch=w, user=self.user, host=host) for w in watches]
        )()
        parts.hub.unsubscribe(channel=self.channel_name)
        self._watched = [(w, k) for w, k in zip(watches, keys, strict=True) if k is not None]
        for watch, key in self._watched:
            subscriber = parts.Subscriber(
                user=self.user, host=host, part_id=watch.part_id, send=self._send_part
            )
            parts.hub.subscribe(key=key, channel=self.channel_name, subscriber=subscriber)
        await self.send_json({"type": "watching", "parts": [w.part_id for w, _ in self._watched]})

    async def parts_changed(self, kind: str, event: dict[str, Any]) -> None:
        """An event this socket forwards: the parts it changes are rendered (once per event for all sockets)."""
        if not self._watched:
            return
        if (
            await self.team_ids() != self._watched_for
        ):  # the user's teams changed: whom the parts show changed
            await self._watch(
                {"parts": [{"id": w.part_id, "url": w.url, "on": sorted(w.on)} for w, _ in self._watched]}
            )
        for watch, key in self._watched:
            if kind in watch.on:
                parts.hub.changed(key=key, event_id=event.get("event_id"))

    async def _send_part(self, text: str) -> None:
        # A render ends after the page may have closed: nothing is sent on a socket that is gone.
        if not getattr(self, "_gone", False) and await self.still_allowed():
            await self.send(text_data=text)

    async def team_ids(self) -> set[int] | None:
        """The user's team ids (None: staff, all teams), re-read every AUTHZ_TTL_S (once for all of the user's
        sockets in this process: a hundred open pages ask the database once)."""
        if time.monotonic() - self._team_ids_at > AUTHZ_TTL_S:
            access = await _access_of(self.user.pk)
            self.user.is_active, self.user.is_staff = access.is_active, access.is_staff
            self._team_ids = access.team_ids
            self._team_ids_at = time.monotonic()
            session_key = self._socket_key.session_key if getattr(self, "_socket_key", None) else ""
            if session_key and not await _session_alive(session_key):
                # Signed out (or everywhere, or the password changed): the socket goes with its session.
                self.user.is_active = False
                await self._leave()
                await self.close(code=CLOSE_UNAUTHENTICATED)
        return self._team_ids

    def _load_team_ids(self) -> set[int] | None:
        access = _access_load(self.user.pk)
        self.user.is_active, self.user.is_staff = access.is_active, access.is_staff
        return access.team_ids

    async def still_allowed(self) -> bool:
        await self.team_ids()
        return self.user.is_active

    async def groups_for_user(self) -> list[str] | None:
        """The channel groups this user may follow on this stream, or None to refuse. Each stream defines it."""
        raise NotImplementedError

    stream_name = ""


class ClusterStream(_StreamConsumer):
    """Node and queue changes, anonymous for everyone (the same as GET /api/v1/cluster/)."""

    stream_name = "cluster"

    async def groups_for_user(self) -> list[str] | None:
        return [groups.CLUSTER]

    async def node_changed(self, event: dict[str, Any]) -> None:
        if await self.still_allowed():
            await self.send_json(
                {"type": "node.changed", "node": event.get("node"), "state": event.get("state")}
            )
            await self.parts_changed("node.changed", event)

    async def queue_changed(self, event: dict[str, Any]) -> None:
        if await self.still_allowed():
            await self.send_json({"type": "queue.changed", "state": event.get("state")})
            await self.parts_changed("queue.changed", event)

    async def gpu_metrics(self, event: dict[str, Any]) -> None:
        """Live per-GPU samples of a node (utilisation, memory used, power, temperature): no job or team."""
        if await self.still_allowed():
            await self.send_json({k: event.get(k) for k in ("type", "node", "at", "gpus")})

    async def gpu_health(self, event: dict[str, Any]) -> None:
        if await self.still_allowed():
            await self.send_json({k: event.get(k) for k in ("type", "node", "uuid", "health")})
            await self.parts_changed("gpu.health", event)

    async def job_changed(self, event: dict[str, Any]) -> None:
        return  # only team and job groups carry job details; never forward them here

    async def job_metrics(self, event: dict[str, Any]) -> None:
        return


class QueueStream(ClusterStream):
    """Anonymous queue movement for everyone, plus job changes of the user's own teams (staff: all teams)."""

    stream_name = "queue"

    async def groups_for_user(self) -> list[str] | None:
        team_ids = await database_sync_to_async(self._load_team_ids)()
        if team_ids is None:
            team_ids = set(
                await database_sync_to_async(lambda: list(Team.objects.values_list("pk", flat=True)))()
            )
        return [groups.CLUSTER, *(groups.team(team_id) for team_id in sorted(team_ids))]

    async def job_changed(self, event: dict[str, Any]) -> None:
        team_ids = await self.team_ids()
        if not self.user.is_active:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        if team_ids is not None and event.get("team_id") not in team_ids:
            return  # membership revoked since connect: drop silently, like a list that no longer shows it
        await self.send_json(_job_event(event))
        await self.parts_changed("job.changed", event)

    async def job_metrics(self, event: dict[str, Any]) -> None:
        team_ids = await self.team_ids()
        if self.user.is_active and (
            team_ids is None or await self._job_in_teams(event.get("job_id"), team_ids)
        ):
            await self.send_json(_metrics_event(event))

    async def _job_in_teams(self, job_id: Any, team_ids: set[int]) -> bool:
        return await database_sync_to_async(lambda: job_in_teams(job_id=int(job_id), team_ids=team_ids))()


class JobStream(_StreamConsumer):
    """One job's changes, for those who may see it (GET /api/v1/jobs/<id>/ would answer 200)."""

    stream_name = "job"

    async def groups_for_user(self) -> list[str] | None:
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        self.team_id = await database_sync_to_async(self._job_team_id)()
        if self.team_id is None or not await self._may_see():
            return None
        # The anonymous queue movement too: a pending job's reason and estimated start move with the queue.
        return [groups.job(self.job_id), groups.CLUSTER]

    def _job_team_id(self) -> int | None:
        row = job_team_and_state(job_id=self.job_id)
        self.job_state = row[1] if row else ""
        return row[0] if row else None

    async def _may_see(self) -> bool:
        team_ids = await self.team_ids()
        return self.user.is_active and (team_ids is None or self.team_id in team_ids)

    async def still_allowed(self) -> bool:
        return await self._may_see()

    async def job_changed(self, event: dict[str, Any]) -> None:
        if not await self._may_see():
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.job_state = event.get("state") or self.job_state
        await self.parts_changed("job.changed", event)  # its render starts first, beside the sends
        await self.send_json(_job_event(event))

    async def array_changed(self, event: dict[str, Any]) -> None:
        """A task of this array changed: its counts by state are on the page's live part."""
        if await self._may_see():
            await self.parts_changed("job.changed", event)

    async def job_metrics(self, event: dict[str, Any]) -> None:
        if await self._may_see():
            await self.send_json(_metrics_event(event))

    async def logs_appended(self, event: dict[str, Any]) -> None:
        if await self._may_see():
            await self.send_json(
                {"type": "logs.appended", "stream": event.get("stream"), "size": event.get("size")}
            )

    async def queue_changed(self, event: dict[str, Any]) -> None:
        if await self._may_see():
            await self.send_json({"type": "queue.changed", "state": event.get("state")})
            if self.job_state == JobState.PENDING:  # a waiting job's reason and start move with the queue
                await self.parts_changed("queue.changed", event)

    async def node_changed(self, event: dict[str, Any]) -> None:
        return  # the cluster group's other messages are not this stream's

    async def gpu_metrics(self, event: dict[str, Any]) -> None:
        return

    async def gpu_health(self, event: dict[str, Any]) -> None:
        return


def _job_event(event: dict[str, Any]) -> dict[str, Any]:
    keys = ("job_id", "team_id", "submitter_id", "state", "code", "message")
    return {"type": "job.changed", **{k: event.get(k) for k in keys}}


def _metrics_event(event: dict[str, Any]) -> dict[str, Any]:
    return {"type": "job.metrics", **{k: event.get(k) for k in ("job_id", "node", "at", "gpus")}}


class SameOriginValidator:
    """Refuses a browser socket unless its Origin is this site exactly, scheme, host and port (or one of
    CSRF_TRUSTED_ORIGINS): another page on the same host name, another port, or plain http for an https site
    may not open one with the user's cookies."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.app(scope, receive, send)


def _header(scope: dict, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return ""


def origin_allowed(scope: dict, origin: str | None = None) -> bool:
    """Whether `origin` (the request's Origin header unless given) is this site: a trusted origin, or the
    request's own scheme and host."""
    origin = (_header(scope, b"origin") if origin is None else origin).strip().rstrip("/")
    host = _header(scope, b"host").strip()
    if not origin or not host:
        return False
    if origin in {o.rstrip("/") for o in settings.CSRF_TRUSTED_ORIGINS}:
        return True
    secure = scope.get("scheme") in ("wss", "https") or bool(settings.SECURE_PROXY_SSL_HEADER)
    parts = urlsplit(origin)
    return (parts.scheme, parts.netloc.lower()) == ("https" if secure else "http", host.lower())


def browser_origin_checks(app: Any) -> Any:
    """A browser socket's Origin checks: one of ALLOWED_HOSTS, and the page's own site."""
    return SameOriginValidator(AllowedHostsOriginValidator(app))


def _browser(consumer: type[_StreamConsumer]) -> Any:
    return browser_origin_checks(AuthMiddlewareStack(consumer.as_asgi()))


websocket_urlpatterns = [
    path("ws/cluster/", _browser(ClusterStream)),
    path("ws/queue/", _browser(QueueStream)),
    path("ws/jobs/<int:job_id>/", _browser(JobStream)),
]
