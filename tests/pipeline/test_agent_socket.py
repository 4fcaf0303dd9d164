"""An agent's token speaks for its own node only, over the real consumer: no logs or events for another node's job."""

from __future__ import annotations

import asyncio
import base64
import logging
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator

from agent import protocol
from scheduling.agents import consumers, joblogs
from scheduling.cycle import apply, lease
from scheduling.engine import types as eng
from scheduling.inventory.models import Gpu, Node
from scheduling.inventory.services import node_issue_token
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import JobEvent
from scheduling.jobs.submit import job_submit
from tests.pipeline.harness import forget_live_metrics

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _in_memory(settings, tmp_path, monkeypatch):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.TESSERA_LOG_DIR = str(tmp_path / "logs")
    monkeypatch.setattr(consumers, "LOG_PULL_INTERVAL_S", 0.05)
    yield
    consumers.db_pool_shutdown()  # no database work of this test's connections outlives it


def _place(job, node_name: str, gpu_index: int):
    placement = eng.Placement(str(job.pk), (eng.Assignment(node_name, gpu_index, 81920, 1000),))
    apply.apply_decisions(decisions=eng.Decisions(placements=(placement,)), epoch=lease.epoch_issue())
    job.refresh_from_db()
    return job


@pytest.fixture
def two_nodes(node, a100, alice, bob, teams):
    """Alice's job placed on a100-01 (node A); bob's on a100-02 (node B), whose agent token we hold."""
    node_b = Node.objects.create(name="a100-02", cpu_milli=128_000, memory_mib=1024 * 1024)
    Gpu.objects.create(node=node_b, index=0, uuid="GPU-b-0", model=a100, memory_mib=81920, numa_node=0)
    on_a = _place(
        job_submit(submitter=alice, team=teams["training"], spec=JobSpec(name="a", command="x", gpus=1)),
        "a100-01",
        0,
    )
    on_b = _place(
        job_submit(submitter=bob, team=teams["inference"], spec=JobSpec(name="b", command="y", gpus=1)),
        "a100-02",
        0,
    )
    return on_a, on_b, node_b, node_issue_token(node=node_b)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def _connect(token: str, name: str) -> WebsocketCommunicator:
    from portal.asgi import application

    headers = [(b"authorization", f"Bearer {token}".encode()), (b"x-tessera-node", name.encode())]
    communicator = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    await communicator.send_to(text_data=protocol.encode(protocol.message("hello", {"node": name})))
    return communicator


async def _next(communicator: WebsocketCommunicator, type_: str, **match) -> dict:
    """The next message of this type (and payload fields) from the portal within 5 s, skipping the others."""
    async with asyncio.timeout(5):
        while True:
            msg = protocol.decode(await communicator.receive_from(timeout=5))
            if msg["type"] == type_ and all(msg["payload"].get(k) == v for k, v in match.items()):
                return msg


def test_node_bs_agent_cannot_record_an_event_on_a_job_of_node_a(two_nodes):
    on_a, _, _, token_b = two_nodes
    event = protocol.message(
        "event",
        {
            "kind": "prevented_neighbour_interference",
            "job_id": str(on_a.pk),
            "attempt": on_a.attempt,
            "used_mib": 1,
            "limit_mib": 1,
        },
    )

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        await communicator.send_to(text_data=protocol.encode(event))
        ack = await _next(communicator, "ack", ack_id=event["id"])
        await communicator.disconnect()
        return ack

    ack = async_to_sync(scenario)()
    assert ack["payload"]["ok"] is False and "not placed on a100-02" in ack["payload"]["error"]
    assert not JobEvent.objects.filter(job=on_a, code="prevented_neighbour_interference").exists()
    from scheduling.cycle.models import NodeSync

    # The refusal is the node's last error, which its conditions show.
    sync = NodeSync.objects.get(node__name="a100-02")
    assert sync.last_error.startswith("event refused: stale event: job ") and sync.last_error_at


def test_an_event_on_its_own_job_keeps_only_known_bounded_fields(two_nodes):
    _, on_b, _, token_b = two_nodes
    event = protocol.message(
        "event",
        {
            "kind": "prevented_neighbour_interference",
            "job_id": str(on_b.pk),
            "attempt": on_b.attempt,
            "used_mib": 6144,
            "limit_mib": 4096,
            "pids": list(range(1000)),
            "gpu_uuid": "GPU-b-0" + "x" * 10_000,
            "junk": "y" * 100_000,
        },
    )

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        await communicator.send_to(text_data=protocol.encode(event))
        ack = await _next(communicator, "ack", ack_id=event["id"])
        await communicator.disconnect()
        return ack

    assert async_to_sync(scenario)()["payload"]["ok"] is True
    data = JobEvent.objects.get(job=on_b, code="prevented_neighbour_interference").data
    assert "junk" not in data and data["used_mib"] == 6144 and data["node"] == "a100-02"
    assert len(data["pids"]) <= 32 and len(data["gpu_uuid"]) <= 200


def test_node_bs_agent_cannot_write_the_log_of_a_job_of_node_a(two_nodes):
    on_a, on_b, _, token_b = two_nodes

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        # The portal asks node B for its own job's log; B answers as if it were A's job, at an offset of its own.
        request = await _next(communicator, "logs_request", job_id=str(on_b.pk), stream="stdout")
        forged = protocol.message(
            "logs",
            {
                "request_id": request["id"],
                "job_id": str(on_a.pk),
                "attempt": on_a.attempt,
                "stream": "stdout",
                "offset": 0,
                "next_offset": 8,
                "size": 8,
                "data_b64": _b64(b"forged!\n"),
                "eof": True,
            },
        )
        await communicator.send_to(text_data=protocol.encode(forged))
        ack = await _next(communicator, "ack", ack_id=forged["id"])
        await communicator.disconnect()
        return ack

    ack = async_to_sync(scenario)()
    assert ack["payload"]["ok"] is False
    for job in (on_a, on_b):
        assert joblogs.log_read(job_id=job.pk, stream="stdout")[0] == b""


def test_node_bs_agent_writes_its_own_jobs_log_where_the_portal_asked(two_nodes):
    _, on_b, _, token_b = two_nodes

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        request = await _next(communicator, "logs_request", job_id=str(on_b.pk), stream="stdout")
        # A slow agent (a busy host) answers ten pull intervals later: the answer is still taken.
        await asyncio.sleep(10 * consumers.LOG_PULL_INTERVAL_S)
        answer = {
            **request["payload"],
            "request_id": request["id"],
            "data_b64": _b64(b"hello\n"),
            "eof": False,
        }
        answer.update(next_offset=6, size=6)
        await communicator.send_to(text_data=protocol.encode(protocol.message("logs", answer)))
        # The consumer stores the chunk in its own time: wait for it (a loaded machine is slow), then hang up.
        deadline = time.monotonic() + 15
        stored = b""
        while not stored and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            stored = (await sync_to_async(joblogs.log_read)(job_id=on_b.pk, stream="stdout"))[0]
        await communicator.disconnect()
        return stored

    assert async_to_sync(scenario)() == b"hello\n"
    assert joblogs.log_read(job_id=on_b.pk, stream="stdout")[0] == b"hello\n"


def test_any_bytes_are_stored_exactly_and_a_chunk_not_matching_its_offsets_is_refused(two_nodes):
    _, on_b, _, token_b = two_nodes
    chunk = bytes(range(256)) + b"\0" * 1000 + b"\xff\xfe\xc3("  # every byte, NULs, invalid UTF-8

    held: list[dict] = []  # messages read while waiting for another one (a request may come before an ack)

    async def next_of(communicator, type_: str, **match) -> dict:
        def fits(msg: dict) -> bool:
            return msg["type"] == type_ and all(msg["payload"].get(k) == v for k, v in match.items())

        for msg in held:
            if fits(msg):
                held.remove(msg)
                return msg
        async with asyncio.timeout(15):
            while not fits(msg := protocol.decode(await communicator.receive_from(timeout=15))):
                held.append(msg)
        return msg

    async def answer(communicator, **fields) -> dict:
        request = await next_of(communicator, "logs_request", job_id=str(on_b.pk), stream="stdout")
        msg = protocol.message(
            "logs", {**request["payload"], "request_id": request["id"], "eof": False, **fields}
        )
        await communicator.send_to(text_data=protocol.encode(msg))
        return msg

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        refused = []
        for fields in (
            {"data_b64": _b64(chunk), "next_offset": len(chunk) + 1, "size": len(chunk) + 1},  # a byte short
            {"data_b64": _b64(chunk)[:-4], "next_offset": len(chunk), "size": len(chunk)},
            {"data_b64": "not base64!", "next_offset": 8, "size": 8},
            {
                "data": chunk.decode("latin-1"),
                "next_offset": len(chunk),
                "size": len(chunk),
            },  # not base64 at all
        ):
            sent = await answer(communicator, **fields)
            refused.append((await next_of(communicator, "ack", ack_id=sent["id"]))["payload"]["ok"])
        await answer(communicator, data_b64=_b64(chunk), next_offset=len(chunk), size=len(chunk))
        deadline = time.monotonic() + 15
        stored = b""
        while not stored and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            stored = (await sync_to_async(joblogs.log_read)(job_id=on_b.pk, stream="stdout"))[0]
        await communicator.disconnect()
        return refused, stored

    refused, stored = async_to_sync(scenario)()
    assert refused == [False] * 4
    assert stored == chunk


def test_a_final_report_whose_last_lines_hold_nul_bytes_lands_with_them_shown(two_nodes):
    # PostgreSQL refuses NUL in text and JSON: the exit report of a job that printed NULs was refused for good.
    _, on_b, _, token_b = two_nodes
    report = {"job_id": str(on_b.pk), "attempt": on_b.attempt, "pid": 9}
    started = protocol.message("job_status", {**report, "state": "started"})
    tail = {"stdout": ["\0" * 2000, "done \ud800"], "stderr": ["x"] * 50}
    exited = protocol.message("job_status", {**report, "state": "exited", "exit_code": 0, "log_tail": tail})

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        acks = []
        for msg in (started, exited):
            await communicator.send_to(text_data=protocol.encode(msg))
            acks.append((await _next(communicator, "ack", ack_id=msg["id"]))["payload"])
        await communicator.disconnect()
        return acks

    assert [a["ok"] for a in async_to_sync(scenario)()] == [True, True]
    on_b.refresh_from_db()
    assert on_b.state == "succeeded"
    kept = on_b.events.get(to_state="succeeded").data["log_tail"]
    assert kept["stdout"] == ["\u2400" * 1000, "done ?"]
    assert kept["stderr"] == ["x"] * 20


def test_a_desired_state_over_the_frame_limit_is_not_sent_and_the_connection_stays_up(
    two_nodes, alice, teams
):
    _, _, _, token_b = two_nodes
    env = {f"BLOB_{i}": "\x01" * 32 * 1024 for i in range(8)}  # 256 KiB of \x01: 1.5 MB escaped in JSON
    huge = job_submit(
        submitter=alice, team=teams["training"], spec=JobSpec(name="h", command="z", gpus=1, env=env)
    )
    Gpu.objects.create(
        node=Node.objects.get(name="a100-02"),
        index=1,
        uuid="GPU-b-1",
        model=Gpu.objects.first().model,
        memory_mib=81920,
    )
    assert _place(huge, "a100-02", 1).state == "placed"

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        seen: dict[str, dict] = {}
        # The connection carries on: the hello is acked and the portal asks for the huge job's logs.
        async with asyncio.timeout(15):
            while not {"ack", "logs_request"} <= seen.keys():
                msg = protocol.decode(await communicator.receive_from(timeout=15))
                if msg["type"] == "ack" or msg["payload"].get("job_id") == str(huge.pk):
                    seen.setdefault(msg["type"], msg)
        await communicator.disconnect()
        return seen["ack"], seen["logs_request"]

    # Django's setup, run when the test first opens a socket, replaces the root logger's handlers (caplog's too).
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    consumers.log.addHandler(handler)
    try:
        hello_ack, request = async_to_sync(scenario)()
    finally:
        consumers.log.removeHandler(handler)
    assert hello_ack["payload"]["ok"] is True and request["payload"]["stream"] in ("stdout", "stderr")
    refused = [r.getMessage() for r in records if "not sending desired_state" in r.getMessage()]
    assert refused and f"over the frame limit of {protocol.MAX_FRAME_BYTES} bytes" in refused[0]


def test_a_connection_whose_token_was_rotated_cannot_write_logs(two_nodes):
    _, on_b, node_b, token_b = two_nodes

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        request = await _next(communicator, "logs_request", job_id=str(on_b.pk), stream="stdout")
        from channels.db import database_sync_to_async

        await database_sync_to_async(node_issue_token)(node=node_b)
        answer = {
            **request["payload"],
            "request_id": request["id"],
            "data_b64": _b64(b"late\n"),
            "next_offset": 5,
        }
        await communicator.send_to(text_data=protocol.encode(protocol.message("logs", answer)))
        async with asyncio.timeout(5):
            while True:
                out = await communicator.receive_output(timeout=5)
                if out["type"] == "websocket.close":
                    return out["code"]

    assert async_to_sync(scenario)() == consumers.CLOSE_UNAUTHENTICATED
    assert joblogs.log_read(job_id=on_b.pk, stream="stdout")[0] == b""


def test_the_newest_gpu_sample_reaches_the_rest_cluster_view_typed_and_for_a_while_only(
    two_nodes, alice, monkeypatch
):
    from rest_framework.test import APIClient

    from scheduling.agents import live_metrics

    *_, token_b = two_nodes
    forget_live_metrics("a100-01", "a100-02")
    monkeypatch.setattr(live_metrics, "LIVE_METRICS_TTL_S", 6)
    sample = {
        "sampled_at": 1_700_000_000.5,
        "gpus": [
            {
                "index": 0,
                "uuid": "GPU-b-0",
                "util_pct": 87.5,
                "memory_used_mib": 40960,
                "memory_total_mib": 81920,
                "power_w": "lots",  # wrong type: kept as null, never passed on
                "temperature_c": 2**60,  # past any real reading and a JSON double: null
                "health": "ok",
                "processes": [{"pid": 4242, "used_mib": 40960}],  # not for the cluster view
            }
        ],
    }

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        await communicator.send_to(text_data=protocol.encode(protocol.message("metrics", sample)))
        kept = sync_to_async(live_metrics.live_metrics_for_nodes)
        async with asyncio.timeout(15):  # the consumer handles it after the hello's database work
            while not await kept(node_names=["a100-02"]):
                await asyncio.sleep(0.05)
        await communicator.disconnect()

    async_to_sync(scenario)()
    client = APIClient()
    client.force_authenticate(alice)
    body = client.get("/api/v1/cluster/nodes/").json()
    by_node = {n["name"]: n for n in body["results"]}
    assert by_node["a100-02"]["gpus"][0]["metrics"] == {
        "sampled_at": 1_700_000_000.5,
        "util_pct": 87.5,
        "mem_util_pct": None,
        "memory_used_mib": 40960,
        "memory_total_mib": 81920,
        "power_w": None,
        "temperature_c": None,
        "sm_clock_mhz": None,
        "health": "ok",
    }
    assert by_node["a100-01"]["gpus"][0]["metrics"] is None  # its agent never reported
    # Gone once the TTL has passed (polled, with a deadline well past it).
    deadline = time.monotonic() + live_metrics.LIVE_METRICS_TTL_S + 10
    while client.get("/api/v1/cluster/nodes/a100-02/").json()["gpus"][0]["metrics"] is not None:
        assert time.monotonic() < deadline, "a sample older than the TTL must not be shown as live"
        time.sleep(0.1)


def test_a_report_the_database_failed_on_is_acked_for_a_retry_and_lands_when_sent_again(
    two_nodes, monkeypatch
):
    from django.db import OperationalError

    from scheduling.agents import reports as agent_services

    _, on_b, _, token_b = two_nodes
    real = agent_services.job_starts_record  # start reports are recorded in batches
    calls = []

    def deadlocked_once(**kw):
        calls.append(kw)
        if len(calls) == 1:
            raise OperationalError("deadlock detected")
        return real(**kw)

    monkeypatch.setattr(agent_services, "job_starts_record", deadlocked_once)
    started = protocol.message(
        "job_status", {"job_id": str(on_b.pk), "attempt": on_b.attempt, "state": "started", "pid": 9}
    )

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        acks = []
        for _ in range(2):  # the agent sends the same message (same id) again after a retry ack
            await communicator.send_to(text_data=protocol.encode(started))
            acks.append(await _next(communicator, "ack", ack_id=started["id"]))
        await communicator.disconnect()
        return acks

    failed, landed = (a["payload"] for a in async_to_sync(scenario)())
    assert failed["ok"] is False and failed["retry"] is True and "OperationalError" in failed["error"]
    assert landed["ok"] is True and "retry" not in landed
    on_b.refresh_from_db()
    assert on_b.state == "running" and len(calls) == 2


def test_a_heartbeat_showing_a_placed_job_running_moves_it_to_running(two_nodes, monkeypatch):
    from scheduling.agents import reports

    monkeypatch.setattr(reports, "START_REPORT_GRACE_S", 0.0)  # its start report is taken as lost at once
    _, on_b, _, token_b = two_nodes
    entry = {"job_id": str(on_b.pk), "attempt": on_b.attempt, "state": "running", "pid": 9, "adopted": False}
    heartbeat = protocol.message(
        "heartbeat", {"node": "a100-02", "desired_version": None, "running": [entry]}
    )

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        await communicator.send_to(text_data=protocol.encode(heartbeat))
        deadline = time.monotonic() + 15
        state = on_b.state
        while state != "running" and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            state = await sync_to_async(lambda: type(on_b).objects.get(pk=on_b.pk).state)()
        await communicator.disconnect()
        return state

    assert on_b.state == "placed"
    assert async_to_sync(scenario)() == "running"
    assert on_b.events.get(to_state="running").actor_kind == "agent"


def test_a_backlog_of_heartbeats_is_handled_as_the_newest_one_and_never_holds_up_a_job_report(
    two_nodes, monkeypatch
):
    from scheduling.agents import reports as agent_services

    _, on_b, _, token_b = two_nodes
    real = agent_services.node_heartbeat_checked
    seen = []

    def slow_heartbeat(**kw):  # a database that takes its time
        seen.append([e["pid"] for e in kw["running"]])
        time.sleep(0.3)
        return real(**kw)

    monkeypatch.setattr(agent_services, "node_heartbeat_checked", slow_heartbeat)
    entry = {"job_id": str(on_b.pk), "attempt": on_b.attempt, "state": "running", "adopted": False}
    beats = [
        protocol.message("heartbeat", {"node": "a100-02", "seq": i, "running": [{**entry, "pid": i}]})
        for i in range(30)
    ]
    report = protocol.message(
        "job_status", {"job_id": str(on_b.pk), "attempt": on_b.attempt, "state": "started", "pid": 29}
    )

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        await _next(communicator, "desired_state")
        for beat in beats:
            await communicator.send_to(text_data=protocol.encode(beat))
        await communicator.send_to(text_data=protocol.encode(report))
        sent = time.monotonic()
        ack = await _next(communicator, "ack", ack_id=report["id"])
        acked_after_s = time.monotonic() - sent
        while not seen or seen[-1] != [29]:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        await communicator.disconnect()
        return ack, acked_after_s

    ack, acked_after_s = async_to_sync(scenario)()
    assert ack["payload"]["ok"] is True
    # Thirty heartbeats at 0.3 s each would hold the report up 9 s; the newest is handled, most never are.
    assert acked_after_s < 4.5, acked_after_s
    assert seen[-1] == [29] and len(seen) <= 5, seen


def test_an_answer_asked_before_the_previous_chunk_was_stored_is_not_stored_twice(two_nodes, monkeypatch):
    from scheduling.agents import reports as agent_services

    _, on_b, _, token_b = two_nodes
    real = agent_services.job_logs_store

    def slow_store(**kw):  # while it writes, the pull loop asks again from the offset it still holds
        time.sleep(0.5)
        return real(**kw)

    monkeypatch.setattr(agent_services, "job_logs_store", slow_store)

    def answer(request):
        payload = {
            **request["payload"],
            "request_id": request["id"],
            "data_b64": _b64(b"hello\n"),
            "eof": False,
        }
        payload.update(next_offset=request["payload"]["offset"] + 6, size=6)
        return protocol.encode(protocol.message("logs", payload))

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        first = await _next(communicator, "logs_request", job_id=str(on_b.pk), stream="stdout")
        await communicator.send_to(text_data=answer(first))
        again = await _next(communicator, "logs_request", job_id=str(on_b.pk), stream="stdout")
        # The agent answers what it was asked: the same first six bytes (its file has not grown).
        await communicator.send_to(text_data=answer(again))
        await asyncio.sleep(1.5)
        await communicator.disconnect()
        return first, again

    first, again = async_to_sync(scenario)()
    assert first["payload"]["offset"] == again["payload"]["offset"] == 0
    assert joblogs.log_read(job_id=on_b.pk, stream="stdout")[0] == b"hello\n"


def test_a_report_that_fails_for_a_reason_other_than_the_database_is_refused_not_retried(
    two_nodes, monkeypatch
):
    from scheduling.agents import reports as agent_services

    _, on_b, _, token_b = two_nodes

    def broken(**kw):
        raise ValueError("a bug, or a report no retry can fix")

    monkeypatch.setattr(agent_services, "job_starts_record", broken)  # where start reports are recorded
    report = protocol.message(
        "job_status", {"job_id": str(on_b.pk), "attempt": on_b.attempt, "state": "started"}
    )

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        await communicator.send_to(text_data=protocol.encode(report))
        ack = await _next(communicator, "ack", ack_id=report["id"])
        await communicator.disconnect()
        return ack["payload"]

    ack = async_to_sync(scenario)()
    assert ack["ok"] is False and "retry" not in ack and "ValueError" in ack["error"]


def test_a_nodes_samples_go_only_to_the_groups_a_browser_listens_to(two_nodes, monkeypatch):
    from channels.layers import get_channel_layer

    from scheduling.agents import live_metrics
    from scheduling.realtime import groups, listeners

    _, on_b, _, token_b = two_nodes
    forget_live_metrics("a100-02")
    monkeypatch.setattr(consumers, "METRICS_PUBLISH_INTERVAL_S", 0.0)
    job_group = groups.job(on_b.pk)

    def sample(util: float) -> str:
        gpu = {
            "index": 0,
            "uuid": "GPU-b-0",
            "util_pct": util,
            "memory_used_mib": 1,
            "memory_total_mib": 81920,
        }
        return protocol.encode(protocol.message("metrics", {"sampled_at": time.time(), "gpus": [gpu]}))

    async def published(communicator, channel: str, util: float) -> list[dict]:
        """Send a sample, wait until the live store holds it (the consumer has handled it), then what the
        job's group received."""
        await communicator.send_to(text_data=sample(util))
        kept = sync_to_async(live_metrics.live_metrics_for_nodes)
        async with asyncio.timeout(15):
            while (await kept(node_names=["a100-02"])).get("a100-02", {}).get(0, {}).get("util_pct") != util:
                await asyncio.sleep(0.05)
        got = []
        with pytest.raises(asyncio.TimeoutError):
            while True:
                got.append(await asyncio.wait_for(layer.receive(channel), timeout=0.5))
        return [m for m in got if m["type"] == "job.metrics"]

    layer = get_channel_layer()

    async def scenario():
        channel = await layer.new_channel()
        await layer.group_add(job_group, channel)
        communicator = await _connect(token_b, "a100-02")
        await _next(communicator, "desired_state")
        listeners.forget()
        unheard = await published(communicator, channel, 11.0)
        await sync_to_async(listeners.listening_add)(groups=[job_group], channel=channel)
        listeners.forget()
        heard = await published(communicator, channel, 22.0)
        await sync_to_async(listeners.listening_remove)(groups=[job_group], channel=channel)
        await communicator.disconnect()
        return unheard, heard

    unheard, heard = async_to_sync(scenario)()
    assert unheard == [], "a sample published to a group no browser listens to"
    assert [m["gpus"][0]["util_pct"] for m in heard] == [22.0] and heard[0]["job_id"] == on_b.pk


def test_a_quiet_jobs_logs_are_asked_for_often_only_while_someone_watches_it(two_nodes, monkeypatch):
    from scheduling.realtime import groups, listeners

    _, on_b, _, token_b = two_nodes
    monkeypatch.setattr(consumers, "LOG_QUIET_MAX_S", 0.2)
    monkeypatch.setattr(consumers, "LOG_UNWATCHED_MAX_S", 100.0)
    job_group = groups.job(on_b.pk)

    async def asked_within(communicator, seconds: float) -> int:
        """Answer every logs request with nothing new for `seconds`; how many came."""
        count = 0
        end = time.monotonic() + seconds
        while end > time.monotonic():
            if await communicator.receive_nothing(timeout=0.02):  # (a receive that times out ends the app)
                continue
            msg = protocol.decode(await communicator.receive_from())
            if msg["type"] != "logs_request":
                continue
            count += 1
            p = msg["payload"]
            answer = {**p, "request_id": msg["id"], "data_b64": "", "eof": False}
            answer.update(next_offset=p["offset"], size=p["offset"])
            await communicator.send_to(text_data=protocol.encode(protocol.message("logs", answer)))
        return count

    async def scenario():
        listeners.forget()
        communicator = await _connect(token_b, "a100-02")
        await asked_within(communicator, 1.5)  # the quiet streams' waits grow past LOG_QUIET_MAX_S
        unwatched = await asked_within(communicator, 1.5)
        await sync_to_async(listeners.listening_add)(groups=[job_group], channel="a-browser", for_s=60)
        listeners.forget()
        watched = await asked_within(communicator, 1.5)
        await sync_to_async(listeners.listening_remove)(groups=[job_group], channel="a-browser")
        await communicator.disconnect()
        return unwatched, watched

    unwatched, watched = async_to_sync(scenario)()
    # Two streams: unwatched, each waits 1.6 s then 3.2 s; watched, at most 0.2 s (with a 0.05 s pull loop).
    assert unwatched <= 4, f"{unwatched} requests in 1.5 s for a quiet job nobody watches"
    assert watched >= 8, f"only {watched} requests in 1.5 s for a quiet job someone watches"


def test_a_nodes_heartbeats_are_recorded_while_its_reports_wait_on_the_database(two_nodes, monkeypatch):
    import threading

    from scheduling.agents import reports as agent_services

    _, on_b, node_b, token_b = two_nodes
    real = agent_services.job_starts_record
    release = threading.Event()

    def stuck(**kw):  # a database where the start reports wait (a cycle's wave of them, a lock)
        release.wait(10)
        return real(**kw)

    monkeypatch.setattr(agent_services, "job_starts_record", stuck)
    started = protocol.message(
        "job_status", {"job_id": str(on_b.pk), "attempt": on_b.attempt, "state": "started", "pid": 9}
    )
    beat = protocol.message("heartbeat", {"node": "a100-02", "seq": 1, "running": []})

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        await _next(communicator, "desired_state")
        await communicator.send_to(text_data=protocol.encode(started))
        await communicator.send_to(text_data=protocol.encode(beat))
        acked = await _next(communicator, "heartbeat_ack")
        heard = await sync_to_async(lambda: Node.objects.get(pk=node_b.pk).last_heartbeat_at)()
        state_meanwhile = await sync_to_async(lambda: type(on_b).objects.get(pk=on_b.pk).state)()
        release.set()
        ack = await _next(communicator, "ack", ack_id=started["id"])
        await communicator.disconnect()
        return acked, heard, state_meanwhile, ack

    try:
        acked, heard, state_meanwhile, ack = async_to_sync(scenario)()
    finally:
        release.set()
    assert acked["payload"]["seq"] == 1 and heard is not None
    assert state_meanwhile == "placed", "the heartbeat was answered before the start report it was sent after"
    assert ack["payload"]["ok"] is True
    on_b.refresh_from_db()
    assert on_b.state == "running"


def test_a_storm_of_change_notices_is_read_back_once_or_twice_and_a_failed_read_keeps_the_socket(
    two_nodes, monkeypatch
):
    from channels.layers import get_channel_layer

    from scheduling.realtime import groups

    _, _, _, token_b = two_nodes
    real = consumers._desired_for
    reads = []

    def slow_read(node_id):  # a busy database; the first read fails
        reads.append(node_id)
        time.sleep(0.3)
        if len(reads) == 1:
            raise RuntimeError("the database went away for a moment")
        return real(node_id)

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        await _next(communicator, "desired_state")  # after hello
        monkeypatch.setattr(consumers, "_desired_for", slow_read)
        layer = get_channel_layer()
        notice = {"type": "desired.changed", "node": "a100-02"}
        await layer.group_send(groups.node("a100-02"), notice)  # its read fails
        await asyncio.sleep(0.6)
        for _ in range(20):  # a wave of job ends on the node, a notice each
            await layer.group_send(groups.node("a100-02"), notice)
        await asyncio.sleep(1.5)
        read_for_notices = len(reads)
        beat = protocol.message("heartbeat", {"node": "a100-02", "seq": 7, "running": []})
        await communicator.send_to(text_data=protocol.encode(beat))
        acked = await _next(communicator, "heartbeat_ack")  # the socket is still up
        await communicator.disconnect()
        return acked, read_for_notices

    acked, read_for_notices = async_to_sync(scenario)()
    assert acked["payload"]["seq"] == 7
    assert 2 <= read_for_notices <= 3, f"{read_for_notices} reads for 21 notices"


def test_past_the_queue_limit_a_nodes_report_is_answered_send_it_again_and_lands_when_it_is(
    two_nodes, monkeypatch
):
    import threading

    from scheduling.agents import reports as agent_services

    _, on_b, _, token_b = two_nodes
    monkeypatch.setattr(consumers, "MAX_QUEUED_REPORTS", 2)
    real = agent_services.node_event
    release = threading.Event()

    def stuck(**kw):  # the database holds the first event up; the next ones queue behind it
        release.wait(10)
        return real(**kw)

    monkeypatch.setattr(agent_services, "node_event", stuck)
    events = [
        protocol.message(
            "event",
            {
                "kind": "prevented_neighbour_interference",
                "job_id": str(on_b.pk),
                "attempt": on_b.attempt,
                "n": i,
            },
        )
        for i in range(4)
    ]

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        await _next(communicator, "desired_state")  # the hello is handled: the queue is empty
        await communicator.send_to(text_data=protocol.encode(events[0]))
        await asyncio.sleep(0.3)  # taken from the queue, waiting on the database
        for event in events[1:]:
            await communicator.send_to(text_data=protocol.encode(event))
        busy = await _next(communicator, "ack", ack_id=events[3]["id"])
        release.set()
        acks = [await _next(communicator, "ack", ack_id=e["id"]) for e in events[:3]]
        await communicator.send_to(text_data=protocol.encode(events[3]))  # the agent sends it again
        again = await _next(communicator, "ack", ack_id=events[3]["id"])
        await communicator.disconnect()
        return busy, acks, again

    try:
        busy, acks, again = async_to_sync(scenario)()
    finally:
        release.set()
    assert busy["payload"]["ok"] is False and busy["payload"]["retry"] is True
    assert "busy" in busy["payload"]["error"]
    assert all(a["payload"]["ok"] for a in acks) and again["payload"]["ok"] is True


def test_an_xid_event_in_a_sample_is_kept_without_holding_up_the_nodes_frames(two_nodes, monkeypatch):
    import threading

    from scheduling.history import recorder
    from scheduling.history.models import GpuEvent

    _, _, _, token_b = two_nodes
    real = consumers.gpu_events_record
    release = threading.Event()

    def slow_record(**kw):  # a database that takes its time with the event
        release.wait(10)
        return real(**kw)

    monkeypatch.setattr(consumers, "gpu_events_record", slow_record)
    assert recorder.gpu_events_record is real
    gpu = {"index": 0, "uuid": "GPU-b-0", "util_pct": 1.0, "xid_events": [79]}
    sample = protocol.message("metrics", {"sampled_at": time.time(), "gpus": [gpu]})
    beat = protocol.message("heartbeat", {"node": "a100-02", "seq": 3, "running": []})

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        await _next(communicator, "desired_state")
        await communicator.send_to(text_data=protocol.encode(sample))
        await communicator.send_to(text_data=protocol.encode(beat))
        acked = await _next(communicator, "heartbeat_ack")  # while the event is still being written
        kept_meanwhile = await sync_to_async(GpuEvent.objects.count)()
        release.set()
        async with asyncio.timeout(10):
            while not await sync_to_async(GpuEvent.objects.count)():
                await asyncio.sleep(0.05)
        await communicator.disconnect()
        return acked, kept_meanwhile

    try:
        acked, kept_meanwhile = async_to_sync(scenario)()
    finally:
        release.set()
    assert acked["payload"]["seq"] == 3 and kept_meanwhile == 0
    assert list(GpuEvent.objects.values_list("kind", "code")) == [("xid", 79)]
