"""The channel layer as an agent's connection uses it (`NodeChannel`): the node's group, through which the cycle
pushes its desired state, and the browsers' groups its samples go to.

Without the layer (Redis down) the agent is served all the same: its heartbeats go to the database, each is
acknowledged, and the desired state is recomputed on each, so an outage only slows pushes to one heartbeat. So
the layer's failures never end a connection: joining is tried again with each heartbeat, receiving waits and
tries again, and a sample not published is one that browsers miss.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from redis.exceptions import RedisError

from scheduling.realtime import groups

log = logging.getLogger(__name__)

# What the layer's backend raises while Redis is away or overloaded: redis-py's own errors (it wraps the
# socket's), the OS's (asyncio's TimeoutError is an OSError), and a full channel.
LAYER_ERRORS = (RedisError, OSError, ChannelFull)
RECEIVE_RETRY_MAX_S = 5.0


class NodeChannel:
    """This connection's channel on the layer, and its membership of the node's group."""

    def __init__(self, layer: Any, channel_name: str, *, node_name: str) -> None:
        self.layer = layer  # None: no channel layer configured (nothing is pushed; heartbeats resend instead)
        self.channel_name = channel_name
        self.group = groups.node(node_name)
        self.node_name = node_name
        self.joined = False

    @classmethod
    async def open(cls, *, node_name: str) -> NodeChannel:
        layer = get_channel_layer()
        channel_name = await layer.new_channel() if layer is not None else ""
        return cls(layer, channel_name, node_name=node_name)

    async def join(self) -> bool:
        """Join the node's group, through which changes are pushed at once; False while the layer is away."""
        if self.layer is None:
            return False
        try:
            await self.layer.group_add(self.group, self.channel_name)
        except LAYER_ERRORS as exc:
            log.warning(
                "node %s: channel layer unavailable (%s); serving it without pushes", self.node_name, exc
            )
            return False
        self.joined = True
        return True

    async def leave(self) -> None:
        if not self.joined:
            return
        try:
            await self.layer.group_discard(self.group, self.channel_name)
        except LAYER_ERRORS as exc:  # the group entry expires on its own
            log.warning("node %s: could not leave its group: %s", self.node_name, exc)

    async def next_message(self) -> dict[str, Any]:
        """The next message to this connection; while the layer is away, wait for it and try again."""
        if self.layer is None:
            await asyncio.Future()  # never: without a layer nothing is pushed
        delay_s = 0.5
        while True:
            try:
                return await self.layer.receive(self.channel_name)
            except LAYER_ERRORS as exc:
                if delay_s == 0.5:
                    log.warning(
                        "node %s: channel layer unavailable (%s); pushes wait for it", self.node_name, exc
                    )
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, RECEIVE_RETRY_MAX_S)

    async def publish(self, group: str, message: dict[str, Any]) -> None:
        """Send to a browsers' group; raises LAYER_ERRORS while the layer is away."""
        if self.layer is not None:
            await self.layer.group_send(group, message)
