"""A node's conditions in the API (one rule, scheduling.inventory.selectors.node_condition, that `tessera nodes`
and the portal's node tiles show): heartbeat age, connected or why not, the last error, cordoned or draining."""

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduling.agents.reports.node_events import node_event
from scheduling.choices import NodeState
from scheduling.cycle.models import NodeSync
from scheduling.inventory.models import Node
from scheduling.inventory.selectors import node_condition

pytestmark = pytest.mark.django_db

NODE = "/api/v1/cluster/nodes/a100-01/"


def test_the_rule_never_connected_connected_silent_disconnected(settings):
    settings.TESSERA_AGENT_HEARTBEAT_S = 5.0
    now = timezone.now()
    never = node_condition(state="ready", last_heartbeat_at=None, now=now)
    assert (never.connection, never.connected, never.connection_reason) == (
        "never_connected",
        False,
        "never connected",
    )
    fresh = node_condition(state="ready", last_heartbeat_at=now - timedelta(seconds=3), now=now)
    assert (fresh.connected, fresh.heartbeat_age_s, fresh.connection_reason) == (
        True,
        3.0,
        "heartbeat 3 s ago",
    )
    silent = node_condition(state="cordoned", last_heartbeat_at=now - timedelta(seconds=40), now=now)
    assert (silent.connection, silent.connection_reason, silent.cordoned) == (
        "silent",
        "agent silent for 40 s",
        True,
    )
    hello, gone = now - timedelta(minutes=10), now - timedelta(minutes=4)
    closed = node_condition(
        state="ready", last_heartbeat_at=gone, connected_at=hello, disconnected_at=gone, now=now
    )
    assert closed.connection == "disconnected"
    assert closed.connection_reason.startswith(f"disconnected at {gone:%Y-%m-%d %H:%M:%S} UTC (")
    again = node_condition(
        state="ready", last_heartbeat_at=now, connected_at=now, disconnected_at=gone, now=now
    )
    assert again.connected  # a hello after the close: connected again


def test_the_api_shows_conditions_and_the_last_agent_reported_problem(as_alice, node):
    body = as_alice.get(NODE).json()["conditions"]
    assert (body["connection"], body["heartbeat_age_s"], body["last_error"]) == (
        "never_connected",
        None,
        None,
    )
    assert (body["cordoned"], body["draining"], body["schedulable"]) == (False, False, True)

    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now(), state=NodeState.DRAINING)
    node_event(
        node_id=node.pk, payload={"kind": "mps_unavailable", "detail": "nvidia-cuda-mps-control: not found"}
    )
    body = as_alice.get(NODE).json()["conditions"]
    assert body["connected"] and body["connection_reason"].startswith("heartbeat ")
    assert (body["draining"], body["schedulable"]) == (True, False)
    assert body["last_error"] == "MPS unavailable: nvidia-cuda-mps-control: not found"
    assert body["last_error_at"]

    uuid = node.gpus.get(index=2).uuid
    node_event(node_id=node.pk, payload={"kind": "gpu_health", "gpu_uuid": uuid, "health": "failed"})
    assert NodeSync.objects.get(node=node).last_error == "GPU 2 reported failed"
    listed = as_alice.get("/api/v1/cluster/nodes/").json()["results"][0]["conditions"]
    assert listed["last_error"] == "GPU 2 reported failed"


def test_a_gpus_bad_health_stays_the_last_error_until_every_gpu_of_the_node_is_ok_again(node):
    first, second = (node.gpus.get(index=i).uuid for i in (0, 1))
    node_event(node_id=node.pk, payload={"kind": "gpu_health", "gpu_uuid": first, "health": "failed"})
    node_event(node_id=node.pk, payload={"kind": "gpu_health", "gpu_uuid": second, "health": "degraded"})
    node_event(node_id=node.pk, payload={"kind": "gpu_health", "gpu_uuid": second, "health": "ok"})
    assert NodeSync.objects.get(node=node).last_error == "GPU 1 reported degraded"
    node_event(node_id=node.pk, payload={"kind": "gpu_health", "gpu_uuid": first, "health": "ok"})
    sync = NodeSync.objects.get(node=node)
    assert (sync.last_error, sync.last_error_at) == ("", None)


def test_mps_trouble_is_cleared_by_a_hello_saying_the_agent_has_mps(node):
    from scheduling.agents.reports.hello import node_hello

    node_event(node_id=node.pk, payload={"kind": "mps_unavailable", "detail": "no daemon"})
    assert NodeSync.objects.get(node=node).last_error == "MPS unavailable: no daemon"
    gpus = [
        {"index": g.index, "uuid": g.uuid, "memory_mib": g.memory_mib, "model": g.model.name}
        for g in node.gpus.all()
    ]
    node_hello(node_id=node.pk, payload={"node": node.name, "inventory": {"gpus": gpus}})
    assert NodeSync.objects.get(node=node).last_error == "MPS unavailable: no daemon", "still no MPS binary"
    hello = {"node": node.name, "inventory": {"gpus": gpus}, "capabilities": {"mps": True}}
    node_hello(node_id=node.pk, payload=hello)
    assert NodeSync.objects.get(node=node).last_error == ""
