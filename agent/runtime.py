"""The agent loop: sample, enforce, converge on the desired state each tick; talk to the portal per session.

Ticks go on while the portal is unreachable (exits are collected, runtimes and slices enforced); what must
reach the portal (job status, events) waits in an outbox until acknowledged. A session is one connection:
hello first, then everything still unacknowledged, then heartbeats, metrics and reports as they come.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agent import __version__, procfs, protocol
from agent.backends.base import GpuBackend, Sample
from agent.executor import Executor
from agent.placement import FINISHED, Transition, read_json
from agent.reconcile import DesiredState, Reconciler
from agent.watchdog import MemoryWatchdog

log = logging.getLogger("tessera.agent")

# Lines of a log sent as text (a final report's tail, a tail_lines answer) are cut to their last this many
# characters: a job printing 300 KB without a newline has one such line, and a report must always fit a frame.
LOG_LINE_CHARS = 1000
# Offsets and sizes of log files are below this; an answer is sized with numbers this wide.
_WIDEST_OFFSET = 2**63 - 1


class ChannelClosed(Exception):
    pass


class Channel(Protocol):
    """One connection to the portal carrying text frames."""

    async def send(self, text: str) -> None: ...

    async def recv(self) -> str: ...


@dataclass
class _Pending:
    msg: dict[str, Any]
    on_ack: Callable[[dict[str, Any]], None] | None
    sent_at: float | None = None
    retry_at: float | None = None  # the portal failed to handle it: send it again at this time
    retries: int = 0


class MetricsAggregator:
    """Folds samples into at most one metrics message per interval (mean utilisation/power, peak memory)."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self._samples: list[Sample] = []
        self._last_flush = 0.0

    def add(self, sample: Sample) -> None:
        self._samples.append(sample)

    def due(self, now: float) -> bool:
        return bool(self._samples) and now - self._last_flush >= self.interval_s

    def flush(self, now: float, owners: dict[int, str]) -> dict[str, Any] | None:
        if not self.due(now):
            return None
        samples, self._samples = self._samples, []
        self._last_flush = now
        latest = samples[-1]
        gpus = []
        for i, g in enumerate(latest.gpus):
            series = [s.gpus[i] for s in samples if i < len(s.gpus)]
            gpus.append(
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "util_pct": _mean([s.util_pct for s in series]),
                    "mem_util_pct": _mean([s.mem_util_pct for s in series]),
                    "memory_used_mib": _max([s.memory_used_mib for s in series]),
                    "memory_total_mib": g.memory_total_mib,
                    "power_w": _mean([s.power_w for s in series]),
                    "temperature_c": _max([s.temperature_c for s in series]),
                    "sm_clock_mhz": g.sm_clock_mhz,
                    "ecc_uncorrected_volatile": g.ecc_uncorrected_volatile,
                    "xid_events": [x for s in series for x in s.xid_events],
                    "health": g.health,
                    "processes": [
                        {"pid": p.pid, "used_mib": p.used_mib, "placement": owners.get(p.pid)}
                        for p in g.processes
                    ],
                }
            )
        return {"sampled_at": latest.sampled_at, "samples": len(samples), "gpus": gpus}


def _served_by(handle: Any, name: str, port: int) -> bool:
    """The job's own processes listen on the port (read from /proc: another job that took the port first, or
    after the job's server died, is not the job's server and would get the proxy's token); where the job's
    descriptors cannot be read (another user's, the agent not root), whether anything answers there.

    Every tick reads /proc/net/tcp; the job's processes are searched for the socket only when the listening
    socket is not the one found theirs before (socket inodes are not reused while the socket lives)."""
    inodes = frozenset(procfs.listening_inodes(port))
    if not inodes:
        handle.ports_owned.pop(name, None)
        return False
    if handle.ports_owned.get(name) == inodes:
        return True
    pgid = handle.pgid or handle.job_pid
    held = procfs.holds_socket(procfs.group_members(pgid) if pgid else [], set(inodes))
    if held:
        handle.ports_owned[name] = inodes
    else:
        handle.ports_owned.pop(name, None)
    return _answers(port) if held is None else held


def _answers(port: int, *, timeout_s: float = 0.05) -> bool:
    """Something accepts connections on this host's port (a job's server has come up)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _cut_lines(lines: list[str]) -> list[str]:
    return [line if len(line) <= LOG_LINE_CHARS else "…" + line[1 - LOG_LINE_CHARS :] for line in lines]


def _mean(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(sum(vals) / len(vals), 2) if vals else None


def _max(values: list[Any]) -> Any:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


class Agent:
    def __init__(
        self,
        *,
        node_name: str,
        backend: GpuBackend,
        executor: Executor,
        sample_interval_s: float = 1.0,
        heartbeat_s: float = 5.0,
        metrics_interval_s: float = 1.0,
        metrics_batch_s: float = 5.0,
        ack_timeout_s: float = 30.0,
        retry_initial_s: float = 1.0,
        watchdog_tolerance_mib: int = 0,
        watchdog_grace_s: float = 5.0,
        log_tail_lines: int = 20,
        retention_s: float = 7 * 24 * 3600,
        address: str | None = None,
    ) -> None:
        self.node_name = node_name
        self.address = address  # reported in hello: where gang members on other nodes reach this one
        self.backend = backend
        self.executor = executor
        self.sample_interval_s = sample_interval_s
        self.heartbeat_s = heartbeat_s
        self.ack_timeout_s = ack_timeout_s
        self.retry_initial_s = retry_initial_s
        self.log_tail_lines = log_tail_lines
        self.retention_s = retention_s
        self._last_contact = time.monotonic()
        self._last_prune = 0.0
        self.inventory = backend.inventory()
        self.reconciler = Reconciler(executor, known_gpu_uuids=self.inventory.device_uuids())
        self.watchdog = MemoryWatchdog(
            executor, tolerance_mib=watchdog_tolerance_mib, grace_s=watchdog_grace_s
        )
        self.metrics = MetricsAggregator(metrics_interval_s)
        # Samples sent together every metrics_batch_s, once the portal has said it takes batches (its hello ack);
        # one frame a second otherwise.
        self.metrics_batch_s = metrics_batch_s
        self.portal_features: frozenset[str] = frozenset()
        self._batch: list[dict[str, Any]] = []
        self._batch_started = 0.0
        self.started_at = time.time()
        self._state_path = executor.work_dir / "desired.json"
        self.desired: DesiredState | None = self._load_desired()
        self._outbox: dict[str, _Pending] = {}
        self._channel: Channel | None = None
        self._send_lock: asyncio.Lock | None = None
        self._wake: asyncio.Event | None = None
        self._tick_lock: asyncio.Lock | None = None
        self._last_heartbeat = 0.0
        self._heartbeat_seq = 0
        self._health: dict[str, str] = {}
        self._mps_reported = False
        self.last_result = None
        # What the restart found (adopted, or ended meanwhile), then final statuses the portal never
        # acknowledged before the restart: all reported (again).
        queued = set()
        for t in executor.drain_transitions():
            self._queue(self._job_status(t))
            queued.add(t.handle.key)
        for h in executor.handles():
            if h.state == FINISHED and not h.reported and h.key not in queued:
                self._queue(self._job_status(Transition("finished", h)))

    # -- desired state ---------------------------------------------------------------------------------------
    def _load_desired(self) -> DesiredState | None:
        try:
            return DesiredState.from_payload(json.loads(self._state_path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def apply_desired(self, payload: dict[str, Any]) -> tuple[bool, str | None]:
        """Accept a desired state unless it is older than the one held; persisted for restarts."""
        node = payload.get("node")
        if node is not None and node != self.node_name:
            return False, f"desired state for node {node!r}, this is {self.node_name!r}"
        try:
            desired = DesiredState.from_payload(payload)
        except (KeyError, TypeError, ValueError) as exc:
            return False, f"invalid desired state: {exc}"
        if self.desired is not None and desired.version < self.desired.version:
            return False, f"stale version {desired.version} < {self.desired.version}"
        self.desired = desired
        tmp = self._state_path.with_suffix(".tmp")
        # Every job's command and environment are in it: the agent's alone.
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
            fh.write(json.dumps(desired.to_payload()))
        os.replace(tmp, self._state_path)
        return True, None

    # -- one tick ------------------------------------------------------------------------------------------------
    def tick(self) -> list[dict[str, Any]]:
        """Sample, enforce, converge; return the messages this tick produced (reliable ones are queued too)."""
        out: list[dict[str, Any]] = []
        sample = self.backend.sample()
        self.executor.poll()
        for event in self.watchdog.check(sample):
            out.append(self._queue(protocol.message("event", event.to_dict())))
        self.executor.poll()
        # No fence here: each job's supervisor stops its job once the lease (renewed when the portal acknowledges
        # a heartbeat) is older than the job's fence, whether this agent runs or not.
        if self.desired is not None:
            self.last_result = self.reconciler.converge(self.desired)
        self.executor.poll()
        self._housekeeping()
        for t in self.executor.drain_transitions():
            out.append(self._queue(self._job_status(t)))
            if (
                t.kind == "started"
                and t.handle.mps
                and "not found" in t.handle.mps
                and not self._mps_reported
            ):
                self._mps_reported = True
                out.append(
                    self._queue(
                        protocol.message(
                            "event",
                            {
                                "kind": "mps_unavailable",
                                "detail": t.handle.mps,
                                # Expected on a simulated node: the portal says so once, not as a warning.
                                "simulated": self.backend.name == "sim",
                            },
                        )
                    )
                )
        out.extend(self._queue(m) for m in self._ports_news())
        out.extend(self._queue(m) for m in self._image_news())
        self.backend.note_jobs(self.executor.usage_hints())
        for g in sample.gpus:
            if self._health.get(g.uuid, "ok") != g.health:
                detail = {"xid_events": g.xid_events, "ecc_uncorrected_volatile": g.ecc_uncorrected_volatile}
                out.append(
                    self._queue(
                        protocol.message(
                            "event", {"kind": "gpu_health", "gpu_uuid": g.uuid, "health": g.health, **detail}
                        )
                    )
                )
            self._health[g.uuid] = g.health
        self.metrics.add(sample)
        now = time.monotonic()
        heartbeat_now = False
        if self.metrics.due(now):
            folded = self.metrics.flush(now, self._owners(sample))
            if "metrics_batch" not in self.portal_features or self.metrics_batch_s <= 0:
                out.append(protocol.message("metrics", folded))
            else:
                if not self._batch:
                    self._batch_started = now
                self._batch.append(folded)
                xid = any(g.get("xid_events") for g in folded["gpus"])  # a GPU error is not held back
                # A batch holds metrics_batch_s of samples: sent once the last of them is in, with the heartbeat
                # where the portal takes samples there (the heartbeat then goes early).
                full = now - self._batch_started >= self.metrics_batch_s - self.metrics.interval_s - 1e-6
                # Riding the heartbeat only where heartbeats come as often as batches: a longer heartbeat_s is
                # kept (each heartbeat is a write at the portal), the batch then sent alone.
                rides = (
                    "heartbeat_samples" in self.portal_features and self.heartbeat_s <= self.metrics_batch_s
                )
                if xid or (full and not rides):
                    out.append(protocol.message("metrics", {"batch": self._batch}))
                    self._batch = []
                elif full:
                    heartbeat_now = True
        if heartbeat_now or now - self._last_heartbeat >= self.heartbeat_s:
            self._last_heartbeat = now
            out.append(self.heartbeat())
        return out

    def _ports_news(self) -> list[dict[str, Any]]:
        """Where each running placement's web ports listen and which have answered a connection, told to the portal
        when that changes (an event of kind `ports`): its proxy goes there, and the job's page offers "Open" once
        one answers. A gang's ports are its first member's."""
        news = []
        for h in self.executor.active():
            if not h.ports or (h.spec.gang is not None and h.spec.gang.rank != 0):
                continue
            for name, port in h.ports.items():
                if _served_by(h, name, port):
                    h.ports_ready.add(name)
                else:  # not up yet, or no longer the job's (it ended, and something else took the port)
                    h.ports_ready.discard(name)
            said = (dict(h.ports), sorted(h.ports_ready))
            if said != h.ports_said:
                h.ports_said = said
                news.append(
                    protocol.message(
                        "event",
                        {
                            "kind": "ports",
                            "job_id": h.spec.job_id,
                            "attempt": h.spec.attempt,
                            "ports": said[0],
                            "ready": said[1],
                        },
                    )
                )
        return news

    def _image_news(self) -> list[dict[str, Any]]:
        """A job's image present on this node (its supervisor's pull.json): how long the pull took, told once (an
        event of kind `image_ready`, on the job's timeline). A pull that failed ends the job instead."""
        news = []
        for h in self.executor.handles():  # a job that ended within a tick too: its end is not reported yet
            if not h.spec.image or h.image_said or h.reported:
                continue
            pulled = read_json(h.dir / "pull.json")
            if pulled is None or not pulled.get("ok"):
                continue
            h.image_said = True
            news.append(
                protocol.message(
                    "event",
                    {
                        "kind": "image_ready",
                        "job_id": h.spec.job_id,
                        "attempt": h.spec.attempt,
                        "image": h.spec.image,
                        "pull_s": pulled.get("pull_s"),
                        "pulled": bool(pulled.get("pulled")),
                    },
                )
            )
        return news

    def _housekeeping(self) -> None:
        wanted = {j.key for j in self.desired.jobs} if self.desired else set()
        for h in self.executor.handles():
            if h.state == FINISHED and h.reported and h.key not in wanted:
                self.executor.forget(h.key)  # its directory stays: start() would find it, never relaunch
        now = time.monotonic()
        if now - self._last_prune >= 3600:
            self._last_prune = now
            self.executor.prune(older_than_s=self.retention_s, keep=wanted)

    def _owners(self, sample: Sample) -> dict[int, str]:
        """GPU process pid -> placement, through the job's session (a job's workers are its children)."""
        # A job's processes are in its group (pgid = its first process) and its supervisor's session.
        by_group = {h.pgid: h.key for h in self.executor.active() if h.pgid is not None}
        by_group.update({h.pid: h.key for h in self.executor.active() if h.pid is not None})
        owners: dict[int, str] = {}
        for g in sample.gpus:
            for p in g.processes:
                key = by_group.get(p.pid)
                if key is None:
                    st = procfs.read_stat(p.pid)
                    key = by_group.get(st.session) or by_group.get(st.pgrp) if st is not None else None
                if key is not None:
                    owners[p.pid] = key
        return owners

    def running(self) -> list[dict[str, Any]]:
        return [h.summary() for h in self.executor.active()]

    def heartbeat(self) -> dict[str, Any]:
        """The heartbeat, carrying the samples batched since the last one where the portal takes them there."""
        self._heartbeat_seq += 1
        payload = {
            "node": self.node_name,
            "seq": self._heartbeat_seq,
            "uptime_s": round(time.time() - self.started_at, 1),
            "desired_version": self.desired.version if self.desired else None,
            "running": self.running(),
            "waiting": dict(self.last_result.waiting) if self.last_result else {},
            "unacked": len(self._outbox),
        }
        if "heartbeat_samples" in self.portal_features and self._batch:
            payload["samples"], self._batch = self._batch, []
        return protocol.message("heartbeat", payload)

    def hello(self) -> dict[str, Any]:
        return protocol.message(
            "hello",
            {
                "node": self.node_name,
                "hostname": socket.gethostname(),
                "address": self.address,
                "agent_version": __version__,
                "protocol": protocol.PROTOCOL_VERSION,
                "backend": self.backend.name,
                "inventory": self.inventory.to_dict(),
                "capabilities": {
                    "mps": bool(self.executor.mps and self.executor.mps.binary),
                    "mig": any(g.mig_mode_current for g in self.inventory.gpus),
                    "memory_watchdog": True,
                },
                "running": self.running(),
                "desired_version": self.desired.version if self.desired else None,
            },
        )

    def _job_status(self, t: Transition) -> dict[str, Any]:
        h = t.handle
        payload: dict[str, Any] = {
            "job_id": h.spec.job_id,
            "attempt": h.spec.attempt,
            "state": "started" if t.kind in ("started", "adopted") else h.outcome,
            "adopted": h.adopted,
            "pid": h.pid,
            "started_at": h.started_at,
            "gpus": [g.uuid for g in h.spec.gpus],
        }
        if t.kind in ("started", "adopted"):
            payload["mps"] = h.mps
            return protocol.message("job_status", payload)
        payload.update(
            {
                "exit_code": h.exit_code,
                "reason": h.stop_reason or (h.detail or None),
                "finished_at": h.finished_at,  # when it really ended (its supervisor's record)
                "grace_given_s": h.grace_given_s,
                "log_tail": {
                    stream: _cut_lines(self.executor.tail_log(h.key, stream, lines=self.log_tail_lines))
                    for stream in ("stdout", "stderr")
                },
            }
        )
        msg = protocol.message("job_status", payload)
        self._outbox[msg["id"]] = _Pending(msg, on_ack=lambda _a, key=h.key: self.executor.mark_reported(key))
        return msg

    def _queue(self, msg: dict[str, Any]) -> dict[str, Any]:
        if msg["type"] in protocol.RELIABLE and msg["id"] not in self._outbox:
            self._outbox[msg["id"]] = _Pending(msg, on_ack=None)
        return msg

    def pending(self) -> list[dict[str, Any]]:
        return [p.msg for p in list(self._outbox.values())]

    # -- portal messages --------------------------------------------------------------------------------------------
    def handle_message(self, msg: dict[str, Any]) -> list[dict[str, Any]]:
        """React to one portal message; returns the replies to send."""
        self._last_contact = time.monotonic()
        kind, payload = msg["type"], msg["payload"]
        if kind == "ack":
            if payload.get("retry") and not payload.get("ok", True):
                # Not refused: the portal could not handle it now (its database). Keep it; send it again soon.
                pending = self._outbox.get(str(payload.get("ack_id")))
                if pending is not None:
                    delay = min(self.retry_initial_s * 2 ** min(pending.retries, 16), self.ack_timeout_s)
                    pending.retries += 1
                    pending.retry_at = time.monotonic() + delay
                    log.warning(
                        "portal failed to handle %s %s (%s); sending it again in %.1f s",
                        pending.msg["type"],
                        pending.msg["id"],
                        payload.get("error"),
                        delay,
                    )
                return []
            pending = self._outbox.pop(str(payload.get("ack_id")), None)
            if pending is not None:
                if pending.msg["type"] == "hello" and payload.get("ok", True):
                    self.executor.renew_lease()  # the portal recorded the hello as this node's heartbeat
                    features = payload.get("features")
                    self.portal_features = frozenset(
                        f for f in (features if isinstance(features, list) else []) if f in protocol.FEATURES
                    )
                if not payload.get("ok", True):
                    log.warning(
                        "portal refused %s %s: %s",
                        pending.msg["type"],
                        pending.msg["id"],
                        payload.get("error"),
                    )
                if pending.on_ack is not None:
                    pending.on_ack(payload)
            return []
        if kind == "heartbeat_ack":
            # The portal has recorded this node's heartbeat: its jobs' fences count from now.
            self.executor.renew_lease()
            return []
        if kind == "desired_state":
            ok, error = self.apply_desired(payload)
            if ok and self._wake is not None:
                self._wake.set()
            return [
                protocol.ack(
                    msg["id"],
                    ok=ok,
                    error=error,
                    desired_version=self.desired.version if self.desired else None,
                )
            ]
        if kind == "logs_request":
            return [self._logs(msg)]
        return [protocol.ack(msg["id"], ok=False, error=f"unknown message type {kind!r}")]

    def _logs(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Answer a logs_request: raw bytes as base64 (or the last lines as text), sized to fit one frame."""
        p = msg["payload"]
        key = f"{p.get('job_id')}:{p.get('attempt')}"
        stream = p.get("stream", "stdout")
        base = {
            "request_id": msg["id"],
            "job_id": p.get("job_id"),
            "attempt": p.get("attempt"),
            "stream": stream,
        }
        try:
            if p.get("tail_lines") is not None:
                lines = _cut_lines(
                    self.executor.tail_log(key, stream, lines=min(int(p["tail_lines"]), 10_000))
                )
                answer = protocol.message("logs", {**base, "lines": []})
                room = protocol.MAX_FRAME_BYTES - len(protocol.encode(answer))
                answer["payload"]["lines"] = protocol.lines_that_fit(lines, room)
                return answer
            offset = min(max(0, int(p.get("offset", 0))), _WIDEST_OFFSET)
            limit = max(
                0, min(int(p.get("limit_bytes", protocol.MAX_LOG_CHUNK_BYTES)), protocol.MAX_LOG_CHUNK_BYTES)
            )
            answer = protocol.message(
                "logs",
                {
                    **base,
                    "offset": offset,
                    "next_offset": _WIDEST_OFFSET,
                    "size": _WIDEST_OFFSET,
                    "data_b64": "",
                    "eof": False,
                },
            )
            limit = min(limit, protocol.base64_room(answer))
            data, size = self.executor.read_log(key, stream, offset=offset, limit_bytes=limit)
        except (TypeError, ValueError) as exc:
            return protocol.message("logs", {**base, "error": str(exc)})
        handle = self.executor.handle(key)
        answer["payload"].update(
            next_offset=offset + len(data),
            size=size,
            data_b64=base64.b64encode(data).decode("ascii"),
            eof=offset + len(data) >= size and (handle is None or handle.state == FINISHED),
        )
        return answer

    # -- async loop ----------------------------------------------------------------------------------------------
    def _ensure_async(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
            self._send_lock = asyncio.Lock()
            self._tick_lock = asyncio.Lock()

    async def _send(self, msg: dict[str, Any]) -> None:
        channel = self._channel
        if channel is None:
            return  # unreliable messages are dropped while disconnected; reliable ones wait in the outbox
        try:
            text = protocol.encode(msg)
        except protocol.FrameTooLarge as exc:
            # The portal would drop the connection, and with it every other job's reports and logs: this one
            # message is lost instead (never resent).
            log.error("not sending %s %s: %s", msg["type"], msg["id"], exc)
            self._outbox.pop(msg["id"], None)
            return
        pending = self._outbox.get(msg["id"])
        if pending is not None:
            pending.sent_at, pending.retry_at = time.monotonic(), None
        async with self._send_lock:
            await channel.send(text)

    async def run_ticks(self, stop: asyncio.Event) -> None:
        """Tick every sample interval (or at once when a desired state arrives) until stop is set."""
        self._ensure_async()
        while not stop.is_set():
            async with self._tick_lock:
                try:
                    messages = await asyncio.to_thread(self.tick)
                except Exception:  # noqa: BLE001 - one bad tick must not end enforcement for good
                    log.exception("agent tick failed; retrying next interval")
                    messages = []
            for msg in messages:
                try:
                    await self._send(msg)
                except ChannelClosed:
                    break
            await self._resend_overdue()
            self._wake.clear()
            waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waiters, timeout=self.sample_interval_s, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()

    async def _resend_overdue(self) -> None:
        now = time.monotonic()
        for pending in list(self._outbox.values()):
            retry_due = pending.retry_at is not None and now >= pending.retry_at
            if retry_due or (pending.sent_at is not None and now - pending.sent_at >= self.ack_timeout_s):
                try:
                    await self._send(pending.msg)
                except ChannelClosed:
                    return

    async def run_session(self, channel: Channel) -> None:
        """Serve one connection until it closes: hello, the unacknowledged backlog, then replies to the portal."""
        self._ensure_async()
        self._channel = channel
        try:
            self.portal_features = frozenset()  # until this portal's ack of the hello says
            self._batch = []
            hello = self._queue(self.hello())
            # A new hello replaces any older one still waiting for its ack.
            for mid in [m for m, p in self._outbox.items() if p.msg["type"] == "hello" and m != hello["id"]]:
                del self._outbox[mid]
            await self._send(hello)
            for msg in self.pending():
                if msg["id"] != hello["id"]:
                    await self._send(msg)
            await self._send(self.heartbeat())
            while True:
                text = await channel.recv()
                try:
                    msg = protocol.decode(text)
                except protocol.ProtocolError as exc:
                    log.warning("ignoring a malformed portal message: %s", exc)
                    continue
                try:
                    replies = self.handle_message(msg)
                except Exception as exc:  # noqa: BLE001 - a message we cannot handle must not drop the session
                    log.exception("failed to handle a %s message", msg["type"])
                    replies = [protocol.ack(msg["id"], ok=False, error=f"agent error: {type(exc).__name__}")]
                for reply in replies:
                    await self._send(reply)
        finally:
            self._channel = None

    def close(self) -> None:
        self.backend.close()
