"""Browser websocket streams: the REST API's permissions on connect and on every event, foreign Origins refused."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from scheduling.jobs.fields import JobSpec
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_cancel

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def _headers(user, origin: str = "http://testserver") -> list[tuple[bytes, bytes]]:
    headers = [(b"origin", origin.encode()), (b"host", b"testserver")]
    if user is not None:
        client = Client()
        client.force_login(user)
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    return headers


def _app():
    from portal.asgi import application

    return application


async def _open(path: str, headers: list[tuple[bytes, bytes]]) -> tuple[WebsocketCommunicator, bool]:
    communicator = WebsocketCommunicator(_app(), path, headers=headers)
    connected, _ = await communicator.connect()
    return communicator, connected


def _submit(user, team, **spec):

    spec = {"name": "job", "command": "run", "gpus": 1, **spec}
    return job_submit(submitter=user, team=team, spec=JobSpec(**spec))


def test_an_anonymous_socket_is_refused(node):
    headers = _headers(None)

    async def scenario():
        communicator, connected = await _open("/ws/cluster/", headers)
        assert not connected
        await communicator.disconnect()

    async_to_sync(scenario)()


def test_a_socket_from_a_foreign_origin_is_refused(alice, node):
    headers = _headers(alice, "https://evil.example")

    async def scenario():
        communicator, connected = await _open("/ws/queue/", headers)
        assert not connected
        await communicator.disconnect()

    async_to_sync(scenario)()


def test_another_teams_job_stream_is_refused_and_my_job_stream_gets_its_changes(alice, bob, teams, node):
    bobs = _submit(bob, teams["inference"])
    mine = _submit(alice, teams["training"])
    headers = _headers(alice)

    async def scenario():
        refused, connected = await _open(f"/ws/jobs/{bobs.pk}/", headers)
        assert not connected
        await refused.disconnect()

        communicator, connected = await _open(f"/ws/jobs/{mine.pk}/", headers)
        assert connected
        assert (await communicator.receive_json_from())["type"] == "hello"

        await sync_to_async(job_cancel)(job=mine, actor=alice)
        event = await communicator.receive_json_from(timeout=3)
        assert (event["type"], event["job_id"], event["state"]) == ("job.changed", mine.pk, "cancelled")
        await communicator.disconnect()

    async_to_sync(scenario)()


def test_the_queue_stream_carries_my_teams_jobs_and_only_anonymous_movement_of_others(
    alice, bob, teams, node
):
    headers = _headers(alice)

    async def scenario():
        communicator, connected = await _open("/ws/queue/", headers)
        assert connected
        await communicator.receive_json_from()  # hello
        await sync_to_async(_submit)(bob, teams["inference"], name="bob-secret")
        await sync_to_async(_submit)(alice, teams["training"], name="alice-job")
        received = []
        for _ in range(3):
            received.append(await communicator.receive_json_from(timeout=3))
        assert await communicator.receive_nothing(timeout=0.2)
        assert "bob-secret" not in str(received)
        job_events = [m for m in received if m["type"] == "job.changed"]
        assert [m["team_id"] for m in job_events] == [teams["training"].pk]
        assert sorted(m["type"] for m in received) == ["job.changed", "queue.changed", "queue.changed"]
        await communicator.disconnect()

    async_to_sync(scenario)()


def test_a_job_stream_closes_when_the_user_loses_access(alice, teams, node, monkeypatch):
    from quotas.models import Membership
    from scheduling.realtime import streams

    monkeypatch.setattr(streams, "AUTHZ_TTL_S", 0.0)
    mine = _submit(alice, teams["training"])
    headers = _headers(alice)

    async def scenario():
        communicator, connected = await _open(f"/ws/jobs/{mine.pk}/", headers)
        assert connected
        await communicator.receive_json_from()  # hello
        await sync_to_async(lambda: Membership.objects.filter(user=alice).delete())()
        await communicator.send_json_to({"type": "ping"})
        output = await communicator.receive_output(timeout=3)
        assert output["type"] == "websocket.close"
        assert output["code"] == streams.CLOSE_FORBIDDEN
        await asyncio.sleep(0)

    async_to_sync(scenario)()


def test_the_cluster_stream_forwards_live_gpu_metrics_and_drops_unknown_messages(alice, node):
    from channels.layers import get_channel_layer

    headers = _headers(alice)

    async def scenario():
        communicator, connected = await _open("/ws/cluster/", headers)
        assert connected
        await communicator.receive_json_from()  # hello
        layer = get_channel_layer()
        await layer.group_send("cluster", {"type": "something.new", "secret": "x"})
        await layer.group_send(
            "cluster",
            {"type": "gpu.metrics", "node": "a100-01", "at": 1.0, "gpus": [{"index": 0, "util_pct": 93}]},
        )
        message = await communicator.receive_json_from(timeout=3)
        assert message == {
            "type": "gpu.metrics",
            "node": "a100-01",
            "at": 1.0,
            "gpus": [{"index": 0, "util_pct": 93}],
        }
        await communicator.send_json_to({"type": "ping"})
        assert (await communicator.receive_json_from(timeout=3)) == {"type": "pong"}
        await communicator.disconnect()

    async_to_sync(scenario)()


@pytest.mark.skipif(not __import__("os").environ.get("REDIS_URL"), reason="needs REDIS_URL (a Redis server)")
def test_events_reach_a_redis_channel_layer_through_the_publisher_thread(settings):
    import os

    from channels.layers import get_channel_layer

    from scheduling.realtime import events

    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [os.environ["REDIS_URL"]]},
        }
    }
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)("api-test-publisher", channel)
    try:
        for i in range(3):
            events._send("api-test-publisher", {"type": "queue.changed", "n": i})
        received = [async_to_sync(asyncio.wait_for)(layer.receive(channel), 5) for _ in range(3)]
        assert [m["n"] for m in received] == [0, 1, 2]
    finally:
        async_to_sync(layer.group_discard)("api-test-publisher", channel)


def test_a_batch_of_events_reaches_the_in_memory_layer_in_order_through_one_call(monkeypatch):
    """Embedded mode (no Redis): a cycle's thousands of messages go in one call into the layer's loop, in their
    order; one async_to_sync per message was a thread each (20 s for a 20,000-job cycle's events)."""
    from channels.layers import get_channel_layer

    from scheduling.realtime import events

    calls = []
    real = events.async_to_sync

    def counted(fn):
        calls.append(fn)
        return real(fn)

    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)("api-test-batch", channel)
    monkeypatch.setattr(events, "async_to_sync", counted)
    messages = [("api-test-batch", {"type": "queue.changed", "n": i}) for i in range(50)]
    messages.insert(25, ("api-test-nobody", {"type": "queue.changed", "n": -1}))  # a group no one is in
    events._send_all(messages)
    assert len(calls) == 1
    received = [async_to_sync(asyncio.wait_for)(layer.receive(channel), 5) for _ in range(50)]
    assert [m["n"] for m in received] == list(range(50))
