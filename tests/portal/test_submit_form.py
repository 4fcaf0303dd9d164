"""The submit form's choices and the what-if's advice, through Django's test client: the priority list is the
team's, a class it may not use is its permission (not a capacity verdict), a suggestion carries the values that
ask for it, a job no node can hold is offered a split over nodes, and a job with no runtime limit is nudged."""

from __future__ import annotations

import html
import json
import re
from decimal import Decimal

import pytest
from django.test import Client

from quotas.models import Quota
from scheduling.cycle import whatif
from scheduling.cycle.runner import cycle_run_once
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job
from scheduling.jobs.submit import job_submit

pytestmark = pytest.mark.django_db

FORM = {
    "name": "form-job",
    "team": "ai-lab/training",
    "kind": "whole",
    "gpus": "1",
    "topology": "none",
    "nodes": "1",
    "command_form": "argv",
    "command": "python train.py",
}


@pytest.fixture(autouse=True)
def _fresh_snapshot(monkeypatch):
    monkeypatch.setattr(whatif, "_cached", None)


@pytest.fixture
def second_node(node, a100):
    """Another node of 8 A100s beside `node`, so a gang of two nodes can be had."""
    from scheduling.inventory.models import Gpu, Node

    added = Node.objects.create(name="a100-02", cpu_milli=128_000, memory_mib=1024 * 1024)
    for i in range(8):
        Gpu.objects.create(node=added, index=i, uuid=f"GPU-second-{i}", model=a100, memory_mib=81920)
    return added


@pytest.fixture
def training_may_hold_16(teams):
    Quota.objects.filter(team=teams["training"], gpu_model=None).update(
        limit_gpus=Decimal(16), limit_gpu_memory_mib=16 * 81920
    )


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _preview(client: Client, **change) -> str:
    return client.post("/jobs/new/preview/", {**FORM, **change}).content.decode()


def _suggestion(preview: str) -> tuple[str, dict, str]:
    """The what-if's suggestion: its words, the values its button applies, the button's words."""
    said = re.search(r'id="whatif-alt">(.*?)</p>', preview, re.S)
    assert said, preview[:2000]
    button = re.search(r'<button type="button"[^>]*data-apply="([^"]*)"[^>]*>([^<]*)</button>', said.group(1))
    assert button, said.group(1)
    return html.unescape(said.group(1)), json.loads(html.unescape(button.group(1))), button.group(2)


def _options(page: str, select_id: str) -> list[str]:
    select = re.search(rf'<select[^>]*id="{select_id}"[^>]*>(.*?)</select>', page, re.S)
    assert select, page[:2000]
    return re.findall(r'<option value="([^"]*)"', select.group(1))


def test_the_priority_list_offers_only_the_classes_of_the_chosen_team(alice, teams, grant, node):
    from quotas.services import membership_set

    membership_set(user=alice, team=teams["inference"])
    grant(teams["inference"], "critical")
    client = _signed_in(alice)
    page = html.unescape(client.get("/jobs/new/").content.decode())  # the first team: ai-lab/inference
    assert _options(page, "id_priority") == ["", "critical", "training", "inference"]
    assert "The team's default (inference)" in page
    by_team = json.loads(re.search(r'id="priority-options"[^>]*>(.*?)</script>', page, re.S).group(1))
    assert by_team["ai-lab/training"] == [
        ["", "The team's default (training)"],
        ["training", "training"],
        ["inference", "inference"],
    ]
    refused = client.post("/jobs/new/", {**FORM, "command": ""}).content.decode()  # shown again for training
    assert _options(refused, "id_priority") == ["", "training", "inference"]


def test_a_class_the_team_may_not_use_is_refused_as_its_permission_beside_the_field(alice, teams, node):
    client = _signed_in(alice)
    said = "team ai-lab/training may not use priority class critical; it may use: training, inference"
    response = client.post("/jobs/new/", {**FORM, "priority": "critical"})
    page = html.unescape(response.content.decode())
    assert response.status_code == 400
    assert said in re.search(r'id="error-priority">([^<]*)<', page).group(1)
    preview = html.unescape(_preview(client, priority="critical"))
    assert "Can never run" not in preview
    beside = re.search(r'<div id="said-priority" hx-swap-oob="true">(.*?)</div>', preview, re.S).group(1)
    assert said in beside
    assert not Job.objects.exists()


def test_a_forbidden_class_is_named_with_every_other_refused_field_at_once(alice, teams, node):
    change = {"gpus": "two", "max_runtime": "forever", "command": "", "priority": "critical"}
    page = html.unescape(_signed_in(alice).post("/jobs/new/", {**FORM, **change}).content.decode())
    said = dict(re.findall(r'id="error-(\w+)">([^<]*)<', page))
    assert set(said) >= {"gpus", "max_runtime", "command", "priority"}, said
    assert "may not use priority class critical" in said["priority"]


def test_a_gang_that_waits_is_offered_fewer_gpus_per_node_with_a_button_that_applies_them(
    alice, teams, node, second_node, training_may_hold_16
):
    for name in ("hold-1", "hold-2"):  # one card busy on each node: no node has 8 free
        job_submit(
            submitter=alice, team=teams["training"], spec=JobSpec(name=name, command="sleep 1", gpus=1)
        )
    cycle_run_once()
    assert Job.objects.filter(state="placed").count() == 2
    preview = _preview(_signed_in(alice), gpus="8", nodes="2")
    assert 'data-verdict="waits"' in preview or 'data-verdict="later"' in preview, preview[:1500]
    said, values, button = _suggestion(preview)
    assert "4 GPUs per node instead of 8 starts now." in said
    assert values == {"gpus": 4} and button == "Use 4 GPUs per node"


def test_a_job_no_node_can_hold_is_offered_a_split_over_nodes_that_fits(
    alice, teams, node, second_node, training_may_hold_16
):
    preview = _preview(_signed_in(alice), gpus="12")
    assert "Can never run here: 12 GPUs on one node can never be had: the most on any node is 8." in preview
    said, values, button = _suggestion(preview)
    assert "2 nodes x 6 GPUs starts now." in said
    assert values == {"gpus": 6, "nodes": 2} and button == "Use 2 nodes x 6 GPUs"


def test_a_job_without_a_runtime_limit_gets_a_note_beside_that_field(alice, teams, node):
    client = _signed_in(alice)
    note = r'<p class="hint runtime-note" id="note-max_runtime" hx-swap-oob="true">([^<]*)</p>'
    preview = _preview(client)
    assert "{#" not in preview and "{%" not in preview  # no template text shown
    without = re.search(note, preview).group(1)
    assert (
        "Without a runtime limit the scheduler cannot backfill this job or estimate starts behind it"
        in without
    )
    assert re.search(note, _preview(client, max_runtime="2h")).group(1) == ""


def test_the_form_submits_an_array_and_the_list_shows_it_as_one_line_with_its_tasks(node, alice):
    client = _signed_in(alice)
    response = client.post("/jobs/new/", {**FORM, "name": "sweep", "array": "0-9%4"})
    assert response.status_code == 302, response.content.decode()[:2000]
    array = Job.objects.get()
    assert (array.array_spec, array.array_task_count, array.array_max_running) == ("0-9%4", 10, 4)
    cycle_run_once()  # %4: tasks 0-3 placed
    page = client.get("/jobs/").content.decode()
    assert page.count('data-job="') == 1  # one line for the array
    assert "array 0-9%4" in page and "its 10 tasks" in page
    assert ">6 pending</span>" in page and ">4 placed</span>" in page
    tasks = client.get(f"/jobs/?array={array.pk}").content.decode()
    assert tasks.count('data-job="') == 4 and f">{array.pk}_3</a>" in tasks
    detail = client.get(f"/jobs/{array.pk}/").content.decode()
    assert "10 tasks (0-9%4), at most 4 at once" in detail


def test_an_array_written_wrong_is_said_beside_its_field(node, alice):
    response = _signed_in(alice).post("/jobs/new/", {**FORM, "array": "0-9%0"})
    assert response.status_code == 400
    said = html.unescape(response.content.decode())
    assert re.search(r'id="error-array"[^>]*>[^<]*%0 would never run a task', said), said[-3000:]
    assert not Job.objects.exists()
