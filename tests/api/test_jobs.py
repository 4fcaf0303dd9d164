"""/api/v1/jobs: submit from a spec, validation with one error format, idempotency, throttling, cancel, events, logs."""

import pytest

from scheduling.choices import JobState
from scheduling.jobs.models import Job
from scheduling.jobs.transitions import job_transition

pytestmark = pytest.mark.django_db

SLICE = {
    "name": "notebook",
    "team": "ai-lab/training",
    "command": "jupyter lab",
    "gpu_memory": "10GiB",
    "compute_pct": 25,
}


def test_a_member_submits_a_slice_job_from_a_json_spec(as_alice):
    response = as_alice.post("/api/v1/jobs/", SLICE, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "pending"
    assert body["request"]["gpu_memory_mib"] == 10240
    assert body["pending_reason_code"] == "queued"
    job = Job.objects.get(pk=body["id"])
    assert (job.submitter.username, job.team.slug, job.compute_pct) == ("alice", "ai-lab/training", 25)


def test_a_member_submits_a_yaml_spec_and_the_team_defaults_to_their_only_team(as_alice):
    text = "name: train\ncommand: python train.py\ngpus: 2\ntopology: nvlink\nmax_runtime: 2h\n"
    response = as_alice.post("/api/v1/jobs/", text, content_type="application/yaml")
    assert response.status_code == 201, response.json()
    assert response.json()["team"] == "ai-lab/training"
    assert response.json()["request"]["max_runtime_s"] == 7200


def test_a_job_declares_how_often_it_checkpoints_and_the_api_shows_it(as_alice):
    text = "name: train\ncommand: python train.py\ngpus: 1\ncheckpoint_interval: 30m\n"
    response = as_alice.post("/api/v1/jobs/", text, content_type="application/yaml")
    assert response.status_code == 201, response.json()
    assert response.json()["request"]["checkpoint_interval_s"] == 1800
    detail = as_alice.get(f"/api/v1/jobs/{response.json()['id']}/").json()
    assert detail["request"]["checkpoint_interval_s"] == 1800
    assert detail["spec"]["checkpoint_interval"] == "30m"  # "copy & edit" submits it again with it
    body = {"name": "eval", "command": "run", "gpus": 1, "checkpoint_interval_s": 600}
    assert (
        as_alice.post("/api/v1/jobs/", body, format="json").json()["request"]["checkpoint_interval_s"] == 600
    )
    body = {"name": "eval", "command": "run", "gpus": 1}
    assert (
        as_alice.post("/api/v1/jobs/", body, format="json").json()["request"]["checkpoint_interval_s"] is None
    )


@pytest.mark.parametrize(
    ("spec", "field", "limit", "words"),
    [
        ({"checkpoint_interval_s": 30}, "checkpoint_interval_s", 60, "between 60 s (1m) and 604800 s (7d)"),
        ({"checkpoint_interval": "8d"}, "checkpoint_interval", 604800, "between 60 s (1m) and 604800 s (7d)"),
        ({"checkpoint_interval_s": 90.5}, "checkpoint_interval_s", None, "a whole number of seconds"),
        ({"checkpoint_interval": "1.5s"}, "checkpoint_interval", None, "a whole number of seconds"),
        ({"checkpoint_interval_s": "often"}, "checkpoint_interval_s", None, "a duration such as"),
    ],
)
def test_a_checkpoint_interval_out_of_range_or_not_whole_is_refused_with_400_naming_the_limit(
    as_alice, spec, field, limit, words
):
    body = {"name": "x", "command": "run", "gpus": 1, **spec}
    response = as_alice.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["field"], error.get("limit")) == (field, limit)
    assert words in error["message"] and field in error["message"]
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name: a\ncommand: b\ngpus: 1\nmax_runtime: .nan\n", "max_runtime"),
        ('{"name": "a", "command": "b", "gpus": 1, "max_runtime": NaN}', "spec"),
    ],
)
def test_a_yaml_spec_with_a_non_finite_number_is_refused_naming_the_field(as_alice, text, field):
    response = as_alice.post("/api/v1/jobs/", text, content_type="application/yaml")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field


@pytest.mark.parametrize(
    ("spec", "field", "limit", "words"),
    [
        ({"gpu_memory": "96GiB"}, "gpu_memory", "81920MiB", "largest"),
        ({"gpus": 16, "topology": "nvlink"}, "gpus", None, "the most on any node is 8"),
        ({"gpus": 1, "gpu_models": ["V100"]}, "gpu_models", None, "Unknown GPU model V100"),
        ({"compute_pct": 150}, "compute_pct", 100, "at most 100"),
        ({"gpus": 10_000}, "gpus", 64, "at most 64"),
        ({"gpus": 1, "team": "ai-lab/inference"}, "team", None, "not a member"),
        ({"gpus": 1, "team": "no-such-team"}, "team", None, "not a member"),
    ],
)
def test_a_spec_that_can_never_run_is_refused_with_the_field_and_the_reason(
    as_alice, spec, field, limit, words
):
    body = {"name": "x", "team": "ai-lab/training", "command": "run", **spec}
    response = as_alice.post("/api/v1/jobs/", body, format="json")
    assert response.status_code in (400, 403)
    error = response.json()["error"]
    assert error["field"] == field
    assert words in error["message"]
    assert error.get("limit") == limit
    assert field in error["fields"]
    assert not Job.objects.exists()


def test_a_class_the_team_may_not_use_and_a_job_beyond_its_limit_are_refused_with_400(as_bob):
    body = {"name": "x", "team": "ai-lab/inference", "command": "serve", "gpus": 1, "priority": "critical"}
    error = as_bob.post("/api/v1/jobs/", body, format="json").json()["error"]
    assert (error["field"], error["code"]) == ("priority", "priority_not_granted")
    assert error["message"] == (
        "team ai-lab/inference may not use priority class critical; it may use: training, inference; "
        "default inference."
    )
    response = as_bob.post("/api/v1/jobs/", {**body, "priority": "inference", "gpus": 3}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["field"], error["limit"]) == ("gpus", 2)
    assert error["message"] == (
        "gpus: this job needs 3 GPUs but team ai-lab/inference may hold at most 2 GPUs (its limit)."
    )
    assert not Job.objects.exists()


def test_a_spec_over_the_guarantee_but_within_the_limit_is_accepted_and_waits(as_alice):
    # alice's team is guaranteed 4 GPUs with a limit of 8 (and 640 GiB); 8 GPUs exist on the node.
    response = as_alice.post(
        "/api/v1/jobs/",
        {"name": "big", "command": "train", "gpus": 6, "team": "ai-lab/training"},
        format="json",
    )
    assert response.status_code == 201
    assert response.json()["state"] == "pending"


def test_a_replayed_idempotency_key_returns_the_first_response_and_creates_one_job(as_alice):
    first = as_alice.post("/api/v1/jobs/", SLICE, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    again = as_alice.post("/api/v1/jobs/", SLICE, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert Job.objects.count() == 1


def test_an_idempotency_key_reused_with_another_body_is_a_conflict(as_alice):
    as_alice.post("/api/v1/jobs/", SLICE, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    response = as_alice.post(
        "/api/v1/jobs/", {**SLICE, "name": "other"}, format="json", HTTP_IDEMPOTENCY_KEY="k-2"
    )
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_conflict"
    assert Job.objects.count() == 1


def test_idempotency_keys_are_per_user(as_alice, as_carol):
    as_alice.post("/api/v1/jobs/", SLICE, format="json", HTTP_IDEMPOTENCY_KEY="shared")
    response = as_carol.post("/api/v1/jobs/", SLICE, format="json", HTTP_IDEMPOTENCY_KEY="shared")
    assert response.status_code == 201
    assert Job.objects.count() == 2


def test_submits_beyond_the_per_user_rate_are_throttled(as_alice, settings, monkeypatch):
    from portal.api_support import SubmitRateThrottle

    monkeypatch.setattr(SubmitRateThrottle, "THROTTLE_RATES", {"submit": "3/min"})
    codes = [as_alice.post("/api/v1/jobs/", SLICE, format="json").status_code for _ in range(4)]
    assert codes == [201, 201, 201, 429]
    assert as_alice.post("/api/v1/jobs/", SLICE, format="json").json()["error"]["code"] == "throttled"
    # Reads are not throttled.
    assert as_alice.get("/api/v1/jobs/").status_code == 200


def test_the_list_filters_by_state_user_and_priority(as_carol, alice, carol, teams, submit, grant):
    grant(teams["training"], "critical")
    a = submit(alice, teams["training"], name="a")
    submit(carol, teams["training"], name="c", priority="critical")
    Job.objects.filter(pk=a.pk).update(state=JobState.CANCELLED)
    names = lambda r: sorted(j["name"] for j in r.json()["results"])  # noqa: E731
    assert names(as_carol.get("/api/v1/jobs/?state=pending")) == ["c"]
    assert names(as_carol.get("/api/v1/jobs/?user=alice")) == ["a"]
    assert names(as_carol.get("/api/v1/jobs/?priority=critical")) == ["c"]
    assert names(as_carol.get("/api/v1/jobs/?team=ai-lab/training")) == ["a", "c"]
    assert names(as_carol.get("/api/v1/jobs/?state=pending&state=cancelled")) == ["a", "c"]
    assert names(as_carol.get("/api/v1/jobs/?mine=true")) == ["c"]


def test_a_page_size_of_a_million_is_refused_by_validation(as_alice):
    response = as_alice.get("/api/v1/jobs/?page_size=1000000")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "page_size"
    assert response.json()["error"]["limit"] == 500


def test_detail_shows_the_pending_reason_queue_position_and_estimate(as_alice, alice, teams, submit):
    job = submit(alice, teams["training"])
    Job.objects.filter(pk=job.pk).update(
        pending_reason_code="quota", pending_reason="Over quota: 4 of 4 GPUs in use.", queue_position=3
    )
    body = as_alice.get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["pending_reason"] == "Over quota: 4 of 4 GPUs in use."
    assert body["queue_position"] == 3
    assert "estimated_start_at" in body
    assert body["spec"]["gpus"] == 1 and body["spec"]["team"] == "ai-lab/training"
    assert body["can_cancel"] is True


def test_a_member_cancels_their_own_job_and_the_event_is_recorded(as_alice, alice, teams, submit):
    job = submit(alice, teams["training"])
    response = as_alice.post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert response.status_code == 200
    assert response.json()["state"] == "cancelled"
    events = as_alice.get(f"/api/v1/jobs/{job.pk}/events/").json()["results"]
    assert [e["code"] for e in events] == ["submitted", "cancelled"]
    assert events[-1]["actor"] == "alice"


def test_cancelling_a_finished_job_is_a_conflict(as_alice, alice, teams, submit):
    job = submit(alice, teams["training"])
    as_alice.post(f"/api/v1/jobs/{job.pk}/cancel/")
    response = as_alice.post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "illegal_transition"


def test_logs_give_the_tail_and_pages_from_an_offset(as_alice, alice, teams, submit, settings, tmp_path):
    from scheduling.agents import joblogs

    settings.TESSERA_LOG_DIR = str(tmp_path)
    job = submit(alice, teams["training"])
    joblogs.log_append(job_id=job.pk, stream="stdout", data="".join(f"step {i}\n" for i in range(200)))
    tail = as_alice.get(f"/api/v1/jobs/{job.pk}/logs/?tail=2").json()
    assert tail["text"] == "step 198\nstep 199\n"
    assert tail["next_offset"] == tail["size"]
    first = as_alice.get(f"/api/v1/jobs/{job.pk}/logs/?offset=0&limit_bytes=14").json()
    assert first["text"] == "step 0\nstep 1\n"
    assert first["next_offset"] == 14
    joblogs.log_append(job_id=job.pk, stream="stdout", data="done\n")
    follow = as_alice.get(f"/api/v1/jobs/{job.pk}/logs/?offset={tail['next_offset']}").json()
    assert follow["text"] == "done\n"
    assert as_alice.get(f"/api/v1/jobs/{job.pk}/logs/?stream=stderr").json()["text"] == ""
    assert as_alice.get(f"/api/v1/jobs/{job.pk}/logs/?stream=secrets").status_code == 400


def test_logs_give_the_exact_bytes_as_base64_and_refuse_an_unknown_encoding(
    as_alice, alice, teams, submit, settings, tmp_path
):
    import base64

    from scheduling.agents import joblogs

    settings.TESSERA_LOG_DIR = str(tmp_path)
    job = submit(alice, teams["training"])
    output = b"\0\0\xff\xfe" + bytes(range(256)) + b"\nend\n"
    joblogs.log_append(job_id=job.pk, stream="stderr", data=output)
    exact = as_alice.get(f"/api/v1/jobs/{job.pk}/logs/?stream=stderr&offset=0&encoding=base64").json()
    assert exact["encoding"] == "base64" and "text" not in exact
    assert base64.b64decode(exact["data"], validate=True) == output
    assert exact["next_offset"] == exact["size"] == len(output)
    tail = as_alice.get(f"/api/v1/jobs/{job.pk}/logs/?stream=stderr&tail=1&encoding=base64").json()
    assert base64.b64decode(tail["data"]) == b"end\n"
    text = as_alice.get(f"/api/v1/jobs/{job.pk}/logs/?stream=stderr&offset=0").json()
    assert text["encoding"] == "text" and "data" not in text and "\ufffd" in text["text"]
    refused = as_alice.get(f"/api/v1/jobs/{job.pk}/logs/?encoding=latin-1")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["field"] == "encoding" and "text, base64" in error["message"]


def test_a_resent_log_chunk_is_stored_once(settings, tmp_path):
    from scheduling.agents import joblogs

    settings.TESSERA_LOG_DIR = str(tmp_path)
    joblogs.log_append(job_id=1, stream="stdout", data="abc", offset=0)
    joblogs.log_append(job_id=1, stream="stdout", data="abc", offset=0)
    joblogs.log_append(job_id=1, stream="stdout", data="cdef", offset=2)
    assert joblogs.log_read(job_id=1, stream="stdout")[0] == b"abcdef"


@pytest.mark.parametrize(
    "query",
    [
        "submitted_after=0450-01-06T13:27:30-08:30",
        "submitted_before=0218-03-13T03:48:05.027474%2B17:59",
        "submitted_after=not-a-date",
    ],
)
def test_odd_dates_in_filters_are_refused_not_crashed_on(as_alice, query):
    response = as_alice.get(f"/api/v1/jobs/?{query}")
    assert response.status_code == 400
    assert response.json()["error"]["field"] in ("submitted_after", "submitted_before")


def test_a_date_filter_with_an_offset_postgresql_does_not_take_is_read_in_utc(as_alice, alice, teams, submit):
    submit(alice, teams["training"])
    response = as_alice.get("/api/v1/jobs/?submitted_after=1970-04-23T01:33:23.5-22:30")
    assert response.status_code == 200, response.content
    assert response.json()["count"] == 1


def test_the_submit_response_is_the_job_as_the_list_and_detail_show_it(as_alice, alice, teams, submit):
    from scheduling.jobs.api.serializers import JobSerializer, job_payload

    response = as_alice.post("/api/v1/jobs/", {**SLICE, "max_runtime": "2h"}, format="json")
    assert response.status_code == 201
    job = Job.objects.get(pk=response.json()["id"])
    assert response.json() == JobSerializer(job).data
    # Every nullable field filled in too, so each one's formatting is compared.
    job_transition(job=job, to_state=JobState.PLACED, actor_kind="system")
    job_transition(job=job, to_state=JobState.RUNNING, actor_kind="system")
    job_transition(job=job, to_state=JobState.SUCCEEDED, actor_kind="system")
    job = Job.objects.get(pk=job.pk)
    job.exit_code, job.queue_position = 0, 3
    assert job_payload(job) == dict(JobSerializer(job).data)
    assert None not in (job.placed_at, job.started_at, job.finished_at)


def test_a_submit_takes_a_bounded_number_of_queries(as_alice, django_assert_max_num_queries):
    # Token, team, membership with the default class, GPU models, the GPU counts for whole-GPU jobs, the job,
    # its event, and the SAVEPOINT and RELEASE a test transaction makes of BEGIN and COMMIT.
    as_alice.post("/api/v1/jobs/", SLICE, format="json")  # warm the token's last-used time
    with django_assert_max_num_queries(8):
        assert as_alice.post("/api/v1/jobs/", {**SLICE, "compute_pct": 10}, format="json").status_code == 201
    with django_assert_max_num_queries(9):
        whole = {"name": "t", "team": "ai-lab/training", "command": "x", "gpus": 2}
        assert as_alice.post("/api/v1/jobs/", whole, format="json").status_code == 201


def test_a_jobs_web_ports_are_shared_with_its_team_by_its_submitter_only(
    as_alice, alice, carol, teams, submit
):
    """POST /api/v1/jobs/<id>/share/ {"shared": true}: the submitter lets the team open the job's web ports."""
    from rest_framework.test import APIClient

    from quotas.tokens import api_token_create

    response = as_alice.post(
        "/api/v1/jobs/", {**SLICE, "ports": "jupyter:8888", "kind": "interactive"}, format="json"
    )
    assert response.status_code == 201, response.json()
    job = response.json()
    assert (job["kind"], job["session_shared"]) == ("interactive", False)
    assert job["ports"] == [
        {"name": "jupyter", "port": 8888, "path": f"/jobs/{job['id']}/open/jupyter/", "state": "waiting"}
    ]
    shared = as_alice.post(f"/api/v1/jobs/{job['id']}/share/", {"shared": True}, format="json")
    assert shared.status_code == 200 and shared.json()["session_shared"] is True
    bad = as_alice.post(f"/api/v1/jobs/{job['id']}/share/", {"shared": "maybe"}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "shared"
    as_carol = APIClient()
    as_carol.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token_create(user=carol, name='t')[1]}")
    refused = as_carol.post(f"/api/v1/jobs/{job['id']}/share/", {"shared": False}, format="json")
    assert refused.status_code == 403 and Job.objects.get(pk=job["id"]).session_shared is True
    plain = as_alice.post("/api/v1/jobs/", SLICE, format="json").json()
    nothing = as_alice.post(f"/api/v1/jobs/{plain['id']}/share/", {"shared": True}, format="json")
    assert nothing.status_code == 409 and nothing.json()["error"]["code"] == "no_ports"
