"""The agent loop against a real websocket server (auth header, hello/heartbeat/ack, reconnect with the whole
desired state) and against an in-process channel."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import sys
import time
from pathlib import Path

import pytest
from websockets.asyncio.server import serve

from agent import protocol
from agent.backends.sim import SimBackend
from agent.executor import Executor
from agent.jobspec import JobSpec
from agent.runtime import Agent
from agent.transport import Backoff, QueueChannel, WebSocketConnector, connect_websocket, run_agent, ws_url
from tests.support import TIMEOUT_SCALE, holds_for, refusing_address, wait_for_async

TOKEN = "node-token-123"
SIM = {
    "node": "sim-1",
    "gpus": [{"model": "Sim A100", "count": 2, "memory_mib": 81920, "sharing": "timeslice"}],
}


def _agent(tmp_path: Path, **kw) -> Agent:
    return Agent(
        node_name="sim-1",
        backend=SimBackend(SIM),
        executor=Executor(tmp_path),
        sample_interval_s=0.1,
        metrics_interval_s=0.2,
        heartbeat_s=kw.pop("heartbeat_s", 0.2),
        **kw,
    )


def _job(agent: Agent, job_id: str, code: str, gpu: int = 0) -> dict:
    g = agent.inventory.gpus[gpu]
    return {
        "job_id": job_id,
        "attempt": 1,
        "command": [sys.executable, "-c", code],
        "env": {},
        "gpus": [
            {
                "uuid": g.uuid,
                "index": g.index,
                "memory_mib": 4096,
                "compute_pct": 50,
                "sharing": "timeslice",
            }
        ],
        "max_runtime_s": 60,
        "grace_s": 1,
    }


class Portal:
    """A tiny portal: checks the bearer token, records what agents send, acks, pushes desired state."""

    def __init__(self, desired: list[dict], *, ack_job_status: bool = True, pull_logs: bool = False) -> None:
        self.desired = desired  # the whole desired state sent on each connection, by connection number
        self.ack_job_status = ack_job_status
        # Once a job has exited, read both its streams whole, asking for more than the agent may send at once.
        self.pull_logs = pull_logs
        self.log_bytes: dict[str, bytes] = {"stdout": b"", "stderr": b""}
        self.log_done: set[str] = set()
        self.frame_bytes: list[int] = []
        self.headers: list[dict[str, str]] = []
        self.received: list[list[dict]] = []
        self.rejected = 0
        self.drop_after: Callable | None = None
        self.server = None
        self.port = 0

    def process_request(self, connection, request):
        self.headers.append({k: request.headers.get(k) for k in ("Authorization", "X-Tessera-Node")})
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.rejected += 1
            return connection.respond(401, "bad token\n")
        return None

    async def handler(self, ws) -> None:
        n = len(self.received)
        got: list[dict] = []
        self.received.append(got)
        desired = self.desired[min(n, len(self.desired) - 1)]
        async for text in ws:
            self.frame_bytes.append(len(text.encode()))
            msg = protocol.decode(text)
            got.append(msg)
            if self.pull_logs:
                await self._pull_logs(ws, msg)
            if msg["type"] == "hello":
                await ws.send(protocol.encode(protocol.ack(msg["id"])))
                await ws.send(protocol.encode(protocol.message("desired_state", desired)))
            elif msg["type"] == "job_status" and self.ack_job_status:
                await ws.send(protocol.encode(protocol.ack(msg["id"])))
            elif msg["type"] == "event":
                await ws.send(protocol.encode(protocol.ack(msg["id"])))
            if self.drop_after is not None and self.drop_after(n, got):
                await ws.close()
                return

    async def _pull_logs(self, ws, msg: dict) -> None:
        p = msg["payload"]
        if msg["type"] == "job_status" and p["state"] == "exited":
            streams = [(s, 0) for s in ("stdout", "stderr")]
        elif msg["type"] == "logs":
            self.log_bytes[p["stream"]] += base64.b64decode(p["data_b64"], validate=True)
            if p["eof"]:
                self.log_done.add(p["stream"])
                return
            streams = [(p["stream"], p["next_offset"])]
        else:
            return
        for stream, offset in streams:
            ask = {"job_id": p["job_id"], "attempt": p["attempt"], "stream": stream, "offset": offset}
            request = protocol.message("logs_request", {**ask, "limit_bytes": 64 * 1024 * 1024})
            await ws.send(protocol.encode(request))

    async def __aenter__(self):
        self.server = await serve(self.handler, "127.0.0.1", self.port, process_request=self.process_request)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        return ws_url(f"http://127.0.0.1:{self.port}")


from collections.abc import Callable  # noqa: E402


async def _until(predicate, timeout_s: float = 15.0):
    return await wait_for_async("the condition", predicate, timeout_s=timeout_s, interval_s=0.02)


def _of(messages: list[dict], type_: str) -> list[dict]:
    return [m for m in messages if m["type"] == type_]


def _cleanup(agent: Agent) -> None:
    for h in agent.executor.active():
        agent.executor.stop(h.key, reason="not_desired", grace_s=0)
    for h in agent.executor.handles():
        agent.executor.wait(h.key, 10)


def test_ws_url_points_at_the_agent_route():
    assert ws_url("http://portal:8000") == "ws://portal:8000/ws/agent/"
    assert ws_url("https://gpu.example.org/tessera/") == "wss://gpu.example.org/tessera/ws/agent/"
    assert ws_url("wss://p/ws/agent/") == "wss://p/ws/agent/"
    with pytest.raises(ValueError):
        ws_url("portal:8000")


def test_the_agent_authenticates_says_hello_runs_its_desired_state_and_reports(tmp_path):
    async def scenario():
        agent = _agent(tmp_path)
        desired = {"version": 7, "node": "sim-1", "jobs": [_job(agent, "j1", "print('hello from j1')")]}
        stop = asyncio.Event()
        async with Portal([desired]) as portal:
            connector = lambda: connect_websocket(portal.url, token=TOKEN, node_name="sim-1")  # noqa: E731
            task = asyncio.create_task(run_agent(agent, connector, stop=stop, backoff=Backoff(0.05, 0.2)))
            try:
                await _until(
                    lambda: (
                        [
                            m
                            for m in _of(portal.received[0], "job_status")
                            if m["payload"]["state"] == "exited"
                        ]
                        if portal.received
                        else None
                    )
                )
                # A heartbeat after the desired state was applied reports its version (earlier ones may not).
                await _until(
                    lambda: any(
                        b["payload"].get("desired_version") == 7 for b in _of(portal.received[0], "heartbeat")
                    )
                )
                await _until(lambda: _of(portal.received[0], "metrics"))
                await _until(lambda: not agent.pending())
            finally:
                stop.set()
                await task
        return agent, portal

    agent, portal = asyncio.run(scenario())
    assert portal.headers[0]["Authorization"] == f"Bearer {TOKEN}"
    assert portal.headers[0]["X-Tessera-Node"] == "sim-1"
    msgs = portal.received[0]
    assert msgs[0]["type"] == "hello"
    hello = msgs[0]["payload"]
    assert hello["node"] == "sim-1" and len(hello["inventory"]["gpus"]) == 2
    assert hello["inventory"]["gpus"][0]["sharing_mode"] == "timeslice"
    acks = _of(msgs, "ack")
    assert acks and acks[0]["payload"]["ok"] is True and acks[0]["payload"]["desired_version"] == 7
    statuses = [m["payload"] for m in _of(msgs, "job_status")]
    assert [s["state"] for s in statuses] == ["started", "exited"]
    assert statuses[1]["exit_code"] == 0 and statuses[1]["log_tail"]["stdout"] == ["hello from j1"]
    beats = [m["payload"] for m in _of(msgs, "heartbeat")]
    assert any(b["desired_version"] == 7 for b in beats) and all(b["node"] == "sim-1" for b in beats)
    assert _of(msgs, "metrics") and len(_of(msgs, "metrics")[0]["payload"]["gpus"]) == 2
    assert json.loads((agent.executor.handle("j1:1").dir / "outcome.json").read_text())["reported"] is True


def test_300_kb_of_nul_bytes_and_of_random_binary_reach_a_portal_with_1_mib_frames_over_one_connection(
    tmp_path,
):
    # The websockets server, like daphne, refuses a message over 1 MiB by closing the connection.
    noise = random.Random(6).randbytes(300_000)
    (tmp_path / "noise.bin").write_bytes(noise)
    code = (
        "import sys; sys.stdout.buffer.write(bytes(300_000)); "
        f"sys.stderr.buffer.write(open({str(tmp_path / 'noise.bin')!r}, 'rb').read())"
    )

    async def scenario():
        agent = _agent(tmp_path)
        desired = {"version": 1, "jobs": [_job(agent, "bin", code)]}
        stop = asyncio.Event()
        async with Portal([desired], pull_logs=True) as portal:
            connector = lambda: connect_websocket(portal.url, token=TOKEN, node_name="sim-1")  # noqa: E731
            task = asyncio.create_task(run_agent(agent, connector, stop=stop, backoff=Backoff(0.05, 0.2)))
            try:
                await _until(lambda: portal.log_done == {"stdout", "stderr"}, timeout_s=30)
            finally:
                stop.set()
                await task
        return portal

    portal = asyncio.run(scenario())
    assert portal.log_bytes == {"stdout": bytes(300_000), "stderr": noise}
    assert len(portal.received) == 1, "the agent's connection was dropped and made again"
    assert max(portal.frame_bytes) <= protocol.MAX_FRAME_BYTES
    answers = _of(portal.received[0], "logs")
    assert len(answers) > 2 and all(
        len(base64.b64decode(m["payload"]["data_b64"])) <= protocol.MAX_LOG_CHUNK_BYTES for m in answers
    )
    # The final report carries the last lines as text, cut short: 300 KB without a newline is one line.
    exited = [m for m in _of(portal.received[0], "job_status") if m["payload"]["state"] == "exited"][0]
    (line,) = exited["payload"]["log_tail"]["stdout"]
    assert line.endswith("\0" * 10) and len(line) <= 1000


def test_a_message_over_the_frame_limit_is_not_sent_and_the_session_goes_on(tmp_path):
    async def scenario():
        agent = _agent(tmp_path)
        mine, portal = QueueChannel.pair()
        agent._channel = mine
        agent._ensure_async()
        huge = agent._queue(
            protocol.message("event", {"kind": "x", "detail": "y" * protocol.MAX_FRAME_BYTES})
        )
        await agent._send(huge)
        await agent._send(agent.heartbeat())
        return protocol.decode(await asyncio.wait_for(portal.recv(), 5)), agent

    first, agent = asyncio.run(scenario())
    assert first["type"] == "heartbeat"  # the oversized event never went out, and is not kept to be resent
    assert agent.pending() == []


def test_a_logs_answer_fits_one_frame_whatever_the_portal_asks_and_whatever_the_bytes(tmp_path):
    agent = _agent(tmp_path)
    agent.apply_desired(
        {"version": 1, "jobs": [_job(agent, "nul", "import sys; sys.stdout.buffer.write(bytes(1 << 20))")]}
    )
    agent.tick()
    agent.executor.wait("nul:1", 10)
    got, offset, frames = b"", 0, []
    while True:
        ask = {"job_id": "nul", "attempt": 1, "stream": "stdout", "offset": offset, "limit_bytes": 1 << 30}
        text = protocol.encode(agent.handle_message(protocol.message("logs_request", ask))[0])
        frames.append(len(text))
        p = protocol.decode(text)["payload"]
        got += base64.b64decode(p["data_b64"])
        assert p["next_offset"] == offset + len(base64.b64decode(p["data_b64"]))
        offset = p["next_offset"]
        if p["eof"]:
            break
    assert got == bytes(1 << 20) and max(frames) <= protocol.MAX_FRAME_BYTES and len(frames) == 4
    tail = agent.handle_message(
        protocol.message(
            "logs_request", {"job_id": "nul", "attempt": 1, "stream": "stdout", "tail_lines": 10_000}
        )
    )[0]
    assert len(protocol.encode(tail)) <= protocol.MAX_FRAME_BYTES and len(tail["payload"]["lines"]) == 1
    _cleanup(agent)


def test_a_bad_token_gets_no_session_and_the_agent_keeps_retrying(tmp_path):
    async def scenario():
        agent = _agent(tmp_path)
        stop = asyncio.Event()
        async with Portal([{"version": 1, "jobs": []}]) as portal:
            connector = lambda: connect_websocket(portal.url, token="wrong", node_name="sim-1")  # noqa: E731
            task = asyncio.create_task(run_agent(agent, connector, stop=stop, backoff=Backoff(0.02, 0.05)))
            await _until(lambda: portal.rejected >= 3)
            stop.set()
            await task
        return portal

    portal = asyncio.run(scenario())
    assert portal.received == []
    assert all(h["Authorization"] == "Bearer wrong" for h in portal.headers)


# How long the portal is down in the reconnect test: long enough that a backoff doubling from 0.5 s without a
# knock would have waited until 15.5 s, 7.5 s after the portal came back.
PORTAL_DOWN_S = 8.0


def test_an_agent_is_back_within_a_second_or_two_of_the_portal_however_long_it_was_down(tmp_path):
    """Each second the portal is away comes off the outage its jobs' fence tolerates: while nothing answers at the
    portal's address, the agent knocks once a second and reconnects as soon as something does."""

    async def scenario():
        agent = _agent(tmp_path, heartbeat_s=5)
        held, address = refusing_address()
        port = int(address.rsplit(":", 1)[1])
        portal = Portal([{"version": 1, "jobs": []}])
        portal.port = port
        stop = asyncio.Event()
        connector = WebSocketConnector(portal.url, token=TOKEN, node_name="sim-1")
        task = asyncio.create_task(run_agent(agent, connector, stop=stop))
        try:
            await asyncio.sleep(PORTAL_DOWN_S)  # the outage itself: connections to the port are refused
            held.close()
            async with portal:
                back_at = time.monotonic()
                await _until(lambda: portal.received and _of(portal.received[0], "hello"), timeout_s=30)
                reconnected_after_s = time.monotonic() - back_at
        finally:
            held.close()
            stop.set()
            await task
        return reconnected_after_s

    reconnected_after_s = asyncio.run(scenario())
    # A knock each second: about one second at most, and far from the 7.5 s a bare doubling backoff waited.
    assert reconnected_after_s < 3.0, f"back {reconnected_after_s:.1f} s after the portal"


def test_the_reconnect_backoff_is_capped_at_the_heartbeat_interval():
    backoff = Backoff.for_heartbeat(5.0)
    delays = [backoff.next_delay() for _ in range(12)]
    assert max(delays) <= 5.0 and delays[-1] >= 5.0 * 0.8
    assert Backoff.for_heartbeat(0.1).max_s == 1.0 and Backoff.for_heartbeat(120).max_s == 30.0


def test_after_a_reconnect_the_agent_converges_on_the_whole_state_and_resends_what_was_not_acked(tmp_path):
    async def scenario():
        agent = _agent(tmp_path, heartbeat_s=5)
        sleeper = "import time; print('up', flush=True); time.sleep(60)"
        first = {"version": 1, "jobs": [_job(agent, "a", sleeper)]}
        second = {"version": 2, "jobs": [_job(agent, "a", sleeper), _job(agent, "b", sleeper, gpu=1)]}
        stop = asyncio.Event()
        async with Portal([first, second], ack_job_status=False) as portal:
            # Drop the first connection as soon as the agent reported job a started (never acked).
            portal.drop_after = lambda n, got: n == 0 and any(m["type"] == "job_status" for m in got)
            connector = lambda: connect_websocket(portal.url, token=TOKEN, node_name="sim-1")  # noqa: E731
            task = asyncio.create_task(run_agent(agent, connector, stop=stop, backoff=Backoff(0.05, 0.1)))
            try:
                await _until(
                    lambda: (
                        len(portal.received) >= 2
                        and any(
                            m["type"] == "job_status" and m["payload"]["job_id"] == "b"
                            for m in portal.received[1]
                        )
                    )
                )
            finally:
                stop.set()
                await task
        return agent, portal

    agent, portal = asyncio.run(scenario())
    try:
        first_started = [m for m in _of(portal.received[0], "job_status") if m["payload"]["job_id"] == "a"]
        again = [m for m in _of(portal.received[1], "job_status") if m["payload"]["job_id"] == "a"]
        assert (
            first_started and again and again[0]["id"] == first_started[0]["id"]
        )  # the same message, resent
        hello2 = _of(portal.received[1], "hello")[0]["payload"]
        assert [r["job_id"] for r in hello2["running"]] == ["a"] and hello2["desired_version"] == 1
        assert agent.desired.version == 2
        launched = [h for h in agent.executor.handles() if h.spec.job_id == "a"]
        assert len(launched) == 1 and launched[0].state == "running"  # a was not launched twice
        assert agent.executor.handle("b:1").state == "running"
    finally:
        _cleanup(agent)


def test_the_agent_loop_runs_in_process_against_a_message_source(tmp_path):
    async def scenario():
        agent = _agent(tmp_path)
        mine, portal = QueueChannel.pair()
        stop = asyncio.Event()
        ticks = asyncio.create_task(agent.run_ticks(stop))
        session = asyncio.create_task(agent.run_session(mine))
        seen: list[dict] = []

        async def recv_until(pred):
            while True:
                msg = protocol.decode(await asyncio.wait_for(portal.recv(), 10))
                seen.append(msg)
                if pred(msg):
                    return msg

        hello = await recv_until(lambda m: m["type"] == "hello")
        await portal.send(protocol.encode(protocol.ack(hello["id"])))
        desired = {"version": 3, "jobs": [_job(agent, "q", "print('in process')")]}
        sent = protocol.message("desired_state", desired)
        await portal.send(protocol.encode(sent))
        ack = await recv_until(lambda m: m["type"] == "ack")
        exited = await recv_until(lambda m: m["type"] == "job_status" and m["payload"]["state"] == "exited")
        stale = protocol.message("desired_state", {"version": 2, "jobs": []})
        await portal.send(protocol.encode(stale))
        stale_ack = await recv_until(lambda m: m["type"] == "ack" and m["payload"]["ack_id"] == stale["id"])
        foreign = protocol.message("desired_state", {"version": 9, "node": "other", "jobs": []})
        await portal.send(protocol.encode(foreign))
        foreign_ack = await recv_until(
            lambda m: m["type"] == "ack" and m["payload"]["ack_id"] == foreign["id"]
        )
        req = protocol.message("logs_request", {"job_id": "q", "attempt": 1, "stream": "stdout", "offset": 0})
        await portal.send(protocol.encode(req))
        logs = await recv_until(lambda m: m["type"] == "logs")
        tail_req = protocol.message(
            "logs_request", {"job_id": "q", "attempt": 1, "stream": "stdout", "tail_lines": 5}
        )
        await portal.send(protocol.encode(tail_req))
        tail = await recv_until(
            lambda m: m["type"] == "logs" and m["payload"]["request_id"] == tail_req["id"]
        )
        stop.set()
        mine.close()
        with contextlib.suppress(Exception):
            await session
        await ticks
        return sent, ack, exited, stale_ack, foreign_ack, logs, tail, agent

    sent, ack, exited, stale_ack, foreign_ack, logs, tail, agent = asyncio.run(scenario())
    assert ack["payload"] == {"ack_id": sent["id"], "ok": True, "error": None, "desired_version": 3}
    assert exited["payload"]["exit_code"] == 0
    assert stale_ack["payload"]["ok"] is False and "stale" in stale_ack["payload"]["error"]
    assert foreign_ack["payload"]["ok"] is False and agent.desired.version == 3
    assert base64.b64decode(logs["payload"]["data_b64"]) == b"in process\n" and logs["payload"]["eof"] is True
    assert logs["payload"]["size"] == logs["payload"]["next_offset"] == len("in process\n")
    assert tail["payload"]["lines"] == ["in process"]


def test_a_job_whose_agent_hears_nothing_from_the_portal_is_stopped_at_its_fence(tmp_path):
    """Heartbeat acks renew the lease; without them the job's supervisor stops it once its fence has passed,
    the agent reports how it ended, and never starts it again."""
    agent = Agent(
        node_name="sim-1",
        backend=SimBackend(SIM),
        executor=Executor(tmp_path, fence_after_s=1.0),
        sample_interval_s=0.1,
        heartbeat_s=0.2,
    )
    agent.apply_desired({"version": 1, "jobs": [_job(agent, "f", "import time; time.sleep(60)")]})
    agent.tick()
    h = agent.executor.handle("f:1")
    assert h.state == "running"

    def acknowledged_and_running() -> bool:
        agent.handle_message(protocol.message("heartbeat_ack", {"seq": 1}))
        agent.tick()
        return h.state == "running"

    # Twice the fence, acknowledged every 0.1 s (a late one still within the fence): the job runs on.
    holds_for("the job runs on while the portal acknowledges", acknowledged_and_running, for_s=2.0)
    done = agent.executor.wait("f:1", 10)  # silence from here on
    assert done.outcome == "stopped" and done.stop_reason == "fenced"
    messages = agent.tick()
    assert agent.executor.launches == 1  # fenced: not started again
    statuses = [m["payload"] for m in messages if m["type"] == "job_status"]
    assert [(s["job_id"], s["state"], s["reason"]) for s in statuses] == [("f", "stopped", "fenced")]


def test_a_failing_tick_does_not_stop_the_loop(tmp_path):
    agent = _agent(tmp_path)
    real_sample = agent.backend.sample
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("driver hiccup")
        return real_sample()

    agent.backend.sample = flaky

    async def scenario():
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run_ticks(stop))
        await _until(lambda: calls["n"] >= 3)
        stop.set()
        await task

    asyncio.run(scenario())
    assert calls["n"] >= 3


def test_a_job_that_ended_while_the_agent_was_down_is_reported_once_after_the_restart(tmp_path):
    first = Executor(tmp_path)
    h = first.start(
        JobSpec.from_dict({"job_id": "gone", "attempt": 1, "command": [sys.executable, "-c", "print(1)"]})
    )
    h.popen.wait()  # it ends while no agent watches (no outcome written yet)
    agent = _agent(tmp_path)
    statuses = [m["payload"] for m in agent.pending() if m["type"] == "job_status"]
    assert [(s["job_id"], s["state"], s["exit_code"]) for s in statuses] == [("gone", "exited", 0)]


def test_a_report_the_portal_failed_to_handle_is_sent_again_and_one_it_refused_is_not(tmp_path):
    async def scenario():
        agent = _agent(tmp_path, retry_initial_s=0.2)
        mine, portal = QueueChannel.pair()
        stop = asyncio.Event()
        ticks = asyncio.create_task(agent.run_ticks(stop))
        session = asyncio.create_task(agent.run_session(mine))
        statuses: list[tuple[float, dict]] = []

        async def recv_until(pred):
            while True:
                msg = protocol.decode(await asyncio.wait_for(portal.recv(), 10))
                if msg["type"] == "job_status":
                    statuses.append((time.monotonic(), msg))
                if pred(msg):
                    return msg

        hello = await recv_until(lambda m: m["type"] == "hello")
        await portal.send(protocol.encode(protocol.ack(hello["id"])))
        desired = {"version": 1, "jobs": [_job(agent, "r", "pass")]}
        await portal.send(protocol.encode(protocol.message("desired_state", desired)))
        started = await recv_until(lambda m: m["type"] == "job_status" and m["payload"]["state"] == "started")
        # The portal's database failed: not a refusal. The same report comes back, after the retry delay.
        failed_at = time.monotonic()
        error = "portal error: OperationalError"
        await portal.send(protocol.encode(protocol.ack(started["id"], ok=False, error=error, retry=True)))
        again = await recv_until(lambda m: m["type"] == "job_status" and m["id"] == started["id"])
        resent_after_s = time.monotonic() - failed_at
        # A refusal settles it: never sent again (listen past several retry delays).
        await portal.send(protocol.encode(protocol.ack(started["id"], ok=False, error="stale report")))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(recv_until(lambda m: False), timeout=1.5)
        stop.set()
        mine.close()
        with contextlib.suppress(Exception):
            await session
        await ticks
        return started, again, resent_after_s, statuses, agent

    started, again, resent_after_s, statuses, agent = asyncio.run(scenario())
    assert again["payload"] == started["payload"]
    assert 0.15 <= resent_after_s < 5 * TIMEOUT_SCALE, resent_after_s
    assert [m["id"] for _, m in statuses].count(started["id"]) == 2
    assert started["id"] not in {m["id"] for m in agent.pending()}
