"""Heartbeats written together: every socket of this process hands its node's heartbeat here, and those that
arrived within HEARTBEAT_BATCH_S are recorded in one statement (reports.heartbeats.node_heartbeats_checked), each
socket then answering its own. At 1,000 nodes, 200 heartbeats a second were 200 transactions, a thread hop each: a
tenth of a core of the agents' web processes and most of their database threads' time (bench/cluster_scale.py).
A heartbeat waits at most HEARTBEAT_BATCH_S and one batch's write for its answer.
"""

from __future__ import annotations

from collections.abc import Awaitable

from scheduling.agents.reports import heartbeats
from scheduling.agents.reports.heartbeats import Beat, HeartbeatSeen
from scheduling.agents.socket.batches import Batches, PerLoop
from scheduling.agents.socket.db_threads import db

HEARTBEAT_BATCH_S = 0.05


def _write(beats: list[Beat]) -> Awaitable[list[HeartbeatSeen]]:
    # Looked up at each write (not bound once), so that a test may stand in for the database.
    return db(heartbeats.node_heartbeats_checked, pool="heartbeat")(beats=beats)


batches: PerLoop[Batches[Beat, HeartbeatSeen]] = PerLoop(
    lambda: Batches(_write, gather_s=HEARTBEAT_BATCH_S, name="heartbeats")
)


async def heartbeat_checked(beat: Beat) -> HeartbeatSeen:
    """Record a heartbeat with the others of this process (`node_heartbeat_checked`'s answer for it)."""
    (seen,) = await batches.get().submit([beat])
    return seen
