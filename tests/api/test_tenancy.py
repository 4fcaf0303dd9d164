"""Tenancy on every route: another team's object is 404, anonymous is 401, a non-admin is 403, lists hold no
foreign rows, and other teams' work shows only anonymously."""

import pytest
from rest_framework.test import APIClient

from scheduling.choices import ActorKind, JobState
from scheduling.inventory.models import Gpu
from scheduling.jobs.ledger import slice_allocate
from scheduling.jobs.transitions import job_transition

pytestmark = pytest.mark.django_db

ANONYMOUS_ROUTES = [
    ("get", "/api/v1/jobs/"),
    ("post", "/api/v1/jobs/"),
    ("get", "/api/v1/jobs/1/"),
    ("post", "/api/v1/jobs/1/cancel/"),
    ("get", "/api/v1/jobs/1/events/"),
    ("get", "/api/v1/jobs/1/logs/"),
    ("get", "/api/v1/queue/"),
    ("get", "/api/v1/teams/"),
    ("get", "/api/v1/teams/1/"),
    ("get", "/api/v1/priority-classes/"),
    ("get", "/api/v1/cluster/"),
    ("get", "/api/v1/cluster/nodes/"),
    ("get", "/api/v1/cluster/nodes/a100-01/"),
    ("get", "/api/v1/usage/"),
    ("get", "/api/v1/tokens/"),
    ("post", "/api/v1/tokens/"),
    ("delete", "/api/v1/tokens/1/"),
    ("get", "/api/v1/whoami/"),
]


@pytest.mark.parametrize(("method", "path"), ANONYMOUS_ROUTES)
def test_anonymous_requests_are_refused_with_401(anon, node, method, path):
    response = getattr(anon, method)(path)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    assert response.headers["WWW-Authenticate"] == "Bearer"


def test_a_revoked_token_is_refused(alice):
    from quotas.tokens import api_token_create, api_token_revoke

    row, token = api_token_create(user=alice, name="old")
    api_token_revoke(token=row)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.get("/api/v1/whoami/").status_code == 401


@pytest.fixture
def bobs_job(bob, teams, submit):
    return submit(bob, teams["inference"], name="bob-secret-model", env={"HF_TOKEN": "hf_x"})


@pytest.mark.parametrize(
    ("method", "suffix"), [("get", ""), ("post", "cancel/"), ("get", "events/"), ("get", "logs/")]
)
def test_another_teams_job_is_not_found(as_alice, bobs_job, method, suffix):
    response = getattr(as_alice, method)(f"/api/v1/jobs/{bobs_job.pk}/{suffix}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    bobs_job.refresh_from_db()
    assert bobs_job.state == JobState.PENDING


def test_the_job_list_holds_no_foreign_rows(as_alice, alice, teams, bobs_job, submit):
    submit(alice, teams["training"], name="mine")
    rows = as_alice.get("/api/v1/jobs/").json()["results"]
    assert [r["name"] for r in rows] == ["mine"]
    assert as_alice.get("/api/v1/jobs/?team=ai-lab/inference").json()["results"] == []


def test_a_member_may_not_cancel_a_teammates_job(as_dave, alice, teams, submit):
    job = submit(alice, teams["training"])
    response = as_dave.post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    job.refresh_from_db()
    assert job.state == JobState.PENDING


def test_a_member_sees_a_teammates_job(as_dave, alice, teams, submit):
    job = submit(alice, teams["training"])
    assert as_dave.get(f"/api/v1/jobs/{job.pk}/").json()["can_cancel"] is False


def test_a_team_admin_cancels_any_job_of_the_team(as_carol, alice, teams, submit):
    job = submit(alice, teams["training"])
    assert as_carol.post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 200


def test_a_team_admin_of_one_team_cannot_touch_another_teams_job(as_carol, bobs_job):
    assert as_carol.post(f"/api/v1/jobs/{bobs_job.pk}/cancel/").status_code == 404


def test_staff_see_and_cancel_everything(as_admin, bobs_job):
    assert [r["id"] for r in as_admin.get("/api/v1/jobs/").json()["results"]] == [bobs_job.pk]
    assert as_admin.post(f"/api/v1/jobs/{bobs_job.pk}/cancel/").status_code == 200


def test_teams_list_only_mine_and_another_team_is_not_found(as_alice, teams):
    rows = as_alice.get("/api/v1/teams/").json()["results"]
    assert [r["slug"] for r in rows] == ["ai-lab/training"]
    assert rows[0]["role"] == "member"
    assert as_alice.get(f"/api/v1/teams/{teams['inference'].pk}/").status_code == 404


def test_another_users_token_is_not_found(as_alice, as_bob):
    created = as_bob.post("/api/v1/tokens/", {"name": "bob laptop"}, format="json").json()
    assert as_alice.delete(f"/api/v1/tokens/{created['id']}/").status_code == 404
    names = [t["name"] for t in as_alice.get("/api/v1/tokens/").json()["results"]]
    assert "bob laptop" not in names


def test_the_queue_shows_other_teams_entries_anonymously(as_alice, alice, teams, bobs_job, submit):
    mine = submit(alice, teams["training"], name="mine")
    entries = as_alice.get("/api/v1/queue/").json()["results"]
    assert [e["position"] for e in entries] == [1, 2]
    foreign = next(e for e in entries if not e["mine"])
    assert (foreign["id"], foreign["name"], foreign["user"], foreign["pending_reason"]) == (
        None,
        None,
        None,
        None,
    )
    assert foreign["team"] == "ai-lab/inference"
    assert "bob-secret-model" not in str(entries) and "hf_x" not in str(entries) and "bob" not in str(foreign)
    own = next(e for e in entries if e["mine"])
    assert (own["id"], own["name"], own["user"]) == (mine.pk, "mine", "alice")


def test_the_cluster_shows_other_teams_slices_anonymously(as_alice, node, bobs_job):
    gpu = Gpu.objects.get(node=node, index=0)
    job_transition(job=bobs_job, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER)
    slice_allocate(job=bobs_job, gpu=gpu, memory_mib=gpu.memory_mib, compute_pct=100)
    body = as_alice.get("/api/v1/cluster/nodes/a100-01/").json()
    held = body["gpus"][0]["slices"]
    assert held == [
        {
            "job_id": None,
            "job_name": None,
            "user": None,
            "team": None,
            "mine": False,
            "memory_mib": 81920,
            "compute_pct": 100,
            "releasing": False,
        }
    ]
    assert body["gpus"][0]["nvlink_peers"] == [1, 2, 3, 4, 5, 6, 7]
    summary = as_alice.get("/api/v1/cluster/").json()
    inference = next(t for t in summary["teams"] if t["team"] == "ai-lab/inference")
    assert inference["allocated_gpus"] == 1.0 and inference["running_jobs"] == 1
    assert "bob" not in str(summary)


def test_usage_holds_no_foreign_rows(as_alice, bobs_job):
    assert as_alice.get("/api/v1/usage/").json() == []


def test_session_authentication_works_for_the_browser_and_needs_csrf_for_writes(alice, node):
    client = APIClient(enforce_csrf_checks=True)
    assert client.login(username="alice", password="alice-pw")
    assert client.get("/api/v1/whoami/").json()["auth"] == "session"
    response = client.post("/api/v1/tokens/", {"name": "x"}, format="json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["error"]["message"]


def test_an_unknown_api_path_answers_in_the_error_format(as_alice):
    response = as_alice.get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
