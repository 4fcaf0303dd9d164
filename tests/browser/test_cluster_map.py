"""The cluster map in the browser, live: a slice appears on its GPU cell while the page is open; a member sees
no cordon button and is refused when posting anyway; an admin cordons a node with a reason from the map and the
node's page shows the audit row."""

from __future__ import annotations

import json

import pytest

from scheduling.choices import NodeState
from scheduling.inventory.models import Node, NodeStateChange
from tests.browser.test_portal import _expect_text
from tests.pipeline.harness import submit, wait_state

pytestmark = pytest.mark.slow


def _csrf(page) -> str:
    return json.loads(page.get_attribute("body", "hx-headers"))["X-CSRFToken"]


def test_a_slice_appears_on_the_map_without_a_reload_when_its_job_starts(browse):
    page = browse("alice")
    page.goto("/cluster/")
    _expect_text(page, "#live", "live")
    _expect_text(page, ".node-tile[data-node='pipe-a']", "heartbeat")
    page.evaluate("window.__noReload = true")
    browse.shots(page, "before")
    job = submit(
        browse.cluster,
        name="map-slice",
        command="sleep 300",
        gpu_memory_mib=4096,
        compute_pct=25,
        gpu_models=("L4",),
    )
    wait_state(job, "running")
    page.wait_for_selector(f".gpu-slice[title^='job {job.pk} map-slice (alice, pipe-lab)']", timeout=30_000)
    cell = page.locator(f".gpu-cell:has(.gpu-slice[title^='job {job.pk} '])")
    label = cell.get_attribute("aria-label")
    assert f"job {job.pk} map-slice (alice, pipe-lab): 4 GiB + 25%" in label and "held by 1 slice" in label
    assert "pipe-lab" in page.inner_text("#map-legend")
    _expect_text(page, "[data-summary-for='totals']", r"(0\.[1-9]|[1-9][0-9.]*) allocated")  # the rows follow
    assert page.evaluate("window.__noReload") is True, "the page reloaded"
    page.hover(f".gpu-slice[title^='job {job.pk} ']")
    browse.shots(page, "slice-live")
    assert page.errors == []


def test_bob_sees_no_cordon_button_and_his_post_is_refused(browse):
    page = browse("bob")
    page.goto("/cluster/")
    _expect_text(page, ".node-tile[data-node='pipe-a']", "pipe-a")
    assert page.locator("[data-set-state]").count() == 0
    page.goto("/cluster/pipe-a/")
    assert page.locator("[data-set-state]").count() == 0
    browse.shots(page, "node-as-bob")
    token = _csrf(page)
    form = page.request.post(
        "/cluster/pipe-a/state/",
        form={"state": "cordoned", "reason": "bob wants it"},
        headers={"X-CSRFToken": token},
    )
    assert form.status == 403
    api = page.request.post(
        "/api/v1/cluster/nodes/pipe-a/state/",
        data=json.dumps({"state": "cordoned", "reason": "bob wants it"}),
        headers={"X-CSRFToken": token, "Content-Type": "application/json"},
    )
    assert api.status == 403 and api.json()["error"]["code"] == "permission_denied"
    assert Node.objects.get(name="pipe-a").state == NodeState.READY
    assert not NodeStateChange.objects.filter(reason="bob wants it").exists()


def test_an_admin_cordons_a_node_from_the_map_with_a_reason_and_the_audit_row_appears(browse):
    from django.contrib.auth import get_user_model

    from scheduling.inventory.services import node_set_state

    users = get_user_model()
    if not users.objects.filter(username="root").exists():
        users.objects.create_user(username="root", password="root-pw", is_staff=True)
    page = browse("root")
    try:
        page.goto("/cluster/")
        page.click(".node-tile[data-node='pipe-b'] [data-set-state='cordoned']")
        page.fill("#state-reason", "Fan failure, ticket 42")
        browse.shots(page, "dialog")
        page.click("#state-submit")
        _expect_text(page, ".messages", "pipe-b is now cordoned")
        _expect_text(page, ".node-tile[data-node='pipe-b'] .badge", "Cordoned")
        browse.shots(page, "cordoned")
        page.click(".node-tile[data-node='pipe-b'] a.node-name")
        page.wait_for_url("**/cluster/pipe-b/")
        row = page.locator("#node-audit tbody tr").first
        assert "root" in row.inner_text() and "Fan failure, ticket 42" in row.inner_text()
        assert "Cordoned" in row.inner_text() and "Ready" in row.inner_text()
        _expect_text(page, "#node-gpus", "SM clock")
        browse.shots(page, "node-page")
        assert Node.objects.get(name="pipe-b").state == NodeState.CORDONED
        assert page.errors == []
    finally:
        node = Node.objects.get(name="pipe-b")
        if node.state != NodeState.READY:
            node_set_state(node=node, state=NodeState.READY, actor=None, reason="end of the browser test")
