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
from scheduling.agents import joblogs
from scheduling.agents.socket import db_threads, desired, handlers, lanes, link, log_pulls
from scheduling.cycle import apply, lease
from scheduling.engine import types as eng
from scheduling.inventory.models import Gpu, Node
from scheduling.inventory.services import node_issue_token
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import JobEvent
from scheduling.jobs.submit import job_submit
from tests.pipeline.harness import forget_live_metrics
from tests.support import TIMEOUT_SCALE, wait_for, wait_for_async

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _in_memory(settings, tmp_path, monkeypatch):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.TESSERA_LOG_DIR = str(tmp_path / "logs")
    monkeypatch.setattr(log_pulls, "LOG_PULL_INTERVAL_S", 0.05)
    yield
    db_threads.db_pool_shutdown()  # no database work of this test's connections outlives it


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
    """The next message of this type (and payload fields) from the portal within 5 s (scaled), skipping the
    others."""
    async with asyncio.timeout(5 * TIMEOUT_SCALE):
        while True:
            msg = protocol.decode(await communicator.receive_from(timeout=5 * TIMEOUT_SCALE))
            if msg["type"] == type_ and all(msg["payload"].get(k) == v for k, v in match.items()):
                return msg


async def _handled_so_far(communicator: WebsocketCommunicator, *, held: list[dict] | None = None) -> None:
    """Wait until the portal has handled every frame sent before: it reads a node's frames and queued reports in
    order, and answers a message type it does not know in its turn. Messages read meanwhile go to `held`."""
    barrier = protocol.message("barrier", {})
    await communicator.send_to(text_data=protocol.encode(barrier))
    async with asyncio.timeout(5 * TIMEOUT_SCALE):
        while True:
            msg = protocol.decode(await communicator.receive_from(timeout=5 * TIMEOUT_SCALE))
            if msg["type"] == "ack" and msg["payload"].get("ack_id") == barrier["id"]:
                return
            if held is not None:
                held.append(msg)


def _stored_log(job_id: int):
    """An awaitable of what the portal has stored of a job's stdout."""
    return sync_to_async(lambda: joblogs.log_read(job_id=job_id, stream="stdout")[0])()


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


def test_a_refusal_shown_as_the_nodes_last_error_clears_once_a_report_is_accepted_again(two_nodes):
    on_a, _, _, token_b = two_nodes
    wrong = protocol.message(
        "event", {"kind": "prevented_neighbour_interference", "job_id": str(on_a.pk), "attempt": on_a.attempt}
    )
    uuid = Gpu.objects.filter(node__name="a100-02").values_list("uuid", flat=True).first()
    fine = protocol.message("event", {"kind": "gpu_health", "gpu_uuid": uuid, "health": "ok"})
    from scheduling.cycle.models import NodeSync

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        await communicator.send_to(text_data=protocol.encode(wrong))
        await _next(communicator, "ack", ack_id=wrong["id"])
        shown = await sync_to_async(lambda: NodeSync.objects.get(node__name="a100-02").last_error)()
        await communicator.send_to(text_data=protocol.encode(fine))
        ack = await _next(communicator, "ack", ack_id=fine["id"])
        await communicator.disconnect()
        return shown, ack

    shown, ack = async_to_sync(scenario)()
    assert shown.startswith("event refused: stale event: ")
    assert ack["payload"]["ok"] is True
    sync = NodeSync.objects.get(node__name="a100-02")
    assert (sync.last_error, sync.last_error_at, sync.last_error_kind) == ("", None, "")


def test_a_report_about_an_attempt_the_portal_has_moved_on_from_is_refused_quietly(two_nodes):
    _, on_b, _, token_b = two_nodes
    # An agent back after its job was fenced and placed again: its report of the old attempt.
    type(on_b).objects.filter(pk=on_b.pk).update(attempt=on_b.attempt + 1)
    old = protocol.message(
        "job_status", {"job_id": str(on_b.pk), "attempt": on_b.attempt, "state": "exited", "exit_code": 0}
    )

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        await communicator.send_to(text_data=protocol.encode(old))
        ack = await _next(communicator, "ack", ack_id=old["id"])
        await communicator.disconnect()
        return ack

    ack = async_to_sync(scenario)()
    assert ack["payload"]["ok"] is False and "is not placed on a100-02" in ack["payload"]["error"]
    from scheduling.cycle.models import NodeSync

    # (Its hello, with no GPUs in it, left the node's last error: GPU 0 missing from its inventory.)
    assert "refused" not in NodeSync.objects.get(node__name="a100-02").last_error


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
        # A slow agent (a busy host) answers ten pull intervals later: the answer is still taken. (The sleep is
        # the agent's slowness, not a wait for the portal.)
        await asyncio.sleep(10 * log_pulls.LOG_PULL_INTERVAL_S)
        answer = {
            **request["payload"],
            "request_id": request["id"],
            "data_b64": _b64(b"hello\n"),
            "eof": False,
        }
        answer.update(next_offset=6, size=6)
        await communicator.send_to(text_data=protocol.encode(protocol.message("logs", answer)))
        # The consumer stores the chunk in its own time: wait for it (a loaded machine is slow), then hang up.
        stored = await wait_for_async("the answer to be stored", lambda: _stored_log(on_b.pk), timeout_s=15)
        await communicator.disconnect()
        return stored

    assert async_to_sync(scenario)() == b"hello\n"
    assert joblogs.log_read(job_id=on_b.pk, stream="stdout")[0] == b"hello\n"


def test_an_answer_past_the_request_timeout_is_still_taken_and_an_unwatched_stream_is_not_asked_again_meanwhile(
    two_nodes, monkeypatch
):
    """The answer to a logs request may wait behind the node's reports at the portal (a wave of them): past the
    request's timeout it is still stored, and the stream of a job nobody watches is not asked again at once (each
    ask re-asked made more answers to queue)."""
    from scheduling.realtime import listeners

    _, on_b, _, token_b = two_nodes
    monkeypatch.setattr(log_pulls, "LOG_REQUEST_TIMEOUT_S", 0.2)
    monkeypatch.setattr(log_pulls, "LOG_UNWATCHED_MAX_S", 100.0)

    async def scenario():
        listeners.forget()
        communicator = await _connect(token_b, "a100-02")
        request = await _next(communicator, "logs_request", job_id=str(on_b.pk), stream="stdout")
        asked_again = 0
        end = time.monotonic() + 1.0  # five timeouts (the agent's slowness, not a wait for the portal)
        while time.monotonic() < end:
            if await communicator.receive_nothing(timeout=0.05):
                continue
            msg = protocol.decode(await communicator.receive_from())
            asked_again += msg["type"] == "logs_request" and msg["payload"]["stream"] == "stdout"
        answer = {
            **request["payload"],
            "request_id": request["id"],
            "data_b64": _b64(b"late\n"),
            "eof": False,
        }
        answer.update(next_offset=5, size=5)
        await communicator.send_to(text_data=protocol.encode(protocol.message("logs", answer)))
        stored = await wait_for_async(
            "the late answer to be stored", lambda: _stored_log(on_b.pk), timeout_s=15
        )
        await communicator.disconnect()
        return asked_again, stored

    asked_again, stored = async_to_sync(scenario)()
    assert stored == b"late\n"
    assert asked_again == 0, f"an unwatched stream asked {asked_again} times more in five timeouts"


def test_the_last_lines_of_a_job_that_ended_just_before_its_node_reconnected_still_arrive(two_nodes):
    """The final report is recorded, the portal asks for the last lines, the connection drops before the answer:
    the next connection (another portal process, or after a restart) goes on pulling them, and until they are
    here a reader is not told the log is complete."""
    from scheduling.jobs.models import LogDrain
    from scheduling.jobs.selectors import job_logs_complete

    _, on_b, _, token_b = two_nodes
    report = {"job_id": str(on_b.pk), "attempt": on_b.attempt, "pid": 9}
    started = protocol.message("job_status", {**report, "state": "started"})
    exited = protocol.message("job_status", {**report, "state": "exited", "exit_code": 0})

    def drains() -> list[tuple[int, int]]:
        return list(LogDrain.objects.values_list("job_id", "attempt"))

    async def first_connection() -> None:
        communicator = await _connect(token_b, "a100-02")
        for msg in (started, exited):
            await communicator.send_to(text_data=protocol.encode(msg))
            await _next(communicator, "ack", ack_id=msg["id"])  # (the portal's logs requests go unanswered)
        await communicator.disconnect()  # before answering them: the agent's host rebooted, a proxy cut it

    async def second_connection() -> tuple[bytes, list]:
        communicator = await _connect(token_b, "a100-02")
        for stream, data in (("stdout", b"the last line\n"), ("stderr", b"")):
            request = await _next(communicator, "logs_request", job_id=str(on_b.pk), stream=stream)
            answer = {**request["payload"], "request_id": request["id"], "data_b64": _b64(data), "eof": True}
            answer.update(next_offset=len(data), size=len(data))
            await communicator.send_to(text_data=protocol.encode(protocol.message("logs", answer)))
        stored = await wait_for_async("the last line stored", lambda: _stored_log(on_b.pk), timeout_s=15)
        left = await wait_for_async(
            "the drain to be done", lambda: sync_to_async(lambda: drains() == [])(), timeout_s=15
        )
        await communicator.disconnect()
        return stored, left

    async_to_sync(first_connection)()
    on_b.refresh_from_db()
    assert on_b.state == "succeeded"
    assert drains() == [(on_b.pk, on_b.attempt)]
    assert not job_logs_complete(job=on_b), "told complete while its last lines are still on the node"
    stored, _ = async_to_sync(second_connection)()
    assert stored == b"the last line\n"
    assert job_logs_complete(job=on_b)


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
        async with asyncio.timeout(15 * TIMEOUT_SCALE):
            while not fits(
                msg := protocol.decode(await communicator.receive_from(timeout=15 * TIMEOUT_SCALE))
            ):
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
        stored = await wait_for_async("the chunk to be stored", lambda: _stored_log(on_b.pk), timeout_s=15)
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
        async with asyncio.timeout(15 * TIMEOUT_SCALE):
            while not {"ack", "logs_request"} <= seen.keys():
                msg = protocol.decode(await communicator.receive_from(timeout=15 * TIMEOUT_SCALE))
                if msg["type"] == "ack" or msg["payload"].get("job_id") == str(huge.pk):
                    seen.setdefault(msg["type"], msg)
        await communicator.disconnect()
        return seen["ack"], seen["logs_request"]

    # Django's setup, run when the test first opens a socket, replaces the root logger's handlers (caplog's too).
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    room_log = logging.getLogger("scheduling.agents.socket")  # the parent of each part's logger
    room_log.addHandler(handler)
    try:
        hello_ack, request = async_to_sync(scenario)()
    finally:
        room_log.removeHandler(handler)
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
        async with asyncio.timeout(5 * TIMEOUT_SCALE):
            while True:
                out = await communicator.receive_output(timeout=5 * TIMEOUT_SCALE)
                if out["type"] == "websocket.close":
                    return out["code"]

    assert async_to_sync(scenario)() == link.CLOSE_UNAUTHENTICATED
    assert joblogs.log_read(job_id=on_b.pk, stream="stdout")[0] == b""


def _live_sample_life_s(node_name: str) -> float:
    """How long the node's kept sample has left to live, wherever this process keeps it (0: none)."""
    from scheduling.agents import live_metrics
    from scheduling.coordination import redis_client

    r = redis_client()
    if r is None:
        kept = live_metrics._local.get(node_name)
        return max(0.0, kept[0] - time.monotonic()) if kept else 0.0
    return max(0, r.pttl(live_metrics.live_metrics_key(node_name))) / 1000


def _live_sample_expire(node_name: str) -> None:
    """Age the node's kept sample past its TTL at once: its expiry is the store's, not a wait for the clock."""
    from scheduling.agents import live_metrics
    from scheduling.coordination import redis_client

    r = redis_client()
    if r is None:
        live_metrics._local[node_name] = (time.monotonic() - 1, live_metrics._local[node_name][1])
    else:
        assert r.pexpire(live_metrics.live_metrics_key(node_name), 1)


def test_the_newest_gpu_sample_reaches_the_rest_cluster_view_typed_and_for_a_while_only(two_nodes, alice):
    from rest_framework.test import APIClient

    from scheduling.agents import live_metrics

    *_, token_b = two_nodes
    forget_live_metrics("a100-01", "a100-02")
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
        # The consumer handles it after the hello's database work.
        await wait_for_async("the sample to be kept", lambda: kept(node_names=["a100-02"]), timeout_s=15)
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
    # Kept for the TTL at most; once that has passed (aged here rather than waited for) the view shows nothing.
    assert 0 < _live_sample_life_s("a100-02") <= live_metrics.LIVE_METRICS_TTL_S
    _live_sample_expire("a100-02")
    wait_for(
        "the expired sample to leave the view (a sample older than the TTL must not be shown as live)",
        lambda: client.get("/api/v1/cluster/nodes/a100-02/").json()["gpus"][0]["metrics"] is None,
        timeout_s=5,
    )


def test_a_report_the_database_failed_on_is_acked_for_a_retry_and_lands_when_sent_again(
    two_nodes, monkeypatch
):
    from django.db import OperationalError

    from scheduling.agents.reports import job_status

    _, on_b, _, token_b = two_nodes
    real = job_status.job_starts_record  # start reports are recorded in batches
    calls = []

    def deadlocked_once(**kw):
        calls.append(kw)
        if len(calls) == 1:
            raise OperationalError("deadlock detected")
        return real(**kw)

    monkeypatch.setattr(job_status, "job_starts_record", deadlocked_once)
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
    from scheduling.agents.reports import heartbeats

    monkeypatch.setattr(heartbeats, "START_REPORT_GRACE_S", 0.0)  # its start report is taken as lost at once
    _, on_b, _, token_b = two_nodes
    entry = {"job_id": str(on_b.pk), "attempt": on_b.attempt, "state": "running", "pid": 9, "adopted": False}
    heartbeat = protocol.message(
        "heartbeat", {"node": "a100-02", "desired_version": None, "running": [entry]}
    )

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        await communicator.send_to(text_data=protocol.encode(heartbeat))
        job_state = sync_to_async(lambda: type(on_b).objects.get(pk=on_b.pk).state)

        async def running() -> bool:
            return await job_state() == "running"

        await wait_for_async("the job to be running", running, timeout_s=15)
        await communicator.disconnect()
        return await job_state()

    assert on_b.state == "placed"
    assert async_to_sync(scenario)() == "running"
    assert on_b.events.get(to_state="running").actor_kind == "agent"


def test_a_backlog_of_heartbeats_is_handled_as_the_newest_one_and_never_holds_up_a_job_report(
    two_nodes, monkeypatch
):
    import threading

    from scheduling.agents.reports import heartbeats

    _, on_b, _, token_b = two_nodes
    real = heartbeats.node_heartbeats_checked
    seen = []
    release = threading.Event()

    def stuck_heartbeat(**kw):  # a database that holds the heartbeats up until the test lets it go
        seen.extend([e["pid"] for e in beat.running] for beat in kw["beats"])
        release.wait(10 * TIMEOUT_SCALE)
        return real(**kw)

    monkeypatch.setattr(heartbeats, "node_heartbeats_checked", stuck_heartbeat)
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
        ack = await _next(communicator, "ack", ack_id=report["id"])
        handled_by_then = list(seen)
        release.set()
        await wait_for_async("the newest heartbeat to be handled", lambda: seen and seen[-1] == [29])
        await communicator.disconnect()
        return ack, handled_by_then

    try:
        ack, handled_by_then = async_to_sync(scenario)()
    finally:
        release.set()
    assert ack["payload"]["ok"] is True
    # The report was answered while a heartbeat still waited on the database, the other 29 behind it.
    assert len(handled_by_then) <= 1, handled_by_then
    # By then every frame had been read: the backlog behind the stuck one is handled as its newest heartbeat.
    assert seen[-1] == [29] and len(seen) <= 2, seen


def test_heartbeats_of_several_nodes_arriving_while_a_batch_is_written_are_written_together_and_each_acked(
    two_nodes, node, monkeypatch
):
    import threading

    from scheduling.agents.reports import heartbeats
    from scheduling.agents.socket import beats

    _, _, node_b, token_b = two_nodes
    node_c = Node.objects.create(name="a100-03", cpu_milli=128_000, memory_mib=1024 * 1024)
    tokens = {
        "a100-01": node_issue_token(node=node),
        "a100-02": token_b,
        "a100-03": node_issue_token(node=node_c),
    }
    real = heartbeats.node_heartbeats_checked
    batches: list[list[str]] = []
    release = threading.Event()

    def held_first(**kw):  # the first batch's write waits until the test lets it go
        batches.append(sorted(Node.objects.get(pk=b.node_id).name for b in kw["beats"]))
        if len(batches) == 1:
            release.wait(10 * TIMEOUT_SCALE)
        return real(**kw)

    monkeypatch.setattr(heartbeats, "node_heartbeats_checked", held_first)

    def beat(name: str) -> str:
        return protocol.encode(protocol.message("heartbeat", {"node": name, "seq": 1, "running": []}))

    async def scenario():
        sockets = {name: await _connect(token, name) for name, token in tokens.items()}
        for communicator in sockets.values():
            await _next(communicator, "desired_state")
        await sockets["a100-01"].send_to(text_data=beat("a100-01"))
        await wait_for_async("the first batch's write to begin", lambda: len(batches) == 1)
        await sockets["a100-02"].send_to(text_data=beat("a100-02"))
        await sockets["a100-03"].send_to(text_data=beat("a100-03"))
        await wait_for_async("both to wait for the next batch", lambda: len(beats.batches.get().waiting) == 2)
        release.set()
        acks = {
            name: await _next(communicator, "heartbeat_ack", seq=1) for name, communicator in sockets.items()
        }
        for communicator in sockets.values():
            await communicator.disconnect()
        return acks

    try:
        acks = async_to_sync(scenario)()
    finally:
        release.set()
    assert sorted(acks) == ["a100-01", "a100-02", "a100-03"]
    assert batches == [["a100-01"], ["a100-02", "a100-03"]]
    assert all(n.last_heartbeat_at is not None for n in Node.objects.filter(name__startswith="a100-0"))


def test_an_answer_asked_before_the_previous_chunk_was_stored_is_not_stored_twice(two_nodes, monkeypatch):
    import threading

    from scheduling.agents.reports import log_chunks

    _, on_b, _, token_b = two_nodes
    real = log_chunks.job_logs_store
    asked_again = threading.Event()

    def slow_store(**kw):  # while it writes, the pull loop asks again from the offset it still holds
        asked_again.wait(10 * TIMEOUT_SCALE)
        return real(**kw)

    monkeypatch.setattr(log_chunks, "job_logs_store", slow_store)

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
        asked_again.set()  # the first answer's write ends now
        # The agent answers what it was asked: the same first six bytes (its file has not grown).
        await communicator.send_to(text_data=answer(again))
        await _handled_so_far(communicator)  # both answers
        await communicator.disconnect()
        return first, again

    try:
        first, again = async_to_sync(scenario)()
    finally:
        asked_again.set()
    assert first["payload"]["offset"] == again["payload"]["offset"] == 0
    assert joblogs.log_read(job_id=on_b.pk, stream="stdout")[0] == b"hello\n"


def test_a_report_that_fails_for_a_reason_other_than_the_database_is_refused_not_retried(
    two_nodes, monkeypatch
):
    from scheduling.agents.reports import job_status

    _, on_b, _, token_b = two_nodes

    def broken(**kw):
        raise ValueError("a bug, or a report no retry can fix")

    monkeypatch.setattr(job_status, "job_starts_record", broken)  # where start reports are recorded
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
    monkeypatch.setattr(handlers, "METRICS_PUBLISH_INTERVAL_S", 0.0)
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

    async def published(communicator, channel: str, util: float, *, expected: bool) -> list[dict]:
        """Send a sample, wait until the consumer has handled it (published it where it publishes, and the live
        store holds it), then what the job's group received: where a message is expected, waited for with a
        deadline (a group send can reach the channel after the sample is kept), then whatever else is there."""
        await communicator.send_to(text_data=sample(util))
        await _handled_so_far(communicator)  # the sample's frame was handled, its sends made
        kept = sync_to_async(live_metrics.live_metrics_for_nodes)

        async def stored() -> bool:
            return (await kept(node_names=["a100-02"])).get("a100-02", {}).get(0, {}).get("util_pct") == util

        await wait_for_async(f"the sample of {util} % to be kept", stored, timeout_s=15)
        got = [await asyncio.wait_for(layer.receive(channel), timeout=15)] if expected else []
        with pytest.raises(asyncio.TimeoutError):  # what was sent is in the channel already: taken at once
            while True:
                got.append(await asyncio.wait_for(layer.receive(channel), timeout=0.1))
        return [m for m in got if m["type"] == "job.metrics"]

    layer = get_channel_layer()

    async def scenario():
        channel = await layer.new_channel()
        await layer.group_add(job_group, channel)
        communicator = await _connect(token_b, "a100-02")
        await _next(communicator, "desired_state")
        listeners.forget()
        unheard = await published(communicator, channel, 11.0, expected=False)
        await sync_to_async(listeners.listening_add)(groups=[job_group], channel=channel)
        listeners.forget()
        heard = await published(communicator, channel, 22.0, expected=True)
        await sync_to_async(listeners.listening_remove)(groups=[job_group], channel=channel)
        await communicator.disconnect()
        return unheard, heard

    unheard, heard = async_to_sync(scenario)()
    assert unheard == [], "a sample published to a group no browser listens to"
    assert [m["gpus"][0]["util_pct"] for m in heard] == [22.0] and heard[0]["job_id"] == on_b.pk


def test_a_quiet_jobs_logs_are_asked_for_often_only_while_someone_watches_it(two_nodes, monkeypatch):
    from scheduling.realtime import groups, listeners

    _, on_b, _, token_b = two_nodes
    monkeypatch.setattr(log_pulls, "LOG_QUIET_MAX_S", 0.2)
    monkeypatch.setattr(log_pulls, "LOG_UNWATCHED_MAX_S", 100.0)
    job_group = groups.job(on_b.pk)

    async def answered(communicator, *, for_s: float | None = None, per_stream: int = 0) -> dict[str, int]:
        """Answer every logs request with nothing new, for `for_s` seconds, or until each stream has been asked
        `per_stream` times (failing after 20 s); how often each stream was asked."""
        asked = {"stdout": 0, "stderr": 0}
        end = time.monotonic() + (for_s if for_s is not None else 20)
        while for_s is not None or min(asked.values()) < per_stream:
            if time.monotonic() > end:
                if for_s is not None:
                    return asked
                raise AssertionError(f"asked {asked} in 20 s, not {per_stream} times a stream")
            if await communicator.receive_nothing(timeout=0.02):  # (a receive that times out ends the app)
                continue
            msg = protocol.decode(await communicator.receive_from())
            if msg["type"] != "logs_request":
                continue
            p = msg["payload"]
            asked[p["stream"]] += 1
            answer = {**p, "request_id": msg["id"], "data_b64": "", "eof": False}
            answer.update(next_offset=p["offset"], size=p["offset"])
            await communicator.send_to(text_data=protocol.encode(protocol.message("logs", answer)))
        return asked

    async def scenario():
        listeners.forget()
        communicator = await _connect(token_b, "a100-02")
        # Nobody watches: after one empty answer, each stream waits LOG_UNWATCHED_MAX_S (100 s here).
        await answered(communicator, per_stream=1)
        unwatched = sum((await answered(communicator, for_s=1.5)).values())
        await sync_to_async(listeners.listening_add)(groups=[job_group], channel="a-browser", for_s=60)
        listeners.forget()
        # Watched, each waits at most 0.2 s: four more asks a stream come within a second or so, where unwatched
        # they would take 400 s (`answered` fails after 20).
        await answered(communicator, per_stream=4)
        await sync_to_async(listeners.listening_remove)(groups=[job_group], channel="a-browser")
        await communicator.disconnect()
        return unwatched

    unwatched = async_to_sync(scenario)()
    # Two streams, each waiting 100 s: not asked again in 1.5 s (with the doubling from 0.05 s, some 20 times).
    assert unwatched == 0, f"{unwatched} requests in 1.5 s for a quiet job nobody watches"


def test_a_nodes_heartbeats_are_recorded_while_its_reports_wait_on_the_database(two_nodes, monkeypatch):
    import threading

    from scheduling.agents.reports import job_status

    _, on_b, node_b, token_b = two_nodes
    real = job_status.job_starts_record
    release = threading.Event()

    def stuck(**kw):  # a database where the start reports wait (a cycle's wave of them, a lock)
        release.wait(10 * TIMEOUT_SCALE)
        return real(**kw)

    monkeypatch.setattr(job_status, "job_starts_record", stuck)
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
    import threading

    from channels.layers import get_channel_layer

    from scheduling.realtime import groups

    _, _, _, token_b = two_nodes
    real = desired.read_desired
    reads, done = [], []
    storm_in = threading.Event()

    def slow_read(node_id):  # a busy database: the first read fails, the second lasts the whole storm
        reads.append(node_id)
        try:
            if len(reads) == 1:
                raise RuntimeError("the database went away for a moment")
            if len(reads) == 2:
                storm_in.wait(10 * TIMEOUT_SCALE)
            return real(node_id)
        finally:
            done.append(node_id)

    notices = []
    real_notice = desired.DesiredStateOut.notice

    async def counted(self, event):
        notices.append(event)
        await real_notice(self, event)

    monkeypatch.setattr(desired.DesiredStateOut, "notice", counted)
    # Django's setup, run when the test first opens a socket, replaces the root logger's handlers (caplog's too).
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    room_log = logging.getLogger("scheduling.agents.socket")  # the parent of each part's logger

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        await _next(communicator, "desired_state")  # after hello
        monkeypatch.setattr(desired, "read_desired", slow_read)
        layer = get_channel_layer()
        notice = {"type": "desired.changed", "node": "a100-02"}
        await layer.group_send(groups.node("a100-02"), notice)  # its read fails
        await wait_for_async(
            "the failed read to be logged",
            lambda: any("desired state failed" in r.getMessage() for r in records),
        )
        for _ in range(20):  # a wave of job ends on the node, a notice each
            await layer.group_send(groups.node("a100-02"), notice)
        await wait_for_async("the storm's notices to reach the socket", lambda: len(notices) == 21)
        storm_in.set()  # all 20 came while the read for the first of them was under way
        await wait_for_async("the storm's reads to end", lambda: len(done) >= 3)
        await _handled_so_far(communicator)  # a few turns of the loop, for any further read to begin
        read_for_notices = len(reads)
        beat = protocol.message("heartbeat", {"node": "a100-02", "seq": 7, "running": []})
        await communicator.send_to(text_data=protocol.encode(beat))
        acked = await _next(communicator, "heartbeat_ack")  # the socket is still up
        await communicator.disconnect()
        return acked, read_for_notices

    room_log.addHandler(handler)
    try:
        acked, read_for_notices = async_to_sync(scenario)()
    finally:
        room_log.removeHandler(handler)
        storm_in.set()
    assert acked["payload"]["seq"] == 7
    # The failed one; then one for the storm's first notice, and one more for the 19 that came while it ran.
    assert read_for_notices == 3, f"{read_for_notices} reads for 21 notices"


def test_past_the_queue_limit_a_nodes_report_is_answered_send_it_again_and_lands_when_it_is(
    two_nodes, monkeypatch
):
    import threading

    from scheduling.agents.reports import node_events

    _, on_b, _, token_b = two_nodes
    monkeypatch.setattr(lanes, "MAX_QUEUED_REPORTS", 2)
    real = node_events.node_event
    release, entered = threading.Event(), threading.Event()

    def stuck(**kw):  # the database holds the first event up; the next ones queue behind it
        entered.set()
        release.wait(10 * TIMEOUT_SCALE)
        return real(**kw)

    monkeypatch.setattr(node_events, "node_event", stuck)
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
        await wait_for_async("the first event to be taken from the queue", entered.is_set)
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
    real = handlers.gpu_events_record
    release = threading.Event()

    def slow_record(**kw):  # a database that takes its time with the event
        release.wait(10 * TIMEOUT_SCALE)
        return real(**kw)

    monkeypatch.setattr(handlers, "gpu_events_record", slow_record)
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
        await wait_for_async("the XID event to be kept", sync_to_async(GpuEvent.objects.count))
        await communicator.disconnect()
        return acked, kept_meanwhile

    try:
        acked, kept_meanwhile = async_to_sync(scenario)()
    finally:
        release.set()
    assert acked["payload"]["seq"] == 3 and kept_meanwhile == 0
    assert list(GpuEvent.objects.values_list("kind", "code")) == [("xid", 79)]


def test_an_old_agent_and_a_new_one_at_the_same_portal_each_get_their_samples_kept(two_nodes, node):
    """The portal's ack of a hello says it takes batched samples (agent/protocol.py FEATURES). A new agent sends
    the samples of the last few seconds in one frame (`metrics_batch`), the newest in its heartbeat
    (`heartbeat_samples`), an older one a frame a second: all are kept, every sample of a batch reaches the
    browsers that listen, and the heartbeat that carried samples is recorded and acknowledged as any other."""
    from channels.layers import get_channel_layer

    from scheduling.agents import live_metrics
    from scheduling.realtime import groups, listeners

    on_a, on_b, _, token_b = two_nodes
    token_a = node_issue_token(node=node)
    for name in ("a100-01", "a100-02"):
        forget_live_metrics(name)

    def sample(uuid: str, util: float, at: float) -> dict:
        gpu = {"index": 0, "uuid": uuid, "util_pct": util, "memory_used_mib": 1, "memory_total_mib": 81920}
        return {"sampled_at": at, "gpus": [gpu]}

    layer = get_channel_layer()

    async def scenario():
        channel = await layer.new_channel()
        await layer.group_add(groups.job(on_b.pk), channel)
        await sync_to_async(listeners.listening_add)(groups=[groups.job(on_b.pk)], channel=channel)
        listeners.forget()
        old = await _connect(token_a, "a100-01")
        new = await _connect(token_b, "a100-02")
        acks = []
        for c in (old, new):
            # The hello's ack, and the desired state: the portal knows which job holds which card from it.
            seen: dict[str, dict] = {}
            async with asyncio.timeout(15 * TIMEOUT_SCALE):
                while not {"ack", "desired_state"} <= seen.keys():
                    got = protocol.decode(await c.receive_from(timeout=15 * TIMEOUT_SCALE))
                    seen.setdefault(got["type"], got)
            acks.append(seen["ack"]["payload"])
        now = time.time()
        await old.send_to(
            text_data=protocol.encode(protocol.message("metrics", sample("GPU-test-0", 7.0, now)))
        )
        batch = [sample("GPU-b-0", util, now - 4 + k) for k, util in enumerate((31.0, 32.0))]
        await new.send_to(text_data=protocol.encode(protocol.message("metrics", {"batch": batch})))
        riding = [sample("GPU-b-0", util, now - 2 + k) for k, util in enumerate((33.0, 34.0))]
        beat = {"node": "a100-02", "seq": 41, "running": [], "samples": riding}
        await new.send_to(text_data=protocol.encode(protocol.message("heartbeat", beat)))
        async with asyncio.timeout(15 * TIMEOUT_SCALE):
            while True:
                got = protocol.decode(await new.receive_from(timeout=15 * TIMEOUT_SCALE))
                if got["type"] == "heartbeat_ack":
                    break
        beat_acked = got["payload"]["seq"]
        for c in (old, new):
            await _handled_so_far(c)
        kept = sync_to_async(live_metrics.live_metrics_for_nodes)

        async def both_kept():
            found = await kept(node_names=["a100-01", "a100-02"])
            utils = (
                found.get("a100-01", {}).get(0, {}).get("util_pct"),
                found.get("a100-02", {}).get(0, {}).get("util_pct"),
            )
            return utils if utils == (7.0, 34.0) else None

        utils = await wait_for_async("both nodes' newest samples kept", both_kept, timeout_s=15)
        heard = []
        while len(heard) < 4:
            message = await asyncio.wait_for(layer.receive(channel), timeout=15)
            if message["type"] == "job.metrics":
                heard.append(message["gpus"][0]["util_pct"])
        for c in (old, new):
            await c.disconnect()
        await sync_to_async(listeners.listening_remove)(groups=[groups.job(on_b.pk)], channel=channel)
        return acks, utils, heard, beat_acked

    acks, utils, heard, beat_acked = async_to_sync(scenario)()
    assert all(a["features"] == list(protocol.FEATURES) for a in acks)
    assert utils == (7.0, 34.0) and beat_acked == 41
    assert heard == [31.0, 32.0, 33.0, 34.0]  # the live charts keep one point a second


def test_a_batchs_older_samples_nobody_watches_still_count_in_their_jobs_usage_and_the_newest_is_kept_whole(
    two_nodes,
):
    # With no browser listening, a batch's older samples are read only for what a job's usage needs; the peak
    # GPU memory must still see them, and the node's live sample is its newest, every field.
    from scheduling.agents import live_metrics
    from scheduling.realtime import listeners

    _, on_b, _, token_b = two_nodes
    forget_live_metrics("a100-02")

    def sample(util: float, memory_mib: int, at: float) -> dict:
        gpu = {
            "index": 0,
            "uuid": "GPU-b-0",
            "util_pct": util,
            "memory_used_mib": memory_mib,
            "memory_total_mib": 81920,
            "power_w": 300.5,
            "temperature_c": 61,
        }
        return {"sampled_at": at, "gpus": [gpu]}

    async def scenario():
        listeners.forget()
        new = await _connect(token_b, "a100-02")
        await _next(new, "desired_state")
        now = time.time()
        batch = [sample(90.0, 30_000, now - 2), sample(3.0, 2_000, now - 1), sample(2.0, 2_010, now)]
        await new.send_to(text_data=protocol.encode(protocol.message("metrics", {"batch": batch})))
        await _handled_so_far(new)
        usage = sync_to_async(live_metrics.job_usage)

        async def folded():
            got = (await usage(job_ids=[on_b.pk])).get(on_b.pk)
            return got if got and got.get("util_pct") == 2.0 else None

        got = await wait_for_async("the batch folded into the job's usage", folded, timeout_s=15)
        live = await sync_to_async(live_metrics.live_metrics_for_nodes)(node_names=["a100-02"])
        await new.disconnect()
        return got, live["a100-02"][0]

    usage, live = async_to_sync(scenario)()
    assert usage["peak_memory_mib"] == 30_000  # from the batch's oldest sample
    assert usage["fresh"]
    assert (live["util_pct"], live["memory_used_mib"], live["power_w"], live["temperature_c"]) == (
        2.0,
        2010,
        300.5,
        61,
    )


def test_a_state_the_database_moved_on_to_is_resent_at_the_second_heartbeat_that_finds_it_missing(
    two_nodes, monkeypatch
):
    # A heartbeat finding the node's state newer in the database than what its connection sent may have come
    # while the cycle's push is on its way (or while the agent applies what it was sent): resending at once read
    # and sent every busy node's state again during a cycle's wave of placements. The next heartbeat that finds the
    # same resends it: a notification lost (Redis restarting) still reaches the agent.
    from django.db.models import F

    from scheduling.cycle.models import NodeSync

    _, _, node_b, token_b = two_nodes
    resends: list[str] = []
    real = link.NodeLink.beside_once

    def noting(self, name, start, what):
        if name == "resend":
            resends.append(what)
        return real(self, name, start, what)

    monkeypatch.setattr(link.NodeLink, "beside_once", noting)

    def beat(seq: int, held: int) -> dict:
        return protocol.message(
            "heartbeat", {"node": "a100-02", "seq": seq, "desired_version": held, "running": []}
        )

    async def scenario():
        communicator = await _connect(token_b, "a100-02")
        sent = (await _next(communicator, "desired_state"))["payload"]["version"]
        await communicator.send_to(text_data=protocol.encode(beat(1, sent)))
        await _next(communicator, "heartbeat_ack", seq=1)
        in_step = list(resends)
        # The database moves on and its notice never comes (what a Redis restart loses).
        await sync_to_async(
            lambda: NodeSync.objects.filter(node=node_b).update(desired_version=F("desired_version") + 1)
        )()
        await communicator.send_to(text_data=protocol.encode(beat(2, sent)))
        await _next(communicator, "heartbeat_ack", seq=2)
        after_first = list(resends)
        await communicator.send_to(text_data=protocol.encode(beat(3, sent)))
        await _next(communicator, "heartbeat_ack", seq=3)
        resent = await _next(communicator, "desired_state")
        await communicator.disconnect()
        return sent, in_step, after_first, resent

    sent, in_step, after_first, resent = async_to_sync(scenario)()
    assert in_step == [] and after_first == []
    assert resends == ["desired state"]
    assert resent["payload"]["version"] == sent + 1
