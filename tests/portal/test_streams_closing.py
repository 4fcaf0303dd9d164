"""A stream's socket that is closing or closed takes no more frames: a group message (GPU samples, a job's change)
handled after a refused frame closed the socket, or after the browser left and before its disconnect is handled,
is dropped rather than raised in daphne as 'Attempt to send on a closed protocol'."""

from __future__ import annotations

import asyncio

from autobahn.exception import Disconnected

from scheduling.realtime.streams import ClusterStream

SAMPLE = {"type": "gpu.metrics", "node": "a100-01", "at": 1.0, "gpus": []}


def _stream(base_send) -> ClusterStream:
    """A cluster stream whose user may see the cluster (the access check is the streams' own tests')."""

    async def allowed() -> bool:
        return True

    stream = ClusterStream()
    stream.base_send = base_send
    stream.still_allowed = allowed
    return stream


def test_a_closed_socket_takes_no_more_frames():
    sent: list[dict] = []

    async def record(message):
        sent.append(message)

    stream = _stream(record)
    asyncio.run(stream.gpu_metrics(SAMPLE))
    assert [m["type"] for m in sent] == ["websocket.send"]  # open: the sample goes out
    stream._gone = True  # a refused frame closed it (_leave)
    asyncio.run(stream.gpu_metrics(SAMPLE))
    asyncio.run(stream.send_json({"type": "pong"}))
    assert len(sent) == 1


def test_a_socket_the_browser_closed_meanwhile_is_marked_gone_not_raised():
    calls = []

    async def closed(message):
        calls.append(message)
        raise Disconnected("Attempt to send on a closed protocol")

    stream = _stream(closed)
    asyncio.run(stream.gpu_metrics(SAMPLE))  # raised nothing
    asyncio.run(stream.gpu_metrics(SAMPLE))
    assert len(calls) == 1 and stream._gone
