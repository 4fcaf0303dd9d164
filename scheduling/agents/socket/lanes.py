"""A node's lanes (`NodeLanes`): the order its frames are handled in, each lane apart from the other.

- The heartbeat lane handles only the newest heartbeat (each supersedes the one before), at once, on database
  threads of its own: on a slow database heartbeats never pile up ahead of the job reports, nor wait behind them.
- The report lane is the node's queue of everything else (hello, job_status, event, ack, logs), handled one at a
  time in the order sent. Start reports that follow each other are recorded together with the other nodes'
  (`_start_batches`, batches.py); past MAX_QUEUED_REPORTS a report is answered "send it again".

Samples take no lane: the transport hands them to their handler on the frames' path, which never waits for the
database. A node whose reports waited their turn in the database held up its heartbeats with them, and at 1,000
nodes busy nodes were declared lost under a cycle's wave of start reports (bench/cluster_scale.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable
from typing import Any

from agent import protocol
from scheduling.agents.reports import job_status
from scheduling.agents.reports.outcome import Outcome
from scheduling.agents.socket.batches import Batches, PerLoop
from scheduling.agents.socket.db_threads import db
from scheduling.agents.socket.handlers import ReportHandlers
from scheduling.agents.socket.link import CLOSE_UNAUTHENTICATED, NodeLink, logged
from scheduling.observability.instruments import AGENT_REPORTS

# A node's reports waiting to be handled, at most; past it, each is answered "send it again" (the agent keeps
# what is not acked). Start reports are written this many at most in one transaction.
MAX_QUEUED_REPORTS = 1000
START_BATCH_MAX = 500
# A closing socket waits this long at most for the report it is handling to be written.
REPORT_DRAIN_ON_CLOSE_S = 10.0


class NodeLanes:
    def __init__(self, link: NodeLink, handlers: ReportHandlers) -> None:
        self.link = link
        self.handlers = handlers
        self.heartbeat_latest: dict[str, Any] | None = None
        self.heartbeat_due = asyncio.Event()
        self.reports: deque[dict[str, Any]] = deque()
        self.report_due = asyncio.Event()
        self.report_lane: asyncio.Future | None = None

    def start(self) -> None:
        self.link.beside(self._heartbeats_forever(), "the heartbeat lane")
        self.report_lane = self.link.beside(self._reports_forever(), "the report lane")

    def heartbeat(self, payload: dict[str, Any]) -> None:
        self.heartbeat_latest = payload
        self.heartbeat_due.set()
        AGENT_REPORTS.labels("heartbeat", "ok").inc()

    async def report(self, msg: dict[str, Any]) -> None:
        if len(self.reports) >= MAX_QUEUED_REPORTS:
            # A node sending faster than its reports can be handled: it keeps what it sent and sends it again.
            await self.link.send_msg(
                protocol.ack(msg["id"], ok=False, error="portal busy: send it again shortly", retry=True)
            )
            return
        self.reports.append(msg)
        self.report_due.set()

    async def drain(self) -> None:
        """The connection is closing: the report being handled finishes first (what is queued behind it, the
        agent sends again), so that nothing it writes (a hello's "connected") lands after the disconnect."""
        self.link.closing = True
        self.reports.clear()
        self.report_due.set()
        if self.report_lane is not None and not self.report_lane.done():
            await asyncio.wait({self.report_lane}, timeout=REPORT_DRAIN_ON_CLOSE_S)

    async def _heartbeats_forever(self) -> None:
        while not self.link.closing:
            await self.heartbeat_due.wait()
            self.heartbeat_due.clear()
            payload, self.heartbeat_latest = self.heartbeat_latest, None
            if payload is None or self.link.closing:
                continue
            await logged(self.handlers.on_heartbeat(payload), "heartbeat", self.link.node_name)

    async def _reports_forever(self) -> None:
        while not self.link.closing:
            await self.report_due.wait()
            self.report_due.clear()
            while self.reports and not self.link.closing:
                starts = []
                while self.reports and _is_start(self.reports[0]):
                    starts.append(self.reports.popleft())
                turn = self._record_starts(starts) if starts else self.handlers.handle(self.reports.popleft())
                # An answer not sent (the socket closing): the queue goes on, the agent sends it again.
                await logged(turn, "answering a report", self.link.node_name)

    async def _record_starts(self, msgs: list[dict[str, Any]]) -> None:
        link = self.link
        reports = [job_status.StartReport(link.node_id, link.token_hash, m["payload"]) for m in msgs]
        outcomes = await self.handlers.settled("start reports", _start_batches.get().submit(reports))
        if isinstance(outcomes, Outcome):
            outcomes = [outcomes] * len(msgs)
        for msg, outcome in zip(msgs, outcomes, strict=True):
            if outcome is None:  # the token was rotated since this connection opened: it speaks for no one
                await link.refuse(CLOSE_UNAUTHENTICATED)
                return
            await self.handlers.answer("job_status", msg, outcome)


def _is_start(msg: dict[str, Any]) -> bool:
    payload = msg["payload"]
    return msg["type"] == "job_status" and isinstance(payload, dict) and payload.get("state") == "started"


def _write_starts(reports: list[job_status.StartReport]) -> Awaitable[list[Outcome | None]]:
    # Looked up at each write (not bound once), so that a test may stand in for the database.
    return db(job_status.job_starts_record)(reports=reports)


# The start reports of every node this process serves, recorded together (batches.py): one report alone is written
# at once; a cycle's wave of them, in a few transactions instead of one each.
_start_batches: PerLoop[Batches[job_status.StartReport, Outcome | None]] = PerLoop(
    lambda: Batches(_write_starts, most=START_BATCH_MAX, name="start reports")
)
