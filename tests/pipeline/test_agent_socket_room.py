"""The agents' socket overrides nothing of Channels, and a channel layer that fails ends no agent's connection."""

from __future__ import annotations

import ast
import asyncio
import pathlib

import pytest
from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer
from channels.testing import WebsocketCommunicator
from redis.exceptions import ConnectionError as RedisConnectionError

from agent import protocol
from scheduling.agents import socket as room
from scheduling.agents.socket import db_threads
from scheduling.agents.socket.transport import AgentConsumer

# What the socket may take from Channels: the channel layer's API and the database wrapper, all public.
CHANNELS_PUBLIC = {
    "channels.layers": {"get_channel_layer"},
    "channels.exceptions": {"ChannelFull"},
    "channels.db": {"database_sync_to_async"},
}


def test_the_agents_socket_takes_only_the_channel_layers_public_api_from_channels():
    for path in sorted(pathlib.Path(room.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "channels":
                names = {alias.name for alias in node.names}
                allowed = CHANNELS_PUBLIC.get(node.module, set())
                assert names <= allowed, f"{path.name} imports {sorted(names - allowed)} from {node.module}"
            elif isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] != "channels" for a in node.names), path.name


def test_the_agents_consumer_is_an_asgi_app_of_its_own_not_a_channels_consumer():
    from channels.consumer import AsyncConsumer

    assert not issubclass(AgentConsumer, AsyncConsumer)


class LayerAway(InMemoryChannelLayer):
    """A channel layer whose Redis is away: every call fails as channels_redis's does."""

    async def receive(self, channel):
        await asyncio.sleep(0.01)
        raise RedisConnectionError("Connection refused")

    async def group_add(self, group, channel):
        raise RedisConnectionError("Connection refused")

    async def group_send(self, group, message):
        raise RedisConnectionError("Connection refused")


@pytest.mark.django_db(transaction=True)
def test_an_agent_is_served_while_the_channel_layer_is_away(node, settings):
    from scheduling.inventory.services import node_issue_token

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": f"{__name__}.LayerAway"}}
    token = node_issue_token(node=node)
    hello = protocol.message("hello", {"node": node.name})
    beat = protocol.message("heartbeat", {"node": node.name, "seq": 4, "running": []})
    sample = protocol.message("metrics", {"sampled_at": 1.0, "gpus": [{"index": 0, "uuid": "GPU-test-0"}]})

    async def scenario():
        from portal.asgi import application

        headers = [(b"authorization", f"Bearer {token}".encode()), (b"x-tessera-node", node.name.encode())]
        communicator = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
        connected, _ = await communicator.connect()
        assert connected
        seen: dict[str, dict] = {}
        async with asyncio.timeout(15):
            for msg in (hello, sample, beat):
                await communicator.send_to(text_data=protocol.encode(msg))
            while not {"ack", "desired_state", "heartbeat_ack"} <= seen.keys():
                got = protocol.decode(await communicator.receive_from(timeout=15))
                seen.setdefault(got["type"], got)
        await communicator.disconnect()
        return seen

    try:
        seen = async_to_sync(scenario)()
    finally:
        db_threads.db_pool_shutdown()
    assert seen["ack"]["payload"] == {
        "ack_id": hello["id"],
        "ok": True,
        "error": None,
        "features": list(protocol.FEATURES),
    }
    assert seen["heartbeat_ack"]["payload"]["seq"] == 4
