"""Browser websockets: bad frames close the socket with the code that says why (no server error), sockets are
capped per user and per session, and the Origin must be this site exactly."""

from __future__ import annotations

import json
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def _session(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def _headers(session: str | None, origin: str = "http://testserver", host: str = "testserver"):
    headers = [(b"origin", origin.encode()), (b"host", host.encode())]
    if session:
        headers.append((b"cookie", f"sessionid={session}".encode()))
    return headers


def _app():
    from portal.asgi import application

    return application


async def _connect(headers, path: str = "/ws/queue/"):
    communicator = WebsocketCommunicator(_app(), path, headers=headers)
    connected, code = await communicator.connect()
    return communicator, connected, code


@pytest.mark.parametrize(
    "frame, code",
    [
        ({"bytes_data": b"\x00\x01binary"}, 4003),
        ({"text_data": "{{{"}, 4007),
        ({"text_data": "[" * 3000 + "]" * 3000}, 4009),  # over the frame limit: refused unread
        ({"text_data": "[" * 1500 + "]" * 1500}, 4007),  # within it, but nests past what the parser reads
        ({"text_data": json.dumps({"type": "ping", "pad": "x" * 5000})}, 4009),
    ],
)
def test_a_bad_frame_closes_the_socket_with_the_code_that_says_why_and_frees_its_place(
    alice, node, frame, code, caplog, settings
):
    settings.TESSERA_MAX_SOCKETS_PER_SESSION = 1
    headers = _headers(_session(alice))

    async def scenario():
        communicator, connected, _ = await _connect(headers)
        assert connected
        assert (await communicator.receive_json_from())["type"] == "hello"
        await communicator.send_to(**frame)
        closed = await communicator.receive_output(timeout=3)
        assert closed == {"type": "websocket.close", "code": code}
        # The session's one place is free again as the server closes, before any disconnect reaches it.
        again, connected, _ = await _connect(headers)
        assert connected
        await again.disconnect()
        await communicator.disconnect()

    async_to_sync(scenario)()
    assert "Traceback" not in caplog.text


def test_a_ping_is_still_answered(alice, node):
    headers = _headers(_session(alice))

    async def scenario():
        communicator, connected, _ = await _connect(headers)
        assert connected
        await communicator.receive_json_from()
        await communicator.send_json_to({"type": "ping"})
        assert (await communicator.receive_json_from())["type"] == "pong"
        await communicator.disconnect()

    async_to_sync(scenario)()


@pytest.mark.parametrize(
    "origin",
    [
        "http://testserver:9999",
        "https://testserver",
        "http://evil.example",
        "null",
        "http://testserver.evil.example",
    ],
)
def test_a_socket_from_another_origin_is_refused_scheme_host_and_port(alice, node, origin):
    headers = _headers(_session(alice), origin=origin)

    async def scenario():
        communicator, connected, _ = await _connect(headers)
        assert not connected
        await communicator.disconnect()

    async_to_sync(scenario)()


def test_one_session_may_open_only_so_many_sockets_and_a_closed_one_frees_its_place(alice, node, settings):
    settings.TESSERA_MAX_SOCKETS_PER_SESSION = 3
    settings.TESSERA_MAX_SOCKETS_PER_USER = 5
    session = _session(alice)
    other_session = _session(alice)

    async def scenario():
        opened = []
        for _ in range(3):
            communicator, connected, _ = await _connect(_headers(session))
            assert connected
            opened.append(communicator)
        extra, connected, code = await _connect(_headers(session))
        assert not connected and code == 4429
        # Another session of the same user has its own room, up to the user's cap.
        more = []
        for _ in range(2):
            communicator, connected, _ = await _connect(_headers(other_session))
            assert connected
            more.append(communicator)
        over, connected, code = await _connect(_headers(other_session))
        assert not connected and code == 4429
        await opened[0].disconnect()
        again, connected, _ = await _connect(_headers(session))
        assert connected
        for communicator in [*opened[1:], *more, again]:
            await communicator.disconnect()

    async_to_sync(scenario)()


def test_a_socket_whose_server_died_stops_counting_once_its_record_is_stale(alice, node, settings):
    """Its server gone, a socket's record is never removed by a close: the caps count records renewed within
    SOCKET_STALE_S, and a live consumer renews its own every SOCKET_RENEW_S."""
    from scheduling.coordination import redis_client
    from scheduling.realtime import sockets

    settings.TESSERA_MAX_SOCKETS_PER_SESSION = 1
    session = _session(alice)
    dead = sockets.SocketKey(user_id=alice.pk, session_key=session, channel="specific.dead!1")
    assert sockets.socket_open(dead) is None
    live = sockets.SocketKey(user_id=alice.pk, session_key=session, channel="specific.live!1")
    assert sockets.socket_open(live) == "1 sockets open, at most 1"
    # As the dead server's record stands SOCKET_STALE_S later (renewal rewrites it; a dead server's never is).
    stale_at = time.time() - sockets.SOCKET_STALE_S - 1
    r = redis_client()
    for name, _ in dead.sets():
        if r is None:
            sockets._local[name][dead.channel] = stale_at
        else:
            r.zadd(name, {dead.channel: stale_at})
    assert sockets.socket_open(live) is None
    # A live one's renewal keeps it counted past the time it opened.
    sockets.socket_renewed(live)
    assert sockets.socket_open(dead) == "1 sockets open, at most 1"
    sockets.socket_closed(live)


def _sign_out_everywhere(user) -> None:
    from quotas.sign_out import user_sign_out_everywhere

    user.refresh_from_db()  # signed in since it was made
    assert user_sign_out_everywhere(user=user, why="test").sessions_ended == 1


def test_a_socket_closes_once_its_session_has_ended(alice, node, monkeypatch):
    """Signing out everywhere (or a password change) ends the session a socket was opened with: the socket's next
    check of its access (at most AUTHZ_TTL_S apart; here at once) closes it with 4401, before it sends anything."""
    from scheduling.realtime import streams

    monkeypatch.setattr(streams, "AUTHZ_TTL_S", 0.0)
    headers = _headers(_session(alice))

    async def scenario():
        communicator, connected, _ = await _connect(headers)
        assert connected
        assert (await communicator.receive_json_from())["type"] == "hello"
        await communicator.send_json_to({"type": "ping"})
        assert (await communicator.receive_json_from())["type"] == "pong"
        await sync_to_async(_sign_out_everywhere)(alice)
        await communicator.send_json_to({"type": "ping"})
        assert await communicator.receive_output(timeout=3) == {"type": "websocket.close", "code": 4401}
        await communicator.disconnect()

    async_to_sync(scenario)()
