"""Samples in batches: an agent sends its samples of the last few seconds in one frame once the portal's ack of
its hello says the portal takes them, and one frame a second to a portal that does not (an older one)."""

from __future__ import annotations

import pytest

from agent import protocol, runtime
from agent.backends.sim import SimBackend
from agent.executor import Executor


@pytest.fixture
def clock(monkeypatch):
    """The agent's monotonic clock, moved by the test."""
    now = [1000.0]
    monkeypatch.setattr(runtime.time, "monotonic", lambda: now[0])
    return now


def _agent(tmp_path) -> runtime.Agent:
    backend = SimBackend({"node": "n1", "gpus": [{"model": "Sim", "count": 2, "memory_mib": 40960}]})
    return runtime.Agent(
        node_name="n1",
        backend=backend,
        executor=Executor(tmp_path),
        metrics_interval_s=1.0,
        metrics_batch_s=5.0,
    )


def _hello_acked(agent: runtime.Agent, **ack) -> None:
    hello = agent._queue(agent.hello())
    agent.handle_message(protocol.ack(hello["id"], **ack))


def _metrics(agent: runtime.Agent, clock: list[float], seconds: int) -> list[dict]:
    sent = []
    for _ in range(seconds):
        clock[0] += 1.0
        sent += [m["payload"] for m in agent.tick() if m["type"] == "metrics"]
    return sent


def test_a_portal_that_takes_batches_gets_five_seconds_of_samples_in_one_frame(tmp_path, clock):
    agent = _agent(tmp_path)
    _hello_acked(agent, features=["metrics_batch", "something-newer"])
    assert agent.portal_features == {"metrics_batch"}
    sent = _metrics(agent, clock, 10)
    assert len(sent) == 2 and all(len(p["batch"]) == 5 for p in sent)
    times = [s["sampled_at"] for p in sent for s in p["batch"]]
    assert times == sorted(times) and len(set(times)) == 10  # every second's sample, in order
    assert {len(s["gpus"]) for p in sent for s in p["batch"]} == {2}


def test_a_portal_that_says_nothing_of_batches_gets_a_frame_a_second(tmp_path, clock):
    agent = _agent(tmp_path)
    _hello_acked(agent)  # an older portal: its ack names no features
    sent = _metrics(agent, clock, 5)
    assert len(sent) == 5 and all("batch" not in p and len(p["gpus"]) == 2 for p in sent)


def _frames(agent: runtime.Agent, clock: list[float], seconds: int) -> list[dict]:
    sent = []
    for _ in range(seconds):
        clock[0] += 1.0
        sent += [m for m in agent.tick() if m["type"] in ("metrics", "heartbeat")]
    return sent


def test_a_portal_that_takes_samples_in_heartbeats_gets_one_frame_a_heartbeat_period(tmp_path, clock):
    agent = _agent(tmp_path)
    _hello_acked(agent, features=["metrics_batch", "heartbeat_samples"])
    agent._last_heartbeat = clock[0]  # the heartbeat sent on connecting
    frames = _frames(agent, clock, 20)
    assert {m["type"] for m in frames} == {"heartbeat"} and len(frames) == 4
    samples = [s for m in frames for s in m["payload"]["samples"]]
    times = [s["sampled_at"] for s in samples]
    assert len(samples) == 20 and times == sorted(times) and len(set(times)) == 20  # every second's, in order
    assert {m["payload"]["seq"] for m in frames} == {1, 2, 3, 4}


def test_samples_ride_heartbeats_only_where_the_portal_said_so(tmp_path, clock):
    agent = _agent(tmp_path)
    _hello_acked(agent, features=["metrics_batch"])  # a portal from before heartbeat_samples
    frames = _frames(agent, clock, 10)
    assert all("samples" not in m["payload"] for m in frames if m["type"] == "heartbeat")
    assert sum(len(m["payload"]["batch"]) for m in frames if m["type"] == "metrics") == 10


def test_a_longer_heartbeat_period_is_kept_and_the_batches_go_alone(tmp_path, clock):
    """heartbeat_s 15, batches of 5 s: each heartbeat is a write at the portal, so its period is kept."""
    agent = _agent(tmp_path)
    agent.heartbeat_s = 15.0
    _hello_acked(agent, features=["metrics_batch", "heartbeat_samples"])
    agent._last_heartbeat = clock[0]
    frames = _frames(agent, clock, 30)
    assert [m["type"] for m in frames].count("heartbeat") == 2
    sent = sum(len(m["payload"].get("batch", m["payload"].get("samples", []))) for m in frames)
    assert sent == 30 - len(agent._batch)  # every sample sent once, in a batch or riding a heartbeat
