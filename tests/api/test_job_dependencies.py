"""/api/v1/jobs with `depends_on`: sbatch's words or a list, shown back in the job's spec, refused with the field
when it names a job the submitter cannot see or one that cannot be met."""

from __future__ import annotations

import pytest

from scheduling.cycle import runner

pytestmark = pytest.mark.django_db

STEP = {"name": "step", "command": "python step.py", "gpus": 1}


def test_a_dependency_in_sbatchs_words_waits_and_is_shown_in_the_spec(as_alice):
    sweep = as_alice.post("/api/v1/jobs/", {**STEP, "name": "sweep", "array": "0-3"}, format="json").json()
    body = {**STEP, "name": "eval", "depends_on": f"afterok:{sweep['id']}"}
    response = as_alice.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    runner.cycle_run_once()
    detail = as_alice.get(f"/api/v1/jobs/{response.json()['id']}/").json()
    assert detail["pending_reason_code"] == "dependency"
    assert (
        detail["pending_reason"] == f"Waits for array {sweep['id']} to succeed (0 of its 4 tasks have ended)."
    )
    assert detail["spec"]["depends_on"] == [{"job": sweep["id"], "when": "succeeded"}]


@pytest.mark.parametrize(
    ("depends_on", "code", "words"),
    [
        ("afterok:999999", "bad_dependency", "there is no job 999999 that you may see"),
        ("afterok:1,afterany:1", "bad_dependency", "names job 1 twice"),
        ([{"job": 1, "when": "later"}], "invalid", "when must be one of"),
    ],
)
def test_a_dependency_that_cannot_be_is_refused_naming_the_field(as_alice, depends_on, code, words):
    response = as_alice.post("/api/v1/jobs/", {**STEP, "depends_on": depends_on}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["field"], error["code"]) == ("depends_on", code) and words in error["message"], error
