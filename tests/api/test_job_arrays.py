"""/api/v1/jobs with `array`: one request makes the whole sweep, the list shows it as one line with counts, it
expands to its tasks, and it is cancelled whole or task by task."""

from __future__ import annotations

import pytest

from scheduling.cycle import runner
from scheduling.jobs.models import Job

pytestmark = pytest.mark.django_db

SWEEP = {"name": "sweep", "command": "python sweep.py --seed $TESSERA_ARRAY_TASK_ID", "gpus": 1}


def test_one_request_submits_a_ten_thousand_task_array_as_one_row(as_alice):
    response = as_alice.post("/api/v1/jobs/", {**SWEEP, "array": "0-9999%50"}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["array"] == {
        "id": body["id"],
        "task_id": None,
        "tasks": "0-9999%50",
        "task_count": 10000,
        "max_running": 50,
        "counts": {"pending": 10000},
    }
    assert Job.objects.count() == 1  # never a row per task (bench/cluster_scale.py times the request)


def test_the_list_shows_an_array_as_one_line_with_counts_and_expands_to_its_tasks(as_alice):
    array_id = as_alice.post("/api/v1/jobs/", {**SWEEP, "array": "0-9"}, format="json").json()["id"]
    runner.cycle_run_once()  # 8 cards: tasks 0-7 placed, 8-9 wait in the array's row
    (line,) = as_alice.get("/api/v1/jobs/").json()["results"]
    assert line["id"] == array_id and line["state"] == "pending"
    assert line["array"]["counts"] == {"pending": 2, "placed": 8}
    tasks = as_alice.get(f"/api/v1/jobs/?array={array_id}&page_size=100").json()["results"]
    assert sorted(t["array"]["task_id"] for t in tasks if t["array"]["task_id"] is not None) == list(range(8))
    assert all(t["array"]["id"] == array_id for t in tasks)


def test_a_state_filter_finds_an_array_by_the_states_of_its_tasks(as_alice):
    """The array's line is `pending` while 2 tasks wait and 8 are placed: ?state=placed finds it too, and
    ?state=running (none yet) does not; within the array, the filter is by each task's own state."""
    array_id = as_alice.post("/api/v1/jobs/", {**SWEEP, "array": "0-9"}, format="json").json()["id"]
    single = as_alice.post("/api/v1/jobs/", {**SWEEP, "name": "single", "gpus": 8}, format="json").json()[
        "id"
    ]
    runner.cycle_run_once()

    def listed(query: str) -> list[int]:
        return [j["id"] for j in as_alice.get(f"/api/v1/jobs/?{query}").json()["results"]]

    assert listed("state=placed") == [array_id]
    assert sorted(listed("state=pending")) == sorted([array_id, single])
    assert listed("state=running") == []
    assert listed("state=running&state=placed") == [array_id]
    assert len(listed(f"array={array_id}&state=placed&page_size=100")) == 8


def test_within_an_array_each_task_is_filtered_by_its_own_state(as_alice):
    """Every task placed: the array's first row is its last task. Ended, it is listed among the tasks by its own
    state, while the array's line is found by any of its tasks' states."""
    from scheduling.jobs.transitions import job_transition

    array_id = as_alice.post("/api/v1/jobs/", {**SWEEP, "array": "0-7"}, format="json").json()["id"]
    runner.cycle_run_once()
    first = Job.objects.get(pk=array_id)
    assert first.array_task_id is not None and first.state == "placed"
    for state in ("running", "succeeded"):
        job_transition(job=first, to_state=state, actor_kind="agent")

    def listed(query: str) -> list[int]:
        return [j["id"] for j in as_alice.get(f"/api/v1/jobs/?{query}&page_size=100").json()["results"]]

    assert (
        array_id not in listed(f"array={array_id}&state=placed")
        and len(listed(f"array={array_id}&state=placed")) == 7
    )
    assert listed(f"array={array_id}&state=succeeded") == [array_id]
    assert listed("state=placed") == [array_id] and listed("state=succeeded") == [array_id]


def test_some_tasks_are_cancelled_then_the_rest(as_alice):
    array_id = as_alice.post("/api/v1/jobs/", {**SWEEP, "array": "0-9"}, format="json").json()["id"]
    runner.cycle_run_once()
    some = as_alice.post(f"/api/v1/jobs/{array_id}/cancel/", {"tasks": "6-8"}, format="json")
    assert some.status_code == 200, some.json()
    # 6 and 7 were placed (cancelled as jobs), 8 was still in the array's row (it leaves it).
    assert some.json()["array"]["counts"] == {"cancelled": 3, "pending": 1, "placed": 6}
    assert Job.objects.get(pk=array_id).array_pending == "9"
    again = as_alice.post(f"/api/v1/jobs/{array_id}/cancel/", {"tasks": "6-8"}, format="json")
    assert again.status_code == 409 and "no live task among 6-8" in again.json()["error"]["message"]
    rest = as_alice.post(f"/api/v1/jobs/{array_id}/cancel/")
    assert rest.status_code == 200
    assert rest.json()["state"] == "cancelled" and rest.json()["array"]["counts"] == {"cancelled": 10}


def test_a_cancel_body_that_is_not_json_is_refused_and_cancels_nothing(as_alice):
    """Tasks named in a YAML body were once read as no body at all: the whole array was cancelled."""
    array_id = as_alice.post("/api/v1/jobs/", {**SWEEP, "array": "0-9"}, format="json").json()["id"]
    runner.cycle_run_once()
    refused = as_alice.post(
        f"/api/v1/jobs/{array_id}/cancel/", data=b'tasks: "3-4"\n', content_type="application/yaml"
    )
    assert refused.status_code == 415 and refused.json()["error"]["message"]
    assert not Job.objects.filter(array_job_id=array_id, state="cancelled").exists()
    assert as_alice.post(f"/api/v1/jobs/{array_id}/cancel/").status_code == 200  # no body: the whole array


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({**SWEEP, "array": "0-10%0"}, "array", "%0 would never run a task"),
        ({**SWEEP, "array": "9-1"}, "array", "runs backwards"),
        ({**SWEEP, "array": "0-100000"}, "array", "has 100,001 tasks; an array has at most 10,000"),
        ({**SWEEP, "array": "0-9%\u00b2"}, "array", "is not a whole number of tasks to run at once"),
    ],
)
def test_an_array_written_wrong_is_refused_naming_the_field(as_alice, body, field, words):
    response = as_alice.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["field"] == field and words in error["message"], error
    assert Job.objects.count() == 0


def test_tasks_to_cancel_written_wrong_or_of_a_single_job_are_refused(as_alice):
    single = as_alice.post("/api/v1/jobs/", SWEEP, format="json").json()["id"]
    response = as_alice.post(f"/api/v1/jobs/{single}/cancel/", {"tasks": "1-3"}, format="json")
    assert response.status_code == 400 and response.json()["error"]["field"] == "tasks"
    array_id = as_alice.post("/api/v1/jobs/", {**SWEEP, "array": "0-9"}, format="json").json()["id"]
    response = as_alice.post(f"/api/v1/jobs/{array_id}/cancel/", {"tasks": "3-"}, format="json")
    assert response.status_code == 400 and response.json()["error"]["field"] == "tasks"
    assert Job.objects.get(pk=array_id).state == "pending"


def test_tasks_to_cancel_named_by_the_million_are_refused_at_once(as_alice):
    array_id = as_alice.post("/api/v1/jobs/", {**SWEEP, "array": "0-9"}, format="json").json()["id"]
    response = as_alice.post(f"/api/v1/jobs/{array_id}/cancel/", {"tasks": "0-3999999"}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["field"], error["code"], error["limit"]) == ("tasks", "out_of_range", 10000), error
    wide = as_alice.post(f"/api/v1/jobs/{array_id}/cancel/", {"tasks": "5-9999"}, format="json")
    assert wide.status_code == 200 and wide.json()["array"]["counts"] == {"cancelled": 5, "pending": 5}
