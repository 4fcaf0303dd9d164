"""Heartbeats written together: every socket of this process hands its node's heartbeat here, and they are
recorded in one statement every HEARTBEAT_BATCH_S (reports.heartbeats.node_heartbeats_checked), each socket then
answering its own. At 1,000 nodes, 200 heartbeats a second were 200 transactions, a thread hop each: a tenth of
a core of the agents' web processes and most of their database threads' time (bench/cluster_scale.py).

While one batch is being written the next gathers, so a slow database makes batches larger, never a queue of
statements; a heartbeat waits at most one batch's write and HEARTBEAT_BATCH_S more for its answer.
"""

from __future__ import annotations

import asyncio

from scheduling.agents.reports import heartbeats
from scheduling.agents.reports.heartbeats import Beat, HeartbeatSeen
from scheduling.agents.socket.db_threads import db

HEARTBEAT_BATCH_S = 0.05


class _Batches:
    def __init__(self) -> None:
        self.waiting: list[tuple[Beat, asyncio.Future]] = []
        self.task: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def add(self, beat: Beat) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        # A writer of another (ended) event loop never runs again: this loop's takes over.
        if self.loop is not loop:
            self.loop, self.task, self.waiting = loop, None, []
        done: asyncio.Future = loop.create_future()
        self.waiting.append((beat, done))
        if self.task is None or self.task.done():
            self.task = loop.create_task(self._write_while_waiting())
        return done

    async def _write_while_waiting(self) -> None:
        while self.waiting:
            await asyncio.sleep(HEARTBEAT_BATCH_S)
            batch, self.waiting = self.waiting, []
            try:
                # Looked up at each write (not bound once), so that a test may stand in for the database.
                seen = await db(heartbeats.node_heartbeats_checked, pool="heartbeat")(
                    beats=[b for b, _ in batch]
                )
            except asyncio.CancelledError:
                for _, done in batch:
                    done.cancel()
                raise
            # A boundary: each socket hears why its heartbeat failed (and logs it), and the next batch is written.
            except Exception as exc:
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for (_, done), answer in zip(batch, seen, strict=True):
                if not done.done():  # its socket may have closed meanwhile
                    done.set_result(answer)


_batches = _Batches()


async def heartbeat_checked(beat: Beat) -> HeartbeatSeen:
    """Record a heartbeat with the others of this process (`node_heartbeat_checked`'s answer for it)."""
    return await _batches.add(beat)
