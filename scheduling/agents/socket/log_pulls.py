"""Pulling the node's job logs (`LogPulls`): the portal asks the agent for new bytes of each running placement's
streams (`logs_request`), and stores each answer (`logs`) at the offset it asked for.

A stream whose last answers brought nothing new is asked again after twice the wait before, up to
LOG_UNWATCHED_MAX_S: at 1,000 nodes of 8 quiet jobs, asking every stream each LOG_PULL_INTERVAL_S was 16,000
frames a second through the portal (bench/cluster_scale.py). A stream nobody watches waits LOG_UNWATCHED_MAX_S
after its first empty answer: doubling from 2 s, a sweep's 8,000 new quiet jobs were six asks a stream in their
first minute, 100,000 frames that held up the starts and ends reported behind them. New output resets the wait; a finished placement's
logs are drained at once, and kept draining (a LogDrain row) until both streams reached their end, so a reconnect or a
portal restart in between still brings the last lines. A person watching a quiet job (its page open, or following its logs through the API:
realtime/listeners.py) sees its next line at most TESSERA_LOG_QUIET_MAX_S (10 s) late; a quiet job nobody
watches is asked every TESSERA_LOG_UNWATCHED_MAX_S (300 s), and within TESSERA_LOG_QUIET_MAX_S once someone watches.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from agent import protocol
from scheduling.agents.reports import log_chunks, nodes
from scheduling.agents.reports.outcome import Outcome
from scheduling.agents.socket.db_threads import db
from scheduling.agents.socket.desired import DesiredStateOut
from scheduling.agents.socket.link import CLOSE_UNAUTHENTICATED, NodeLink, logged
from scheduling.realtime import groups, listeners

# How often the portal pulls new log bytes of running jobs from the agent.
LOG_PULL_INTERVAL_S = 2.0
# A logs_request unanswered this long is asked again (the agent dropped it); its answer is still taken until it is
# this much older.
LOG_REQUEST_TIMEOUT_S = 30.0
LOG_REQUEST_FORGET_S = 300.0
LOG_QUIET_MAX_S = float(settings.TESSERA_LOG_QUIET_MAX_S)
LOG_UNWATCHED_MAX_S = float(settings.TESSERA_LOG_UNWATCHED_MAX_S)
LOG_CHUNK_BYTES = protocol.MAX_LOG_CHUNK_BYTES
STREAMS = ("stdout", "stderr")

Key = tuple[int, int, str]  # (job, attempt, stream)


@dataclass(frozen=True)
class _LogRequest:
    key: Key
    offset: int
    asked_at: float  # monotonic
    watched: bool  # someone watched the job when it was asked


def _store_logs(node_id: int, token_hash: str, **chunk: Any) -> tuple[int, int] | None | bool:
    """Store a log chunk unless the connection's token was rotated since it opened (then False)."""
    if not nodes.node_token_current(node_id=node_id, token_hash=token_hash):
        return False
    return log_chunks.job_logs_store(node_id=node_id, **chunk)


class LogPulls:
    def __init__(self, link: NodeLink, desired: DesiredStateOut) -> None:
        self.link = link
        self.desired = desired  # its placements are what the agent runs: no database read a node a pull
        self.next: dict[Key, int] = {}  # -> the agent's offset to ask from
        self.waiting: dict[str, _LogRequest] = {}  # request id -> what it asked
        self.asked: set[Key] = set()  # the keys of waiting's requests not yet timed out
        self.expired: set[str] = (
            set()
        )  # waiting's requests past LOG_REQUEST_TIMEOUT_S, their answers still taken
        self.draining: set[tuple[int, int]] = set()  # finished placements whose logs are still coming
        self.eof: set[Key] = set()
        self.quiet: dict[Key, tuple[float, float]] = {}  # -> (wait s, ask again at)

    async def drain(self, job_id: int, attempt: int) -> None:
        """The placement has ended: pull its logs to the end, however quiet it was (remembered in the database
        until done)."""
        await db(log_chunks.log_drain_expect)(node_id=self.link.node_id, job_id=job_id, attempt=attempt)
        self.draining.add((job_id, attempt))

    async def resume(self) -> None:
        """Go on draining what ended on this node before this connection (a reconnect, a portal restart). Pulled
        from the start again: what is stored already is written over with the same bytes."""
        self.draining.update(await db(log_chunks.log_drains)(node_id=self.link.node_id))

    async def _drained(self, job_id: int, attempt: int) -> None:
        self.draining.discard((job_id, attempt))
        await db(log_chunks.log_drain_done)(node_id=self.link.node_id, job_id=job_id, attempt=attempt)

    async def answer(self, payload: dict[str, Any]) -> Outcome | None:
        """The agent's answer to a logs_request: stored where it was asked; a refusal when it is not the chunk
        asked for (None: stored, or an answer to nothing asked)."""
        request_id = str(payload.get("request_id") or "")
        request = self.waiting.pop(request_id, None)
        if request is None:
            return None  # an answer to nothing we asked (or forgotten since): ignored
        key = request.key
        if request_id in self.expired:
            self.expired.discard(request_id)  # a late answer: taken; a newer ask of the stream may be waiting
        else:
            self.asked.discard(key)
        if request.offset != self.next.get(key, 0):
            return None  # asked before an earlier answer moved the offset on: the next pull asks again
        job_id, attempt, stream = key
        # Stored under the placement and at the offset this connection asked for, never what the answer claims.
        asked = {"job_id": job_id, "attempt": attempt, "stream": stream, "offset": request.offset}
        checked = log_chunks.log_chunk_check(**asked, payload=payload)
        if checked is not None and not checked[2]:
            stored: tuple[int, int] | None | bool = checked[:2]  # nothing new: no write, no database
        else:
            stored = await db(_store_logs)(self.link.node_id, self.link.token_hash, **asked, payload=payload)
            if stored is False:
                await self.link.refuse(CLOSE_UNAUTHENTICATED)  # the token was rotated: it speaks for no one
                return None
        if stored is None:
            if key[:2] in self.draining:
                await self._drained(job_id, attempt)  # refused: asking again would bring the same answer
            if "error" in payload:
                return None  # the agent's own "cannot read it": nothing to refuse
            if checked is not None:
                # A good chunk of a placement that is no longer this node's (requeued after a fence, moved): the
                # portal asked before it moved on. Not stored, and no error of the node's.
                return Outcome(False, f"job {job_id} attempt {attempt} is no longer placed here", stale=True)
            return Outcome(False, f"not the chunk asked for job {job_id} attempt {attempt} {stream}")
        next_offset, size = stored
        if next_offset == request.offset and not payload.get("eof"):
            wait = LOG_UNWATCHED_MAX_S  # nobody watches: the slowest pace, until someone does
            if request.watched:
                wait = min(wait, 2 * self.quiet.get(key, (LOG_PULL_INTERVAL_S / 2, 0.0))[0])
            self.quiet[key] = (wait, time.monotonic() + wait)
        else:
            self.quiet.pop(key, None)
        self.next[key] = next_offset
        if next_offset < size:
            await self._request(*key, watched=request.watched)  # more to read right away
        elif payload.get("eof"):
            self.eof.add(key)
            if key[:2] in self.draining and all((job_id, attempt, s) in self.eof for s in STREAMS):
                await self._drained(job_id, attempt)
        return None

    async def pull(self) -> None:
        """Ask for each stream of the placements sent, and of those draining, unless it is quiet and not due."""
        now = time.monotonic()
        listened = await listeners.listened()
        for job_id, attempt in self.desired.placements | self.draining:
            draining = (job_id, attempt) in self.draining
            watched = listened is None or groups.job(job_id) in listened
            for stream in STREAMS:
                quiet = self.quiet.get((job_id, attempt, stream))
                if quiet is not None and not draining:
                    wait_s, asked_at = quiet[0], quiet[1] - quiet[0]
                    if now < asked_at + (min(wait_s, LOG_QUIET_MAX_S) if watched else wait_s):
                        continue  # nothing new the last times asked: asked again later
                await self._request(job_id, attempt, stream, watched=watched or draining)

    async def forever(self) -> None:
        while not self.link.closing:
            await asyncio.sleep(LOG_PULL_INTERVAL_S)
            await logged(self._turn(), "log pull", self.link.node_name)

    async def _turn(self) -> None:
        # A request the agent has not answered for a while may be asked again (the agent dropped it), but its
        # answer is still taken should it come (it may be waiting behind this node's reports, here), and a stream
        # nobody watches is asked again only at its slow pace: re-asking every stream of a node whose answers
        # queue behind a wave of reports made more answers to queue (bench/cluster_scale.py, 8,000 jobs).
        now = time.monotonic()
        for request_id, request in list(self.waiting.items()):
            age_s = now - request.asked_at
            if age_s >= LOG_REQUEST_FORGET_S:  # never answered: forgotten
                del self.waiting[request_id]
                self.expired.discard(request_id)
                continue
            if age_s < LOG_REQUEST_TIMEOUT_S or request_id in self.expired:
                continue
            self.expired.add(request_id)
            self.asked.discard(request.key)
            if not request.watched:
                self.quiet[request.key] = (LOG_UNWATCHED_MAX_S, now + LOG_UNWATCHED_MAX_S)
        await self.pull()

    async def _request(self, job_id: int, attempt: int, stream: str, *, watched: bool) -> None:
        key = (job_id, attempt, stream)
        if key in self.asked:
            return
        payload = {
            "job_id": str(job_id),
            "attempt": attempt,
            "stream": stream,
            "offset": self.next.get(key, 0),
            "limit_bytes": LOG_CHUNK_BYTES,
        }
        msg = protocol.message("logs_request", payload)
        self.waiting[msg["id"]] = _LogRequest(key, payload["offset"], time.monotonic(), watched)
        self.asked.add(key)
        await self.link.send_msg(msg)
