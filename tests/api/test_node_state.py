"""Cordon, drain and uncordon through the API: staff only, a reason required, every change in the node's audit
trail; a member's attempt is 403 and changes nothing."""

import pytest

from scheduling.choices import NodeState
from scheduling.errors import ServiceError
from scheduling.inventory.models import Node, NodeStateChange
from scheduling.inventory.services import node_set_state

pytestmark = pytest.mark.django_db

STATE = "/api/v1/cluster/nodes/a100-01/state/"


def test_staff_cordons_a_node_and_the_change_is_audited(as_admin, admin_user, node):
    response = as_admin.post(STATE, {"state": "cordoned", "reason": "ECC errors on GPU 3"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["state"] == "cordoned"
    node.refresh_from_db()
    assert node.state == NodeState.CORDONED
    change = NodeStateChange.objects.get(node=node)
    assert (change.actor, change.from_state, change.to_state, change.reason) == (
        admin_user,
        "ready",
        "cordoned",
        "ECC errors on GPU 3",
    )
    trail = as_admin.get("/api/v1/cluster/nodes/a100-01/state-changes/").json()["results"]
    assert [(c["actor"], c["from_state"], c["to_state"], c["reason"]) for c in trail] == [
        ("admin", "ready", "cordoned", "ECC errors on GPU 3")
    ]


def test_drain_then_uncordon_are_two_rows_newest_first(as_admin, node):
    as_admin.post(STATE, {"state": "draining", "reason": "kernel update"}, format="json")
    as_admin.post(STATE, {"state": "ready", "reason": "updated"}, format="json")
    trail = as_admin.get("/api/v1/cluster/nodes/a100-01/state-changes/").json()["results"]
    assert [(c["from_state"], c["to_state"]) for c in trail] == [("draining", "ready"), ("ready", "draining")]


def test_a_member_gets_403_and_nothing_is_saved(as_alice, node):
    response = as_alice.post(STATE, {"state": "cordoned", "reason": "I want it"}, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    node.refresh_from_db()
    assert node.state == NodeState.READY and not NodeStateChange.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"state": "lost", "reason": "x"}, "state"),
        ({"state": "offline", "reason": "x"}, "state"),
        ({"state": "cordoned"}, "reason"),
        ({"state": "cordoned", "reason": ""}, "reason"),
    ],
)
def test_a_bad_state_or_a_missing_reason_is_400_naming_the_field(as_admin, node, body, field):
    response = as_admin.post(STATE, body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field
    assert Node.objects.get(pk=node.pk).state == NodeState.READY and not NodeStateChange.objects.exists()


def test_the_service_refuses_a_blank_reason_naming_it(node, admin_user):
    with pytest.raises(ServiceError) as refused:
        node_set_state(node=node, state=NodeState.CORDONED, actor=admin_user, reason="   ")
    assert refused.value.field == "reason"
    assert not NodeStateChange.objects.exists()


def test_setting_the_state_a_node_already_has_records_nothing(node, admin_user):
    node_set_state(node=node, state=NodeState.READY, actor=admin_user, reason="just checking")
    assert not NodeStateChange.objects.exists()


def test_the_database_refuses_an_audit_row_without_a_reason(node):
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        NodeStateChange.objects.create(node=node, from_state="ready", to_state="cordoned", reason="")
