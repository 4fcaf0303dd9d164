"""Query and body values the schema does not allow are refused naming them; values it allows are not.

schemathesis checks the same both ways with generated requests (tests/api/test_schemathesis.py); these are the
cases it once found, and the rules behind them (portal/api_params.py, scheduling/jobs/api/spec_schema.py)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from quotas.models import ApiToken
from scheduling.jobs.models import Job

pytestmark = pytest.mark.django_db

SPEC = {"name": "j", "command": "python run.py", "gpus": 1}


@pytest.fixture
def as_alice(alice, node):
    client = APIClient()
    client.force_authenticate(alice)
    return client


def _refused(response, field: str, code: str = "invalid") -> None:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["field"], error["code"]) == (field, code), error


def test_a_token_name_must_be_text_not_a_number(as_alice):
    response = as_alice.post("/api/v1/tokens/", {"name": 0}, format="json")
    assert response.status_code == 400 and response.json()["error"]["field"] == "name"
    assert not ApiToken.objects.exists()


def test_usage_format_must_be_json_or_csv(as_alice):
    empty = as_alice.get("/api/v1/usage/?format=")
    assert empty.status_code == 400 and empty.json()["error"]["field"] == "format"
    # A format no renderer answers to is DRF's 404 (documented), in the API's error format.
    other = as_alice.get("/api/v1/usage/?format=xml")
    assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"


def test_a_parent_team_id_with_no_team_lists_nothing_rather_than_refusing(as_alice, teams):
    response = as_alice.get("/api/v1/teams/?parent=987654")
    assert response.status_code == 200 and response.json()["results"] == []


def test_page_bounds_are_in_the_schema_as_the_api_enforces_them(as_alice):
    schema = as_alice.get("/api/schema/?format=json").json()
    params = {p["name"]: p["schema"] for p in schema["paths"]["/api/v1/jobs/"]["get"]["parameters"]}
    assert params["page"]["minimum"] == 1
    assert (params["page_size"]["minimum"], params["page_size"]["maximum"]) == (1, 500)
    assert as_alice.get("/api/v1/jobs/?page_size=501").status_code == 400


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/api/v1/jobs/?team=", "team"),
        ("/api/v1/jobs/?state=", "state"),
        ("/api/v1/jobs/?submitted_before=", "submitted_before"),
        ("/api/v1/queue/?priority=", "priority"),
        ("/api/v1/cluster/nodes/?state=", "state"),
        ("/api/v1/priority-classes/?preemptible=", "preemptible"),
        ("/api/v1/usage/?since=", "since"),
        ("/api/v1/usage/?team=", "team"),
        ("/api/v1/jobs/?page=", "page"),
    ],
)
def test_a_query_parameter_given_with_no_value_is_refused_naming_it(as_alice, path, field):
    response = as_alice.get(path)
    _refused(response, field)
    assert "leave the parameter out" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/jobs/?team=a%00b",
        "/api/v1/tokens/?name=%00",
        "/api/v1/teams/?slug=x%00",
        "/api/v1/usage/?user=%00",
    ],
)
def test_a_nul_character_in_a_text_filter_is_refused_naming_it(as_alice, path):
    response = as_alice.get(path)
    _refused(response, path.split("?")[1].split("=")[0])
    assert "NUL" in response.json()["error"]["message"]


@pytest.mark.parametrize("value", ["null", "1", "True", "yes", "maybe"])
def test_a_boolean_filter_takes_only_true_or_false(as_alice, value):
    _refused(as_alice.get(f"/api/v1/priority-classes/?preemptible={value}"), "preemptible")


def test_a_boolean_filter_filters(as_alice, priority_classes):
    names = [r["name"] for r in as_alice.get("/api/v1/priority-classes/?preemptible=false").json()["results"]]
    assert names and all(not priority_classes[n].preemptible for n in names)


@pytest.mark.parametrize("value", ["1.5", "9.2e298", "one"])
def test_a_parent_team_id_must_be_a_whole_number(as_alice, value):
    _refused(as_alice.get(f"/api/v1/teams/?parent={value}"), "parent")


@pytest.mark.parametrize("value", ["0", "-1", "last", "x", "%2B1", "%201", "1_0"])
def test_a_page_is_a_whole_number_from_1(as_alice, value):
    _refused(as_alice.get(f"/api/v1/jobs/?page={value}"), "page")


@pytest.mark.parametrize(
    "moment",
    ["2026-01-31", "2026-01-31T09:30:00Z", "2026-01-31T09:30:00.25%2B02:00", "1970-01-01T00:00:00%2B23:59"],
)
def test_a_day_or_an_rfc_3339_date_time_is_taken_as_the_schema_says(as_alice, moment):
    assert as_alice.get(f"/api/v1/jobs/?submitted_after={moment}").status_code == 200
    assert as_alice.get(f"/api/v1/usage/?until={moment}&since=1970-01-01").status_code in (200, 400)


@pytest.mark.parametrize(
    "moment",
    [
        "yesterday",
        "Idempotent-Replayed",
        "2026-01-31T09:30:00",  # no offset: which day it means depends on where you are
        "2026-01-31 09:30:00Z",
        "2026-02-30",
        "2026-01-31T24:00:00Z",
        "1969-12-31",
        "9999-01-01",
        "٢٠٢٦-01-31",
    ],
)
def test_any_other_moment_is_refused_naming_the_parameter(as_alice, moment):
    response = as_alice.get(f"/api/v1/jobs/?submitted_after={moment}")
    _refused(response, "submitted_after")
    _refused(as_alice.get(f"/api/v1/usage/?since={moment}"), "since")


def test_the_schema_states_the_moments_the_api_takes(as_alice):
    schema = as_alice.get("/api/schema/?format=json").json()
    params = {p["name"]: p["schema"] for p in schema["paths"]["/api/v1/usage/"]["get"]["parameters"]}
    assert params["since"]["anyOf"] == [{"format": "date"}, {"format": "date-time"}]
    assert params["since"]["pattern"].startswith("^(19[7-9]")


def test_usage_group_by_is_a_comma_list_of_distinct_groups_in_any_order(as_alice):
    assert as_alice.get("/api/v1/usage/?group_by=day,team").status_code == 200
    for value in ("team,team", "team, user", "team,,user", "colour"):
        _refused(as_alice.get(f"/api/v1/usage/?group_by={value}"), "group_by")


def test_a_usage_window_the_schema_allows_but_the_rules_do_not_names_its_rule(as_alice):
    _refused(as_alice.get("/api/v1/usage/?since=2026-02-01&until=2026-01-01"), "since", "incompatible")
    response = as_alice.get("/api/v1/usage/?since=2020-01-01&until=2026-01-01")
    _refused(response, "since", "out_of_range")
    assert response.json()["error"]["limit"] == "366d"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"command": None}, "command"),
        ({"gpu_memory": False, "gpus": None, "compute_pct": 10}, "gpu_memory"),
        ({"preemptible": "yes"}, "preemptible"),
        ({"requeue_on_node_loss": 1}, "requeue_on_node_loss"),
        ({"topology": "NVLink"}, "topology"),
        ({"topology": " none"}, "topology"),
        ({"gpus": " 1"}, "gpus"),
        ({"gpus": "+1"}, "gpus"),
        ({"gpus": "1_0"}, "gpus"),
        ({"gpus": "٤"}, "gpus"),
        ({"memory": "٤GiB"}, "memory"),
        ({"max_runtime": "1 0h"}, "max_runtime"),
        ({"min_compute_capability": "1e1"}, "min_compute_capability"),
        ({"min_compute_capability": True}, "min_compute_capability"),
        ({"env": {"A\n": "x"}}, "env"),
        ({"__yaml__": "name: x"}, "__yaml__"),
    ],
)
def test_a_spec_value_outside_the_schema_is_refused_naming_the_field(as_alice, extra, field):
    response = as_alice.post("/api/v1/jobs/", {**SPEC, **extra}, format="json")
    _refused(response, field)
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("extra", "field", "code"),
    [
        ({"gpus": "65"}, "gpus", "out_of_range"),
        ({"memory": "100TiB"}, "memory", "out_of_range"),
        ({"cpu": 0.0015}, "cpu", "out_of_range"),
        ({"max_runtime": "0s"}, "max_runtime", "out_of_range"),
        ({"gpu_memory": "1GiB"}, "gpus", "incompatible"),
        ({"memory": "1GiB", "memory_mib": 1024}, "memory", "incompatible"),
        ({"gpus": 0}, "gpus", "incompatible"),
        ({"gpu_models": ["H100-80GB"]}, "gpu_models", "cannot_run"),
        ({"priority": "urgent"}, "priority", "unknown_priority"),
    ],
)
def test_a_spec_the_schema_allows_but_a_rule_refuses_says_which_rule(as_alice, extra, field, code):
    response = as_alice.post("/api/v1/jobs/", {**SPEC, **extra}, format="json")
    _refused(response, field, code)
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "extra",
    [
        {"name": 2024, "command": ["python", 3, "run.py"]},
        {"gpus": "1", "nodes": "1", "cpu": 0.5, "memory": " 2 GiB ", "max_runtime": "1h 30m"},
        {"gpus": None, "gpu_memory": "10GiB", "compute_pct": "25", "topology": None, "env": None},
        {"min_compute_capability": "8.0", "gpu_models": "A100-80GB", "preemptible": False, "workdir": ""},
    ],
)
def test_the_written_forms_the_schema_states_are_taken(as_alice, extra):
    response = as_alice.post("/api/v1/jobs/", {**SPEC, **extra}, format="json")
    assert response.status_code == 201, response.content


def test_the_submit_schema_names_every_field_the_spec_reader_takes(as_alice):
    from scheduling.jobs.fields import ALIAS, FIELD

    schema = as_alice.get("/api/schema/?format=json").json()
    body = schema["components"]["schemas"]["JobSubmitRequest"]
    assert set(body["properties"]) == set(FIELD) | set(ALIAS)
    assert body["additionalProperties"] is False and body["required"] == ["name", "command"]


def test_a_token_name_is_counted_once_trimmed_as_the_schema_says(as_alice):
    response = as_alice.post("/api/v1/tokens/", {"name": "\u0085" + "0" * 100}, format="json")
    assert response.status_code == 201 and response.json()["name"] == "0" * 100
    _refused(as_alice.post("/api/v1/tokens/", {"name": " \r "}, format="json"), "name")


@pytest.mark.both_databases
def test_an_id_filter_beyond_the_ids_a_row_can_have_is_a_400_naming_the_parameter_and_the_range(
    as_alice, teams
):
    for value in ("9223372036854775808", "18446744073709551616", "-9223372036854775809", "0", "-1"):
        for path in ("/api/v1/teams/", f"/api/v1/teams/{teams['training'].pk}/quota-changes/"):
            response = as_alice.get(f"{path}?parent={value}")
            _refused(response, "parent")
            assert "from 1 to 9223372036854775807" in response.json()["error"]["message"]
    assert as_alice.get("/api/v1/teams/?parent=9223372036854775807").json()["results"] == []
    schema = as_alice.get("/api/schema/?format=json").json()
    params = {p["name"]: p["schema"] for p in schema["paths"]["/api/v1/teams/"]["get"]["parameters"]}
    assert params["parent"] == {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}


def test_a_log_read_bound_is_refused_whether_or_not_offset_is_given(as_alice, alice, teams):
    from scheduling.jobs.fields import JobSpec
    from scheduling.jobs.submit import job_submit

    job = job_submit(submitter=alice, team=teams["training"], spec=JobSpec(name="j", command="c", gpus=1))
    for query, field in [
        ("limit_bytes=1048577", "limit_bytes"),
        ("limit_bytes=-1", "limit_bytes"),
        ("limit_bytes=0", "limit_bytes"),
        ("offset=0&tail=-1", "tail"),
        ("tail=x&offset=0", "tail"),
    ]:
        _refused(as_alice.get(f"/api/v1/jobs/{job.pk}/logs/?{query}"), field)


def test_a_size_with_spaces_is_taken_by_the_server_exactly_when_the_schema_says(as_alice):
    import re

    schema = as_alice.get("/api/schema/?format=json").json()["components"]["schemas"]["JobSubmitRequest"]
    gpu_memory = schema["properties"]["gpu_memory"]
    assert "10 GiB" in gpu_memory["description"]
    for written, taken in [("10 GiB", True), (" 10GiB ", True), ("10\tGiB", False), ("10 G iB", False)]:
        assert bool(re.search(gpu_memory["anyOf"][0]["pattern"], written)) is taken
        spec = {**SPEC, "gpus": None, "gpu_memory": written, "compute_pct": 25}
        response = as_alice.post("/api/v1/jobs/", spec, format="json")
        if taken:
            assert response.status_code == 201 and response.json()["request"]["gpu_memory_mib"] == 10240
        else:
            _refused(response, "gpu_memory")
