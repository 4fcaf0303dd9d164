"""Teams with quota, usage, borrowing and fair share; priority classes; tokens; whoami; usage in GPU-hours and CSV;
the schema and the offline docs page."""

import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from quotas.models import ApiToken
from scheduling.choices import ActorKind, JobState
from scheduling.inventory.models import Gpu
from scheduling.jobs.ledger import slice_allocate
from scheduling.jobs.models import Job, JobEvent
from scheduling.jobs.transitions import job_transition

pytestmark = pytest.mark.django_db


def _run(job, gpu, *, memory_mib, compute_pct, borrowed=False):
    job_transition(job=job, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER)
    slice_allocate(job=job, gpu=gpu, memory_mib=memory_mib, compute_pct=compute_pct)
    job_transition(job=job, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT)
    if borrowed:
        Job.objects.filter(pk=job.pk).update(borrowed=True)


def test_my_team_shows_quota_usage_borrowed_and_fair_share(as_alice, alice, teams, node, submit):
    job = submit(alice, teams["training"], gpu_memory_mib=20480, compute_pct=25, gpus=0)
    _run(job, Gpu.objects.get(node=node, index=6), memory_mib=20480, compute_pct=25, borrowed=True)
    team = as_alice.get(f"/api/v1/teams/{teams['training'].pk}/").json()
    assert team["quotas"][0]["guaranteed_gpus"] == 4.0
    assert team["quotas"][0]["default_priority_class"] == "training"
    assert team["usage"] == {"gpus": 0.25, "gpu_memory_mib": 20480, "running_jobs": 1, "pending_jobs": 0}
    # A quarter GPU is well within a 4-GPU guarantee: nothing is borrowed, whatever the job's label says.
    assert team["borrowed"] == {"gpus": 0.0, "gpu_memory_mib": 0}
    # 8 GPUs; guarantees 4 + 1; the 3 left split by equal weights.
    assert team["fair_share"]["gpus"] == 5.5
    # What ranks its jobs: 20 GiB of a 320 GiB guarantee, a quarter GPU of 4; no past usage yet.
    assert team["fair_share"]["held_share"] == 0.0625
    assert team["fair_share"]["usage_share"] == 0.0
    assert team["fair_share"]["queue_share"] == 0.0625


def test_borrowed_is_what_the_team_holds_beyond_its_guarantee_in_the_team_and_the_cluster(
    as_alice, alice, teams, node, submit
):
    job = submit(alice, teams["training"], gpus=6)
    job_transition(job=job, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER)
    for gpu in Gpu.objects.filter(node=node, index__lt=6):
        slice_allocate(job=job, gpu=gpu, memory_mib=gpu.memory_mib, compute_pct=100)
    assert not Job.objects.get(pk=job.pk).borrowed  # the label is the engine's to keep; it is not counted
    # Guaranteed 4 GPUs and 320 GiB, holding 6 GPUs and 480 GiB: 2 GPUs and 160 GiB are borrowed.
    team = as_alice.get(f"/api/v1/teams/{teams['training'].pk}/").json()
    assert team["usage"]["gpus"] == 6.0
    assert team["borrowed"] == {"gpus": 2.0, "gpu_memory_mib": 160 * 1024}
    cluster = as_alice.get("/api/v1/cluster/").json()
    row = next(t for t in cluster["teams"] if t["team"] == "ai-lab/training")
    assert (row["allocated_gpus"], row["borrowed_gpus"]) == (6.0, 2.0)


def test_a_teams_queue_share_counts_decayed_past_usage_over_its_weight(as_alice, alice, teams, node, submit):
    from decimal import Decimal

    from quotas.models import Quota

    half_life_s = 7 * 24 * 3600
    job = submit(alice, teams["training"], gpus=4)
    _run(job, Gpu.objects.get(node=node, index=0), memory_mib=81920, compute_pct=100)
    job_transition(job=job, to_state=JobState.SUCCEEDED, actor_kind=ActorKind.AGENT)
    # Four GPUs for one half-life, ending one half-life ago: 4000 milli x h / ln 2 x (1/2 - 1/4).
    now = timezone.now()
    Job.objects.filter(pk=job.pk).update(
        started_at=now - timedelta(seconds=2 * half_life_s), finished_at=now - timedelta(seconds=half_life_s)
    )
    Quota.objects.filter(team=teams["training"], gpu_model=None).update(fair_share_weight=Decimal(2))
    share = as_alice.get(f"/api/v1/teams/{teams['training'].pk}/").json()["fair_share"]
    # Running at its 4-GPU guarantee forever would accumulate 4000 x h / ln 2: a quarter of that.
    assert share["held_share"] == 0.0
    assert share["usage_share"] == pytest.approx(0.25, abs=1e-3)
    assert share["queue_share"] == pytest.approx(0.125, abs=1e-3)  # over its weight of 2


def test_priority_classes_are_listed_highest_first(as_alice):
    classes = as_alice.get("/api/v1/priority-classes/").json()["results"]
    assert [(p["name"], p["open_to_all_teams"]) for p in classes] == [
        ("critical", False),
        ("training", True),
        ("inference", True),
    ]


def test_a_team_shows_the_classes_it_may_use_its_default_and_per_class_limits(as_alice, teams, grant):
    from decimal import Decimal

    from quotas.models import Team

    team_url = f"/api/v1/teams/{teams['training'].pk}/"
    team = as_alice.get(team_url).json()
    assert [c["name"] for c in team["priority_classes"]] == ["training", "inference"]
    assert team["default_priority_class"] == "training"
    grant(Team.objects.get(slug="ai-lab"), "critical", limit_gpus=Decimal(2))  # the organisation's grant
    grant(teams["training"], "inference", limit_gpus=Decimal("0.5"))
    assert as_alice.get(team_url).json()["priority_classes"] == [
        {"name": "critical", "value": 1000, "preemptible": False, "limit_gpus": 2.0},
        {"name": "training", "value": 100, "preemptible": True, "limit_gpus": None},
        {"name": "inference", "value": 50, "preemptible": True, "limit_gpus": 0.5},
    ]


def test_a_token_is_shown_once_stored_hashed_and_revocable(as_alice):
    created = as_alice.post("/api/v1/tokens/", {"name": "laptop"}, format="json")
    assert created.status_code == 201
    token = created.json()["token"]
    row = ApiToken.objects.get(pk=created.json()["id"])
    assert token.startswith("tsk_") and token not in (row.token_hash, row.prefix)
    listed = as_alice.get("/api/v1/tokens/").json()["results"]
    assert all("token" not in t for t in listed)
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.get("/api/v1/whoami/").json()["username"] == "alice"
    assert as_alice.delete(f"/api/v1/tokens/{row.pk}/").json()["revoked_at"] is not None
    assert client.get("/api/v1/whoami/").status_code == 401


def test_whoami_names_the_user_their_teams_and_the_auth(as_carol):
    body = as_carol.get("/api/v1/whoami/").json()
    assert body["username"] == "carol"
    assert body["auth"] == "token"
    assert body["teams"] == [
        {"team": "ai-lab/training", "team_id": body["teams"][0]["team_id"], "role": "team_admin"}
    ]


def _backdate(job, hours_ago_start, hours_ago_end=None):
    now = timezone.now()
    for event in JobEvent.objects.filter(job=job):
        if event.to_state == JobState.PLACED:
            JobEvent.objects.filter(pk=event.pk).update(at=now - timedelta(hours=hours_ago_start))
        elif event.to_state in (JobState.SUCCEEDED, JobState.CANCELLED) and hours_ago_end is not None:
            JobEvent.objects.filter(pk=event.pk).update(at=now - timedelta(hours=hours_ago_end))


def test_usage_counts_a_quarter_slice_as_a_quarter_gpu_and_survives_slice_deletion(
    as_alice, alice, teams, node, submit
):
    job = submit(alice, teams["training"], gpus=0, gpu_memory_mib=20480, compute_pct=25)
    _run(job, Gpu.objects.get(node=node, index=6), memory_mib=20480, compute_pct=25)
    job_transition(job=job, to_state=JobState.SUCCEEDED, actor_kind=ActorKind.AGENT)
    assert not job.slices.exists()
    _backdate(job, hours_ago_start=6, hours_ago_end=2)  # 4 h at a quarter card = 1 GPU-hour
    rows = as_alice.get("/api/v1/usage/?group_by=team,user").json()
    assert rows == [
        {
            "team": "ai-lab/training",
            "user": "alice",
            "gpu_hours": 1.0,
            "gpu_memory_gib_hours": 80.0,
            "jobs": 1,
        }
    ]


def test_usage_splits_by_day_and_exports_csv(as_admin, alice, teams, node, submit):
    job = submit(alice, teams["training"], gpus=2)
    gpus = list(Gpu.objects.filter(node=node, index__in=[0, 1]))
    job_transition(job=job, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER)
    for gpu in gpus:
        slice_allocate(job=job, gpu=gpu, memory_mib=gpu.memory_mib, compute_pct=100)
    job_transition(job=job, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT)
    job_transition(job=job, to_state=JobState.SUCCEEDED, actor_kind=ActorKind.AGENT)
    _backdate(job, hours_ago_start=30, hours_ago_end=0)
    rows = as_admin.get("/api/v1/usage/?group_by=day").json()
    assert len(rows) >= 2
    assert round(sum(r["gpu_hours"] for r in rows), 2) == 60.0
    csv = as_admin.get("/api/v1/usage/?group_by=team,day&format=csv")
    assert csv["Content-Type"].startswith("text/csv")
    lines = csv.content.decode().strip().splitlines()
    assert lines[0] == "team,day,gpu_hours,gpu_memory_gib_hours,jobs"
    assert len(lines) == len(rows) + 1


def test_an_empty_usage_csv_still_has_its_header_and_content_type(as_alice):
    csv = as_alice.get(
        "/api/v1/usage/?group_by=day,team&team=nobody&format=csv&until=2026-01-01T00:00:00-22:30"
    )
    assert csv.status_code == 200
    assert csv["Content-Type"].startswith("text/csv")
    assert csv.content.decode().strip() == "team,day,gpu_hours,gpu_memory_gib_hours,jobs"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("group_by=colour", "group_by"),
        ("since=yesterday", "since"),
        ("since=2020-01-01&until=2026-01-01", "since"),
        ("until=0001-01-01", "until"),
        ("since=2026-01-01&until=0001-01-01", "until"),
        ("since=0001-01-01T00:00:00%2B05:00", "since"),
        ("until=9999-12-31T23:00:00-05:00", "until"),
        ("since=1969-12-31", "since"),
        ("since=2026-02-30T00:00:00", "since"),
    ],
)
def test_usage_refuses_bad_parameters_naming_them(as_alice, query, field):
    response = as_alice.get(f"/api/v1/usage/?{query}")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field


def test_the_schema_and_the_interactive_docs_are_served_without_the_network(as_alice, client):
    schema = as_alice.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    assert "/api/v1/jobs/" in schema.json()["paths"]
    page = as_alice.get("/api/docs/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "cdn." not in html and "unpkg" not in html
    import re

    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', html)
    assert any("swagger-ui-bundle" in a for a in assets)
    for asset in assets:
        assert client.get(asset).status_code == 200, asset


def test_every_reference_of_the_schema_names_a_component_it_has_however_often_it_is_built(as_alice):
    for _ in range(2):  # a server builds it on each request: the second once named enums it no longer emitted
        schema = as_alice.get("/api/schema/?format=json").json()
        named = set(re.findall(r"#/components/schemas/(\w+)", json.dumps(schema)))
        assert named and named <= set(schema["components"]["schemas"]), named - set(
            schema["components"]["schemas"]
        )
    assert "TopologyEnum" in schema["components"]["schemas"], "the job spec's topology is an enum component"


def test_usage_reads_what_a_placement_held_from_its_event(as_alice, alice, teams, node, submit):
    job = submit(alice, teams["training"], gpus=0, gpu_memory_mib=40960, compute_pct=10)
    job_transition(
        job=job,
        to_state=JobState.PLACED,
        actor_kind=ActorKind.SCHEDULER,
        code="placed",
        data={"gpus": [["a100-01", 6, 40960, 100]]},
    )
    job_transition(job=job, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT)
    job_transition(job=job, to_state=JobState.SUCCEEDED, actor_kind=ActorKind.AGENT)
    _backdate(job, hours_ago_start=3, hours_ago_end=1)  # 2 h at half a card (memory dominates)
    rows = as_alice.get("/api/v1/usage/?group_by=user").json()
    assert rows == [{"user": "alice", "gpu_hours": 1.0, "gpu_memory_gib_hours": 80.0, "jobs": 1}]
