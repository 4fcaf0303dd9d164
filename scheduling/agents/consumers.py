"""The node agents' websocket (/ws/agent/): token auth for the agent's own node, desired state out, reports in.

Agents send no cookies and no Origin, so this route has neither session auth nor an Origin check: the bearer
token alone says which node is speaking, and every report is checked against that node. Wire format: agent/protocol.py
and docs/agent.md. The consumer authorises and relays; the writes live in scheduling.agents.reports.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from asgiref.sync import SyncToAsync
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections

from agent import protocol
from portal import database
from scheduling.agents import live_metrics
from scheduling.agents import reports as agent_services
from scheduling.cycle.desired_state import DesiredState, desired_state_for_node, desired_version_raise
from scheduling.history.recorder import gpu_events_record
from scheduling.inventory.models import Node
from scheduling.inventory.services import node_authenticate
from scheduling.jobs.selectors import job_team_ids
from scheduling.observability.instruments import AGENT_REPORTS
from scheduling.realtime import groups, listeners

log = logging.getLogger(__name__)
MAX_GPUS_PER_SAMPLE = 64

CLOSE_UNAUTHENTICATED = 4401
CLOSE_WRONG_NODE = 4403
# Browsers see utilisation at most this often per node, however often agents send it.
METRICS_PUBLISH_INTERVAL_S = 1.0
# How often the portal pulls new log bytes of running jobs from the agent.
LOG_PULL_INTERVAL_S = 2.0
# A logs_request unanswered this long is asked again (the agent dropped it).
LOG_REQUEST_TIMEOUT_S = 30.0
# A stream whose last answers brought nothing new is asked again after twice the wait before, up to this: at 1,000
# nodes of 8 quiet jobs, asking every stream each LOG_PULL_INTERVAL_S was 16,000 frames a second through the portal
# (bench/cluster_scale.py). New output resets the wait; a finished placement's logs are drained at once. A person
# watching a quiet job (its page open, or following its logs through the API: realtime/listeners.py) sees its next
# line at most TESSERA_LOG_QUIET_MAX_S (10 s) late; a quiet job nobody watches is asked every
# TESSERA_LOG_UNWATCHED_MAX_S (60 s) at most, and at once when someone starts watching.
LOG_QUIET_MAX_S = float(settings.TESSERA_LOG_QUIET_MAX_S)
LOG_UNWATCHED_MAX_S = float(settings.TESSERA_LOG_UNWATCHED_MAX_S)
LOG_CHUNK_BYTES = protocol.MAX_LOG_CHUNK_BYTES
FINAL_STATES = frozenset({"exited", "stopped", "killed", "launch_failed", "lost"})
# Messages that write: the token is re-checked before each (metrics only relays what browsers may see).
# Heartbeats and log chunks check it in the same database call as their write.
CHECKED = frozenset({"hello", "job_status", "event", "ack"})
# A node's reports waiting to be handled, at most; past it, each is answered "send it again" (the agent keeps
# what is not acked). Start reports are written this many at most in one transaction.
MAX_QUEUED_REPORTS = 1000
START_BATCH_MAX = 500
# A closing socket waits this long at most for the report it is handling to be written.
REPORT_DRAIN_ON_CLOSE_S = 10.0


_db_pools: dict[str, ThreadPoolExecutor] = {}
# Two kinds of database work never wait behind the agents' reports, on threads of their own ("lanes"). Connecting
# sockets' token checks: daphne drops a websocket not accepted within 5 s, and behind a storm of hellos (each
# reconciling a node's inventory) a check queued with them missed that, so the agents backed off and came back,
# adding to the storm. Heartbeats: they are the node's liveness; queued behind a cycle's worth of start reports
# they arrived later than TESSERA_NODE_LOST_AFTER_S and the watchdog declared busy nodes lost (both seen in
# bench/cluster_scale.py at 1,000 nodes). A heartbeat is one statement (reports.node_heartbeat_checked).
LANE_THREADS = {"connect": 2, "heartbeat": 2}


def db(fn: Callable[..., Any], *, lane: str = "reports") -> Callable[..., Any]:
    """`fn` made awaitable on the agents' own database threads: `lane` "reports" (everything but), "connect"
    (the token checks of sockets being accepted) or "heartbeat".

    Channels runs every consumer's database work on one shared thread: one node's report waiting on a row lock
    (a cycle committing) would hold up every other node's heartbeats. A small pool keeps nodes apart. A node's
    heartbeats and log pulls run beside its reports, so the writes they share are idempotent and re-check the
    job's state under its row lock. SQLite (the embedded default) takes one writer at a time: there, everything
    stays on the shared thread, with the embedded scheduling loop.
    """
    if database.single_writer():
        return database_sync_to_async(fn)
    pool = _db_pools.get(lane)
    if pool is None:
        threads = LANE_THREADS.get(lane, settings.TESSERA_AGENT_DB_THREADS)
        pool = _db_pools[lane] = ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix=f"agent-db-{lane}"
        )
    return SyncToAsync(_closing_connections(fn), thread_sensitive=False, executor=pool)


def _closing_connections(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Close the thread's spent database connections (per CONN_MAX_AGE, as Django does per request) around `fn`,
    inside the context asgiref runs it in. Channels' DatabaseSyncToAsync closes outside it, which left pool
    threads' connections open until garbage collection (idle sessions piling up in PostgreSQL)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return run


def db_pool_shutdown() -> None:
    """Wait for the agents' database calls still running (a closed connection's cancelled work finishes in its
    thread, and closes its database connection), then drop the pools; the next call makes new ones."""
    pools = list(_db_pools.values())
    _db_pools.clear()
    for pool in pools:
        pool.shutdown(wait=True)


def _is_start(msg: dict) -> bool:
    payload = msg["payload"]
    return msg["type"] == "job_status" and isinstance(payload, dict) and payload.get("state") == "started"


class _StartBatches:
    """The start reports of every node this process serves, recorded together: while one batch is being written,
    the reports arriving meanwhile wait, and are the next batch (job_starts_record). One report alone is written
    at once; a cycle's wave of them, in a few transactions instead of one each."""

    def __init__(self) -> None:
        self.waiting: list[tuple[agent_services.StartReport, asyncio.Future]] = []
        self.flushing: asyncio.Future | None = None

    async def record(self, reports: list[agent_services.StartReport]) -> list[agent_services.Outcome | None]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in reports]
        self.waiting += zip(reports, futures, strict=True)
        if self.flushing is None or self.flushing.done():
            self.flushing = asyncio.ensure_future(self._flush())
        answers = await asyncio.gather(*futures, return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return answers

    async def _flush(self) -> None:
        while self.waiting:
            batch, self.waiting = self.waiting[:START_BATCH_MAX], self.waiting[START_BATCH_MAX:]
            try:
                outcomes = await db(agent_services.job_starts_record)(reports=[r for r, _ in batch])
                answered = list(zip(batch, outcomes, strict=True))
            except Exception as exc:  # each waiting connection answers its agent (a retry, or a refusal)
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), outcome in answered:
                if not future.done():  # its connection closed meanwhile
                    future.set_result(outcome)


_start_batches_of: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _StartBatches] = (
    weakref.WeakKeyDictionary()
)


def _start_batches() -> _StartBatches:
    loop = asyncio.get_running_loop()
    batches = _start_batches_of.get(loop)
    if batches is None:
        batches = _start_batches_of[loop] = _StartBatches()
    return batches


@dataclass(frozen=True)
class _LogRequest:
    key: tuple[int, int, str]  # (job, attempt, stream)
    offset: int
    asked_at: float  # monotonic


def _header(scope: dict, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


def _bearer(scope: dict) -> str:
    scheme, _, token = _header(scope, b"authorization").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _token_current(node_id: int, token_hash: str) -> bool:
    return Node.objects.filter(pk=node_id, agent_token_hash=token_hash).exists()


def _desired_for(node_id: int) -> tuple[DesiredState, dict[int, int]]:
    """The node's desired state and the team of each of its jobs (for routing their metrics)."""
    state, _ = desired_state_for_node(node=Node.objects.get(pk=node_id))
    return state, job_team_ids(job_ids=[int(j["job_id"]) for j in state.jobs])


def _store_logs(node_id: int, token_hash: str, **chunk: Any) -> tuple[int, int] | None | bool:
    """Store a log chunk unless the connection's token was rotated since it opened (then False)."""
    if not _token_current(node_id, token_hash):
        return False
    return agent_services.job_logs_store(node_id=node_id, **chunk)


class AgentConsumer(AsyncWebsocketConsumer):
    node_id: int | None = None
    node_name = ""

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        """As Channels' consumers run, except that the channel layer's failures (Redis down) never end the
        connection: the agent's messages are served meanwhile, and pushes resume when the layer answers again."""
        self.scope = scope
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.channel_name = await self.channel_layer.new_channel()
        self.base_send = send
        try:
            await await_many_dispatch([receive, self._layer_receive], self.dispatch)
        except StopConsumer:
            pass

    async def dispatch(self, message: dict) -> None:
        """As Channels dispatches, without the hop to its shared database thread that it makes before every message
        to close stale connections: this consumer's database work runs on its own threads, which close their
        connections themselves (`db`). At 1,000 nodes that hop was a thread switch for every sample and heartbeat,
        a quarter of the socket's CPU (bench/agent_traffic.py)."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def _layer_receive(self) -> dict:
        delay_s = 0.5
        while True:
            try:
                return await self.channel_layer.receive(self.channel_name)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the backend's own errors (redis, OS): wait, and try again
                if delay_s == 0.5:
                    log.warning(
                        "node %s: channel layer unavailable (%s); pushes wait for it", self.node_name, exc
                    )
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 5.0)

    async def connect(self) -> None:
        node = await db(node_authenticate, lane="connect")(token=_bearer(self.scope))
        if node is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        claimed = _header(self.scope, b"x-tessera-node")
        if claimed and claimed != node.name:
            log.warning("agent token of %s used to speak for %s: refused", node.name, claimed)
            await self.close(code=CLOSE_WRONG_NODE)
            return
        self.node_id, self.node_name = node.pk, node.name
        self.token_hash = node.agent_token_hash
        self.group = groups.node(node.name)
        self.sent_version: int | None = None
        self.job_gpus: dict[str, list[tuple[int, int]]] = {}  # gpu uuid -> [(job id, team id)]
        self.last_metrics_at = 0.0
        self.log_next: dict[tuple[int, int, str], int] = {}  # (job, attempt, stream) -> agent offset
        self.log_waiting: dict[str, _LogRequest] = {}  # request id -> what it asked
        self.log_asked: set[tuple[int, int, str]] = set()  # the keys of log_waiting's requests
        self.placements: set[tuple[int, int]] = set()  # (job, attempt) of the desired state last sent
        self.log_draining: set[tuple[int, int]] = set()  # finished placements whose logs are still coming
        self.log_eof: set[tuple[int, int, str]] = set()
        self.log_quiet: dict[tuple[int, int, str], tuple[float, float]] = {}  # key -> (wait s, ask again at)
        self.said_hello = False
        self.closing = False  # refused (a rotated token, another node's name): nothing more is handled
        self.desired_lock = asyncio.Lock()  # one desired state computed and sent at a time, in version order
        self.heartbeat_latest: dict | None = None
        self.catching_up: asyncio.Future | None = None  # heartbeat_catch_up in flight
        self.resending: asyncio.Future | None = None  # a heartbeat's send_desired in flight
        self.refreshing: asyncio.Future | None = None  # a notice's send_desired in flight
        self.desired_stale = False  # a notice came since the read in flight began
        self.heartbeat_due = asyncio.Event()
        self.report_queue: deque[dict] = deque()  # messages other than heartbeats and samples, in order
        self.beside: set[asyncio.Future] = set()  # work started from the frames' path, not awaited there
        self.report_due = asyncio.Event()
        self.grouped = await self._join_group()
        await self.accept()
        # The whole desired state follows the agent's hello (its first message), once the GPUs it names are
        # reconciled with the inventory: before that, a fresh node's GPU UUIDs may still be the registered ones.
        self.reports_task = asyncio.ensure_future(self._reports_forever())
        self.tasks = [
            asyncio.ensure_future(self._pull_logs_forever()),
            asyncio.ensure_future(self._heartbeats_forever()),
            self.reports_task,
        ]

    async def _join_group(self) -> bool:
        """Join the node's group, through which changes are pushed at once. Without the channel layer (Redis
        down) the agent is served all the same: its heartbeats go to the database, each is acknowledged, and
        the desired state is recomputed on each, so an outage only slows pushes to one heartbeat."""
        try:
            await self.channel_layer.group_add(self.group, self.channel_name)
            return True
        except (
            Exception
        ) as exc:  # the layer's errors are the backend's own (redis, OS): none of them is fatal
            log.warning(
                "node %s: channel layer unavailable (%s); serving it without pushes", self.node_name, exc
            )
            return False

    async def disconnect(self, code: int) -> None:
        if self.node_id is None:
            return
        reports_task = getattr(self, "reports_task", None)
        if reports_task is not None and not reports_task.done():
            # The report being handled finishes first (what is queued behind it, the agent sends again), so that
            # nothing it writes (a hello's "connected") lands after the disconnect below.
            self.closing = True
            self.report_queue.clear()
            self.report_due.set()
            await asyncio.wait({reports_task}, timeout=REPORT_DRAIN_ON_CLOSE_S)
        for task in [
            *getattr(self, "tasks", ()),
            *getattr(self, "beside", ()),
            getattr(self, "catching_up", None),
            getattr(self, "resending", None),
            getattr(self, "refreshing", None),
        ]:
            if task is not None:
                task.cancel()
        if getattr(self, "grouped", False):
            try:
                await self.channel_layer.group_discard(self.group, self.channel_name)
            except Exception as exc:  # the group entry expires on its own
                log.warning("node %s: could not leave its group: %s", self.node_name, exc)
        await db(agent_services.node_disconnected)(node_id=self.node_id)

    async def refuse(self, code: int) -> None:
        if not self.closing:
            self.closing = True
            await self.close(code=code)

    # -- out ---------------------------------------------------------------------------------------------------
    async def send_msg(self, msg: dict[str, Any]) -> bool:
        """Send one message; False when its frame is over the limit (the agent would drop the connection, and
        with it every report and log of the node): it is not sent, and the portal's log says so."""
        try:
            text = protocol.encode(msg)
        except protocol.FrameTooLarge as exc:
            log.error("node %s: not sending %s %s: %s", self.node_name, msg["type"], msg["id"], exc)
            return False
        await self.send(text_data=text)
        return True

    async def send_desired(self, *, force: bool = False) -> None:
        async with self.desired_lock:
            state, teams = await db(_desired_for)(self.node_id)
            if not force and state.version == self.sent_version:
                return
            self._state_sent(state, teams)
            payload = state.message()
            payload.pop("type")
            await self.send_msg(protocol.message("desired_state", payload))

    def _state_sent(self, state: DesiredState, teams: dict[int, int]) -> None:
        """What this socket keeps of the state it sends: its version, the placements (whose logs it pulls) and
        which jobs hold each card (whose followers get its samples)."""
        self.sent_version = state.version
        self.placements = {(int(j["job_id"]), int(j["attempt"])) for j in state.jobs}
        self.job_gpus = {}
        for j in state.jobs:
            for g in j["gpus"]:
                self.job_gpus.setdefault(g["uuid"], []).append(
                    (int(j["job_id"]), teams.get(int(j["job_id"]), 0))
                )

    # -- group messages (from the cycle and the services, after commit) ---------------------------------------------
    async def desired_changed(self, event: dict) -> None:
        if not self.said_hello or self.closing:
            return
        pushed = event.get("state")
        if pushed is None:
            # Read back beside the socket's other work, never in the dispatch of the layer's messages: a wave of job
            # ends is a notice each, and each read waiting its turn held up this process's inbox behind it. Notices
            # arriving while a read is under way are one more read, not one each.
            self.desired_stale = True
            if self.refreshing is None or self.refreshing.done():
                self.refreshing = asyncio.ensure_future(
                    self._logged(self._refresh_desired(), "desired state")
                )
            return
        if self.desired_lock.locked():
            # A read of the state is under way (a hello's, a heartbeat's resend): sent once it is done, beside the
            # dispatch, which meanwhile goes on reading the node's frames (its heartbeats among them).
            self._beside(self._push_state(pushed), "desired state")
            return
        await self._push_state(pushed)

    async def _push_state(self, pushed: dict) -> None:
        """The state as the cycle's sync computed it: sent as it is, unless this socket sent a newer one already
        (so pushes sent beside the dispatch may arrive in any order)."""
        async with self.desired_lock:
            if self.sent_version is not None and pushed["version"] <= self.sent_version:
                return
            state = DesiredState(node=self.node_name, version=pushed["version"], jobs=tuple(pushed["jobs"]))
            self._state_sent(state, {int(k): v for k, v in pushed["teams"].items()})
            payload = state.message()
            payload.pop("type")
            await self.send_msg(protocol.message("desired_state", payload))

    def _beside(self, work: Any, what: str) -> None:
        """Run `work` as a task of this socket's own (cancelled when it closes); a failure is logged."""
        task = asyncio.ensure_future(self._logged(work, what))
        self.beside.add(task)
        task.add_done_callback(self.beside.discard)

    async def _refresh_desired(self) -> None:
        while self.desired_stale and not self.closing:
            self.desired_stale = False
            await self.send_desired()

    # -- in ------------------------------------------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Read one frame. Nothing here waits for the database (but to note a sample's failure): heartbeats go to
        their own task, samples to Redis, and every other message to the node's queue of reports, handled in the
        order sent (`_reports_forever`). A node whose reports waited their turn in the database held up its heartbeats with
        them, and at 1,000 nodes busy nodes were declared lost under a cycle's wave of start reports
        (bench/cluster_scale.py)."""
        try:
            msg = protocol.decode(text_data if text_data is not None else bytes_data)
        except protocol.ProtocolError as exc:
            log.warning("node %s sent a malformed message: %s", self.node_name, exc)
            return
        kind, payload = msg["type"], msg["payload"]
        if self.closing:
            return
        if kind == "heartbeat":
            # Each heartbeat supersedes the one before: its own task handles only the newest, so on a slow
            # database heartbeats never pile up ahead of the job reports (nor keep a stale backlog alive).
            self.heartbeat_latest = payload
            self.heartbeat_due.set()
            AGENT_REPORTS.labels("heartbeat", "ok").inc()
            return
        if kind == "metrics":
            try:
                await self.on_metrics(payload)
            except Exception as exc:  # one bad sample must not drop the node's connection
                log.exception("node %s: metrics failed", self.node_name)
                await self._answer(
                    kind, msg, agent_services.Outcome(False, f"portal error: {type(exc).__name__}")
                )
            else:
                AGENT_REPORTS.labels(kind, "ok").inc()
            return
        if len(self.report_queue) >= MAX_QUEUED_REPORTS:
            # A node sending faster than its reports can be handled: it keeps what it sent and sends it again.
            await self.send_msg(
                protocol.ack(msg["id"], ok=False, error="portal busy: send it again shortly", retry=True)
            )
            return
        self.report_queue.append(msg)
        self.report_due.set()

    async def _reports_forever(self) -> None:
        """Handle the node's queued reports in the order it sent them; its start reports that follow each other
        are recorded together, with the other nodes' (`_StartBatches`)."""
        while not self.closing:
            await self.report_due.wait()
            self.report_due.clear()
            while self.report_queue and not self.closing:
                starts = []
                while self.report_queue and _is_start(self.report_queue[0]):
                    starts.append(self.report_queue.popleft())
                try:
                    if starts:
                        await self._record_starts(starts)
                    else:
                        await self._handle(self.report_queue.popleft())
                except asyncio.CancelledError:
                    raise
                except (
                    Exception
                ):  # an answer not sent (the socket closing): the queue goes on, the agent resends
                    log.warning("node %s: a report was not answered", self.node_name, exc_info=True)

    async def _record_starts(self, msgs: list[dict]) -> None:
        reports = [agent_services.StartReport(self.node_id, self.token_hash, m["payload"]) for m in msgs]
        try:
            outcomes = await _start_batches().record(reports)
        except (OperationalError, InterfaceError) as exc:
            log.warning(
                "node %s: start reports failed, the agent will send them again: %s", self.node_name, exc
            )
            outcomes = [
                agent_services.Outcome(False, f"portal error: {type(exc).__name__}", retry=True)
            ] * len(msgs)
        except Exception as exc:
            log.exception("node %s: start reports failed", self.node_name)
            outcomes = [agent_services.Outcome(False, f"portal error: {type(exc).__name__}")] * len(msgs)
        for msg, outcome in zip(msgs, outcomes, strict=True):
            if outcome is None:  # the token was rotated since this connection opened: it speaks for no one
                await self.refuse(CLOSE_UNAUTHENTICATED)
                return
            await self._answer("job_status", msg, outcome)

    async def _handle(self, msg: dict) -> None:
        kind, payload = msg["type"], msg["payload"]
        handler = getattr(self, f"on_{kind}", None)
        if handler is None:
            await self.send_msg(protocol.ack(msg["id"], ok=False, error=f"unknown message type {kind!r}"))
            return
        try:
            if kind in CHECKED and not await db(_token_current)(self.node_id, self.token_hash):
                # The token was rotated (or the node removed) since this connection opened: it speaks for no one.
                await self.refuse(CLOSE_UNAUTHENTICATED)
                return
            if kind == "event":  # recorded once per message id, however often it arrives
                outcome = await handler(payload, message_id=str(msg["id"]))
            else:
                outcome = await handler(payload)
        except (OperationalError, InterfaceError) as exc:
            # Not a refusal: the report may be fine and the database failing for now (a deadlock it broke, a
            # lost connection). The agent keeps it and sends it again, so a job's start or end is not dropped.
            log.warning("node %s: %s failed, the agent will send it again: %s", self.node_name, kind, exc)
            outcome = agent_services.Outcome(False, f"portal error: {type(exc).__name__}", retry=True)
        except Exception as exc:  # one bad report must not drop the node's connection (nor come back forever)
            log.exception("node %s: %s failed", self.node_name, kind)
            outcome = agent_services.Outcome(False, f"portal error: {type(exc).__name__}")
        await self._answer(kind, msg, outcome)

    async def _answer(self, kind: str, msg: dict, outcome: agent_services.Outcome | None) -> None:
        """Count a handled report, keep the node's newest refusal, and ack it where the agent waits for one."""
        AGENT_REPORTS.labels(kind, "ok" if outcome is None or outcome.ok else "refused").inc()
        if outcome is not None and not outcome.ok and not outcome.retry:
            try:  # the node's conditions show its newest refusal
                await db(agent_services.node_error_note)(
                    node_id=self.node_id, message=f"{kind} refused: {outcome.error}"
                )
            except Exception as exc:
                log.warning("node %s: its last error not kept (%s)", self.node_name, exc)
        # Reliable messages are always acked; others only when refused, so the agent can log why.
        if kind in protocol.RELIABLE or (outcome is not None and not outcome.ok):
            ok = outcome.ok if outcome is not None else True
            extra = {"retry": True} if outcome is not None and outcome.retry else {}
            await self.send_msg(
                protocol.ack(msg["id"], ok=ok, error=outcome.error if outcome else None, **extra)
            )

    async def on_hello(self, payload: dict) -> agent_services.Outcome:
        node = payload.get("node")
        if node is not None and node != self.node_name:
            await self.refuse(CLOSE_WRONG_NODE)
            return agent_services.Outcome(False, f"this token is for node {self.node_name}, not {node}")
        await db(agent_services.node_hello)(node_id=self.node_id, payload=payload)
        self.said_hello = True
        # The inventory may have renamed GPUs (their UUIDs): the agent gets the state it can run.
        await self.send_desired(force=True)
        return agent_services.Outcome(True)

    async def _heartbeats_forever(self) -> None:
        while not self.closing:
            await self.heartbeat_due.wait()
            self.heartbeat_due.clear()
            payload, self.heartbeat_latest = self.heartbeat_latest, None
            if payload is None or self.closing:
                continue
            try:
                await self.on_heartbeat(payload)
            except asyncio.CancelledError:
                raise
            except Exception:  # the next heartbeat tries again
                log.warning("node %s: heartbeat failed", self.node_name, exc_info=True)

    async def on_heartbeat(self, payload: dict) -> None:
        seen = await db(agent_services.node_heartbeat_checked, lane="heartbeat")(
            node_id=self.node_id, token_hash=self.token_hash, running=payload.get("running")
        )
        if not seen.token_current:
            # The token was rotated (or the node removed) since this connection opened: it speaks for no one.
            await self.refuse(CLOSE_UNAUTHENTICATED)
            return
        version = seen.desired_version
        # Recorded: the node's jobs' fences count from now (node_loss.py: the portal counts from this record).
        await self.send_msg(protocol.message("heartbeat_ack", {"seq": payload.get("seq")}))
        if seen.behind and (self.catching_up is None or self.catching_up.done()):
            # Missed start reports are recorded with the other reports, never on the heartbeats' threads.
            catch_up = db(agent_services.heartbeat_catch_up)(
                node_id=self.node_id, running=payload.get("running")
            )
            self.catching_up = asyncio.ensure_future(self._logged(catch_up, "missed start reports"))
        if not self.grouped:
            self.grouped = await self._join_group()
        if not self.said_hello:
            return
        held = payload.get("desired_version")
        # Resend what the agent missed, and what the database has moved on to since this connection last sent
        # (a change whose notification was lost: Redis restarting, a message dropped), so it still reaches the
        # agent within one heartbeat. Every cycle recomputes every node's state (desired_state_sync), so reading
        # the version is enough; recomputing it here on every heartbeat cost most of the portal's CPU at 1,000
        # nodes (bench/cluster_scale.py). Without the channel layer no cycle runs: then recompute each time.
        missed = held is None or self.sent_version is None or int(held) < self.sent_version
        if (missed or not self.grouped or version != self.sent_version) and (
            self.resending is None or self.resending.done()
        ):
            # Beside the heartbeats, never ahead of the next one: reading the state back waits its turn with the
            # node's reports, and a heartbeat waiting for it was a heartbeat not recorded (nodes "lost" while a
            # cycle's starts were being reported, bench/cluster_scale.py).
            self.resending = asyncio.ensure_future(
                self._logged(self.send_desired(force=missed), "desired state")
            )

    async def _logged(self, work: Any, what: str) -> None:
        """Await `work` (a heartbeat's follow-up, run beside the heartbeats); a failure is logged, and the next
        heartbeat tries again."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("node %s: %s failed", self.node_name, what, exc_info=True)

    async def on_ack(self, payload: dict) -> None:
        version = payload.get("desired_version")
        if version is None:
            return
        await db(agent_services.node_acked)(node_id=self.node_id, version=int(version))
        if payload.get("ok") is False and self.sent_version is not None and int(version) > self.sent_version:
            # The agent holds a newer version than the database knows (a restored database): leapfrog it.
            await db(desired_version_raise)(node_id=self.node_id, above=int(version))
            await self.send_desired(force=True)

    async def on_job_status(self, payload: dict) -> agent_services.Outcome:
        outcome = await db(agent_services.job_report)(node_id=self.node_id, payload=payload)
        if outcome.ok and payload.get("state") in FINAL_STATES:
            try:
                self.log_draining.add((int(payload["job_id"]), int(payload["attempt"])))
            except (KeyError, TypeError, ValueError):
                pass
            await self._pull_logs()
        return outcome

    async def on_event(self, payload: dict, message_id: str = "") -> agent_services.Outcome:
        return await db(agent_services.node_event)(
            node_id=self.node_id, payload=payload, message_id=message_id
        )

    async def on_metrics(self, payload: dict) -> None:
        gpus = payload.get("gpus")
        if isinstance(gpus, list) and any(isinstance(g, dict) and g.get("xid_events") for g in gpus):
            # XID events are kept whatever the throttle below drops: each one matters. Written beside the frames'
            # path, which never waits for the database.
            record = db(gpu_events_record)(
                node_id=self.node_id, gpus=[g for g in gpus[:MAX_GPUS_PER_SAMPLE] if isinstance(g, dict)]
            )
            self._beside(record, "XID events")
        now = time.monotonic()
        if now - self.last_metrics_at < METRICS_PUBLISH_INTERVAL_S:
            return
        self.last_metrics_at = now
        try:
            await self._publish_metrics(payload)
        except (
            Exception
        ) as exc:  # live utilisation lives in Redis: without it, browsers wait; the node does not
            if not getattr(self, "metrics_failing", False):
                log.warning("node %s: live metrics not published (%s)", self.node_name, exc)
            self.metrics_failing = True
        else:
            self.metrics_failing = False

    async def _publish_metrics(self, payload: dict) -> None:
        gpus = [live_metrics.gpu_sample(g) for g in payload.get("gpus") or [] if isinstance(g, dict)]
        at = payload.get("sampled_at")
        at = at if isinstance(at, (int, float)) and not isinstance(at, bool) else None
        per_job: dict[tuple[int, int], list[dict]] = {}
        shared: set[int] = set()
        for g in gpus:
            holders = self.job_gpus.get(str(g.get("uuid")), [])
            for job_id, team_id in holders:
                per_job.setdefault((job_id, team_id), []).append(g)
                if len(holders) > 1:
                    shared.add(job_id)
        await live_metrics.node_sample_keep(
            node_name=self.node_name,
            sampled_at=at,
            gpus=gpus,
            jobs=[(job_id, job_gpus, job_id not in shared) for (job_id, _), job_gpus in per_job.items()],
        )
        # Only to groups a browser listens to (listeners.py): a send nobody receives still costs a round trip.
        listened = await listeners.listened()
        if listened is None or groups.CLUSTER in listened:
            await self.channel_layer.group_send(
                groups.CLUSTER, {"type": "gpu.metrics", "node": self.node_name, "at": at, "gpus": gpus}
            )
        for (job_id, team_id), job_gpus in per_job.items():
            msg = {
                "type": "job.metrics",
                "job_id": job_id,
                "node": self.node_name,
                "at": at,
                "gpus": job_gpus,
            }
            for group in (groups.job(job_id), groups.team(team_id)):
                if listened is None or group in listened:
                    await self.channel_layer.group_send(group, msg)

    async def on_logs(self, payload: dict) -> agent_services.Outcome | None:
        request = self.log_waiting.pop(str(payload.get("request_id") or ""), None)
        if request is None:
            return None  # an answer to nothing we asked (or asked again since): ignored
        key = request.key
        self.log_asked.discard(key)
        if request.offset != self.log_next.get(key, 0):
            return None  # asked before an earlier answer moved the offset on: the next pull asks again
        job_id, attempt, stream = key
        # Stored under the placement and at the offset this connection asked for, never what the answer claims.
        asked = {"job_id": job_id, "attempt": attempt, "stream": stream, "offset": request.offset}
        checked = agent_services.log_chunk_check(**asked, payload=payload)
        if checked is not None and not checked[2]:
            stored: tuple[int, int] | None | bool = checked[:2]  # nothing new: no write, no database
        else:
            stored = await db(_store_logs)(self.node_id, self.token_hash, **asked, payload=payload)
            if stored is False:
                await self.refuse(CLOSE_UNAUTHENTICATED)  # the token was rotated: it speaks for no one
                return None
        if stored is None:
            self.log_draining.discard(key[:2])
            if "error" in payload:
                return None  # the agent's own "cannot read it": nothing to refuse
            return agent_services.Outcome(
                False, f"logs refused: not the chunk asked for job {job_id} attempt {attempt} {stream}"
            )
        next_offset, size = stored
        if next_offset == request.offset and not payload.get("eof"):
            wait = min(LOG_UNWATCHED_MAX_S, 2 * self.log_quiet.get(key, (LOG_PULL_INTERVAL_S / 2, 0.0))[0])
            self.log_quiet[key] = (wait, time.monotonic() + wait)
        else:
            self.log_quiet.pop(key, None)
        self.log_next[key] = next_offset
        if next_offset < size:
            await self._request_log(*key)  # more to read right away
        elif payload.get("eof"):
            self.log_eof.add(key)
            if all((key[0], key[1], s) in self.log_eof for s in ("stdout", "stderr")):
                self.log_draining.discard(key[:2])
        return None

    # -- log pulling ---------------------------------------------------------------------------------------------
    async def _request_log(self, job_id: int, attempt: int, stream: str) -> None:
        key = (job_id, attempt, stream)
        if key in self.log_asked:
            return
        payload = {
            "job_id": str(job_id),
            "attempt": attempt,
            "stream": stream,
            "offset": self.log_next.get(key, 0),
            "limit_bytes": LOG_CHUNK_BYTES,
        }
        msg = protocol.message("logs_request", payload)
        self.log_waiting[msg["id"]] = _LogRequest(key, payload["offset"], time.monotonic())
        self.log_asked.add(key)
        await self.send_msg(msg)

    async def _pull_logs(self) -> None:
        # The placements of the desired state last sent: what the agent runs (no database read a node a pull).
        now = time.monotonic()
        listened = await listeners.listened()
        for job_id, attempt in self.placements | self.log_draining:
            draining = (job_id, attempt) in self.log_draining
            watched = listened is None or groups.job(job_id) in listened
            for stream in ("stdout", "stderr"):
                quiet = self.log_quiet.get((job_id, attempt, stream))
                if quiet is not None and not draining:
                    wait_s, asked_at = quiet[0], quiet[1] - quiet[0]
                    if now < asked_at + (min(wait_s, LOG_QUIET_MAX_S) if watched else wait_s):
                        continue  # nothing new the last times asked: asked again later
                await self._request_log(job_id, attempt, stream)

    async def _pull_logs_forever(self) -> None:
        while not self.closing:
            await asyncio.sleep(LOG_PULL_INTERVAL_S)
            try:
                # A request the agent has not answered for a while is asked again; a slow answer is still taken
                # (dropping every answer older than one interval would starve a busy node's logs).
                cutoff = time.monotonic() - LOG_REQUEST_TIMEOUT_S
                for request_id in [i for i, r in self.log_waiting.items() if r.asked_at < cutoff]:
                    self.log_asked.discard(self.log_waiting.pop(request_id).key)
                await self._pull_logs()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("node %s: log pull failed", self.node_name, exc_info=True)
