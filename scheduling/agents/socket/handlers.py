"""What each kind of report does on the portal's side (`ReportHandlers`): hello, heartbeat, job_status, event,
ack, logs and metrics, each calling its writes in scheduling.agents.reports on the agents' database threads, and
the answer every report gets (`answer`).

A report that fails is answered; it never drops the connection. One the database failed on (a deadlock it
broke, a lost connection) is acked for a retry: the agent keeps it and sends it again, so a job's start or end is
not dropped. One that fails otherwise is refused: sent again, it would fail again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError

from agent import protocol
from scheduling.agents import live_metrics
from scheduling.agents.reports import heartbeats, hello, job_status, node_events, nodes
from scheduling.agents.reports.heartbeats import Beat
from scheduling.agents.reports.outcome import Outcome
from scheduling.agents.socket import beats
from scheduling.agents.socket.db_threads import db
from scheduling.agents.socket.desired import DesiredStateOut
from scheduling.agents.socket.layer import LAYER_ERRORS, NodeChannel
from scheduling.agents.socket.link import CLOSE_UNAUTHENTICATED, CLOSE_WRONG_NODE, NodeLink
from scheduling.agents.socket.log_pulls import LogPulls
from scheduling.cycle.desired_state import desired_version_raise
from scheduling.history.recorder import gpu_events_record
from scheduling.observability.instruments import AGENT_REPORTS
from scheduling.realtime import groups, listeners

log = logging.getLogger(__name__)
T = TypeVar("T")

# Browsers see utilisation at most this often per node, however often agents send it.
METRICS_PUBLISH_INTERVAL_S = 1.0
MAX_GPUS_PER_SAMPLE = 64
# A batch of samples (agent/protocol.py FEATURES): at most this many are read (an agent sends one every few seconds).
MAX_SAMPLES_PER_BATCH = 30
FINAL_STATES = frozenset({"exited", "stopped", "killed", "launch_failed", "lost"})
# Reports that write: the token is re-checked before each (metrics only relays what browsers may see).
# Heartbeats and log chunks check it in the same database call as their write.
CHECKED = frozenset({"hello", "job_status", "event", "ack"})
# The database failing for now, not the report: answered "send it again".
RETRYABLE = (OperationalError, InterfaceError)


class ReportHandlers:
    def __init__(
        self, link: NodeLink, channel: NodeChannel, desired: DesiredStateOut, pulls: LogPulls
    ) -> None:
        self.link = link
        self.channel = channel
        self.desired = desired
        self.pulls = pulls
        self.last_metrics_at = 0.0
        self.metrics_failing = False
        # The kind of report this connection had refused as the node's last error: the next one of that kind
        # accepted clears it (not any message: an ack or a log answer says nothing about it).
        self.refusal_shown: str | None = None
        # The reports that wait their turn on the node's report lane, by kind.
        self.queued: dict[str, Callable[[dict[str, Any]], Awaitable[Outcome | None]]] = {
            "hello": self.on_hello,
            "job_status": self.on_job_status,
            "event": self.on_event,
            "ack": self.on_ack,
            "logs": self.on_logs,
        }

    # -- answering ---------------------------------------------------------------------------------------------
    async def handle(self, msg: dict[str, Any]) -> None:
        """One report of the report lane: its token re-checked if it writes, handled, and answered."""
        kind = msg["type"]
        handler = self.queued.get(kind)
        if handler is None:
            await self.link.send_msg(
                protocol.ack(msg["id"], ok=False, error=f"unknown message type {kind!r}")
            )
            return
        if kind in CHECKED:
            link = self.link
            current = await self.settled(
                kind, db(nodes.node_token_current)(node_id=link.node_id, token_hash=link.token_hash)
            )
            if isinstance(current, Outcome):  # the check itself failed
                await self.answer(kind, msg, current)
                return
            if not current:
                # The token was rotated (or the node removed) since this connection opened: it speaks for no one.
                await link.refuse(CLOSE_UNAUTHENTICATED)
                return
        await self.answer(kind, msg, await self.settled(kind, handler(msg)))

    async def settled(self, what: str, work: Awaitable[T]) -> T | Outcome:
        """What `work` (handling `what`) returns; where it fails, the Outcome its report is answered with."""
        try:
            return await work
        except RETRYABLE as exc:
            # Not a refusal: the report may be fine and the database failing for now (a deadlock it broke, a
            # lost connection). The agent keeps it and sends it again, so a job's start or end is not dropped.
            log.warning(
                "node %s: %s failed, the agent will send it again: %s", self.link.node_name, what, exc
            )
            return Outcome(False, f"portal error: {type(exc).__name__}", retry=True)
        # A boundary: one bad report must not drop the node's connection (the agent would send it again on the
        # next, and fail again, forever).
        except Exception as exc:
            log.exception("node %s: %s failed", self.link.node_name, what)
            return Outcome(False, f"portal error: {type(exc).__name__}")

    async def answer(self, kind: str, msg: dict[str, Any], outcome: Outcome | None) -> None:
        """Count a handled report, keep the node's newest refusal, and ack it where the agent waits for one."""
        refused = outcome is not None and not outcome.ok
        AGENT_REPORTS.labels(
            kind, "stale" if refused and outcome.stale else "refused" if refused else "ok"
        ).inc()
        try:
            if refused and not outcome.retry and not outcome.stale:
                # The node's conditions show its newest refusal, until a report is accepted again.
                await db(nodes.node_error_note)(
                    node_id=self.link.node_id,
                    message=f"{kind} refused: {outcome.error}",
                    kind=nodes.NodeErrorKind.REFUSED,
                )
                self.refusal_shown = kind
            elif not refused and self.refusal_shown == kind:
                self.refusal_shown = None
                await db(nodes.node_error_clear)(
                    node_id=self.link.node_id, kinds=(nodes.NodeErrorKind.REFUSED,)
                )
        except (DatabaseError, InterfaceError) as exc:
            log.warning("node %s: its last error not kept (%s)", self.link.node_name, exc)
        # Reliable messages are always acked; others only when refused, so the agent can log why.
        if kind in protocol.RELIABLE or (outcome is not None and not outcome.ok):
            ok = outcome.ok if outcome is not None else True
            extra: dict[str, Any] = {"retry": True} if outcome is not None and outcome.retry else {}
            if kind == "hello" and ok:
                extra["features"] = list(protocol.FEATURES)  # what this portal takes (agent/protocol.py)
            await self.link.send_msg(
                protocol.ack(msg["id"], ok=ok, error=outcome.error if outcome else None, **extra)
            )

    # -- the report lane's kinds -------------------------------------------------------------------------------
    async def on_hello(self, msg: dict[str, Any]) -> Outcome:
        payload = msg["payload"]
        node = payload.get("node")
        if node is not None and node != self.link.node_name:
            await self.link.refuse(CLOSE_WRONG_NODE)
            return Outcome(False, f"this token is for node {self.link.node_name}, not {node}")
        await db(hello.node_hello)(node_id=self.link.node_id, payload=payload)
        self.desired.after_hello = True
        # The inventory may have renamed GPUs (their UUIDs): the agent gets the state it can run.
        await self.desired.send(force=True)
        await self.pulls.resume()
        return Outcome(True)

    async def on_job_status(self, msg: dict[str, Any]) -> Outcome:
        payload = msg["payload"]
        outcome = await db(job_status.job_report)(node_id=self.link.node_id, payload=payload)
        if outcome.ok and payload.get("state") in FINAL_STATES:
            try:
                ended = int(payload["job_id"]), int(payload["attempt"])
            except (KeyError, TypeError, ValueError):
                ended = None
            if ended is not None:
                await self.pulls.drain(*ended)
            await self.pulls.pull()
        return outcome

    async def on_event(self, msg: dict[str, Any]) -> Outcome:
        # Recorded once per message id, however often it arrives.
        return await db(node_events.node_event)(
            node_id=self.link.node_id, payload=msg["payload"], message_id=str(msg["id"])
        )

    async def on_ack(self, msg: dict[str, Any]) -> None:
        payload = msg["payload"]
        version = payload.get("desired_version")
        if version is None:
            return
        await db(nodes.node_acked)(node_id=self.link.node_id, version=int(version))
        sent = self.desired.sent_version
        if payload.get("ok") is False and sent is not None and int(version) > sent:
            # The agent holds a newer version than the database knows (a restored database): leapfrog it.
            await db(desired_version_raise)(node_id=self.link.node_id, above=int(version))
            await self.desired.send(force=True)

    async def on_logs(self, msg: dict[str, Any]) -> Outcome | None:
        return await self.pulls.answer(msg["payload"])

    # -- the heartbeat lane's ----------------------------------------------------------------------------------
    async def on_heartbeat(self, payload: dict[str, Any]) -> None:
        link = self.link
        running = payload.get("running")
        seen = await beats.heartbeat_checked(Beat(link.node_id, link.token_hash, running))
        if not seen.token_current:
            # The token was rotated (or the node removed) since this connection opened: it speaks for no one.
            await link.refuse(CLOSE_UNAUTHENTICATED)
            return
        # Recorded: the node's jobs' fences count from now (node_loss.py: the portal counts from this record).
        await link.send_msg(protocol.message("heartbeat_ack", {"seq": payload.get("seq")}))
        if seen.behind:
            # Missed start reports are recorded on the reports' threads, never on the heartbeats'.
            catch_up = db(heartbeats.heartbeat_catch_up)
            link.beside_once(
                "catch-up",
                lambda: catch_up(node_id=link.node_id, running=running, token_hash=link.token_hash),
                "missed start reports",
            )
        if not self.channel.joined:
            await self.channel.join()
        if not self.desired.after_hello:
            return
        held = payload.get("desired_version")
        sent = self.desired.sent_version
        # Resend what the agent missed, and what the database has moved on to since this connection last sent
        # (a change whose notification was lost: Redis restarting, a message dropped), so it still reaches the
        # agent within two heartbeats. Every cycle recomputes every node's state (desired_state_sync), so reading
        # the version is enough; recomputing it here on every heartbeat cost most of the portal's CPU at 1,000
        # nodes (bench/cluster_scale.py). Without the channel layer no cycle runs: then recompute each time.
        missed = held is None or sent is None or int(held) < sent
        if not (missed or not self.channel.joined or seen.desired_version != sent):
            self.desired.doubted = None
            return
        now = (None if held is None else int(held), sent, seen.desired_version)
        if held is not None and sent is not None and self.channel.joined and self.desired.doubted != now:
            # One heartbeat's grace: the cycle's push may be on its way through the channel layer, or the agent
            # still applying what it was sent (starting its jobs). Resending at once read and sent every busy
            # node's state again while a cycle's 8,000 placements were being started (bench/cluster_scale.py).
            self.desired.doubted = now
            return
        self.desired.doubted = None
        # Beside the heartbeats, never ahead of the next one: reading the state back waits its turn with the
        # node's reports, and a heartbeat waiting for it was a heartbeat not recorded (nodes "lost" while a
        # cycle's starts were being reported, bench/cluster_scale.py).
        link.beside_once("resend", lambda: self.desired.send(force=missed), "desired state")

    # -- samples, on the frames' path --------------------------------------------------------------------------
    async def on_metrics(self, msg: dict[str, Any]) -> None:
        """A sample, or (`batch`, from an agent this portal told it takes them) the samples of the last few
        seconds: XID events kept, utilisation relayed to the browsers that listen, every sample of a batch (the
        live charts keep their resolution). Never waits for the database, but to note a sample that failed."""
        try:
            batch = msg["payload"].get("batch")
            if isinstance(batch, list):
                samples = [sample for sample in batch[:MAX_SAMPLES_PER_BATCH] if isinstance(sample, dict)]
                for k, sample in enumerate(samples):
                    await self._sample(sample, every=True, newest=k == len(samples) - 1)
            else:
                await self._sample(msg["payload"])
        # A boundary, as for a report: one bad sample must not drop the node's connection.
        except Exception as exc:
            log.exception("node %s: metrics failed", self.link.node_name)
            await self.answer("metrics", msg, Outcome(False, f"portal error: {type(exc).__name__}"))
        else:
            AGENT_REPORTS.labels("metrics", "ok").inc()

    async def _sample(self, payload: dict[str, Any], *, every: bool = False, newest: bool = True) -> None:
        gpus = payload.get("gpus")
        if isinstance(gpus, list) and any(isinstance(g, dict) and g.get("xid_events") for g in gpus):
            # XID events are kept whatever the throttle below drops: each one matters. Written beside the frames'
            # path, which never waits for the database.
            record = db(gpu_events_record)(
                node_id=self.link.node_id, gpus=[g for g in gpus[:MAX_GPUS_PER_SAMPLE] if isinstance(g, dict)]
            )
            self.link.beside(record, "XID events")
        now = time.monotonic()
        if not every and now - self.last_metrics_at < METRICS_PUBLISH_INTERVAL_S:
            return
        self.last_metrics_at = now
        try:
            await self._publish(payload, newest=newest)
        except (
            LAYER_ERRORS
        ) as exc:  # live utilisation lives in Redis: without it, browsers wait; the node does not
            if not self.metrics_failing:
                log.warning("node %s: live metrics not published (%s)", self.link.node_name, exc)
            self.metrics_failing = True
        else:
            self.metrics_failing = False

    async def _publish(self, payload: dict[str, Any], *, newest: bool = True) -> None:
        """One sample relayed to the groups a browser listens to, and folded into its jobs' usage; the node's
        newest (`newest`) kept as its live sample. A batch's older samples that no browser listens to are read
        only for what the usage needs: typing every field of 8,000 cards' samples a second was the largest part
        of the agents' web processes' CPU after the heartbeats (bench/agent_traffic.py)."""
        node_name = self.link.node_name
        # Only to groups a browser listens to (listeners.py): a send nobody receives still costs a round trip.
        listened = await listeners.listened()
        raw = [g for g in payload.get("gpus") or [] if isinstance(g, dict)]
        to_cluster = listened is None or groups.CLUSTER in listened
        holders_of = self.desired.job_gpus
        heard = to_cluster or any(
            groups.job(job_id) in listened or groups.team(team_id) in listened
            for g in raw
            for job_id, team_id in holders_of.get(str(g.get("uuid")), ())
        )
        convert = live_metrics.gpu_sample if newest or heard else live_metrics.gpu_usage_sample
        gpus = [convert(g) for g in raw]
        at = payload.get("sampled_at")
        at = at if isinstance(at, (int, float)) and not isinstance(at, bool) else None
        per_job: dict[tuple[int, int], list[dict]] = {}
        shared: set[int] = set()
        for g in gpus:
            holders = holders_of.get(str(g.get("uuid")), [])
            for job_id, team_id in holders:
                per_job.setdefault((job_id, team_id), []).append(g)
                if len(holders) > 1:
                    shared.add(job_id)
        await live_metrics.node_sample_keep(
            node_name=node_name,
            sampled_at=at,
            gpus=gpus,
            jobs=[(job_id, job_gpus, job_id not in shared) for (job_id, _), job_gpus in per_job.items()],
            live=newest,
        )
        if not heard:
            return
        if to_cluster:
            await self.channel.publish(
                groups.CLUSTER, {"type": "gpu.metrics", "node": node_name, "at": at, "gpus": gpus}
            )
        for (job_id, team_id), job_gpus in per_job.items():
            msg = {"type": "job.metrics", "job_id": job_id, "node": node_name, "at": at, "gpus": job_gpus}
            for group in (groups.job(job_id), groups.team(team_id)):
                if listened is None or group in listened:
                    await self.channel.publish(group, msg)
