"""PATCH /api/v1/teams/<id>/quotas/, POST .../quota-preview/, the audit trail and undo: the portal's service, so
the same rules, and errors that name the field and the bound."""

from decimal import Decimal

import pytest

from quotas.models import Quota, QuotaChange

pytestmark = pytest.mark.django_db


def test_staff_patch_a_quota_with_a_reason_and_it_is_audited(as_admin, teams):
    team = teams["inference"]
    response = as_admin.patch(
        f"/api/v1/teams/{team.pk}/quotas/",
        {"guaranteed_gpus": "2", "limit_gpus": "3", "reason": "second serving model"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["quota"]["guaranteed_gpus"] == 2.0 and body["change"]["note"] == "second serving model"
    assert body["change"]["source"] == "api" and body["change"]["actor"] == "admin"
    assert Quota.objects.get(team=team, gpu_model__isnull=True).limit_gpus == 3


def test_a_team_admin_of_a_team_they_cannot_see_gets_404_and_nothing_is_saved(as_carol, teams):
    team = teams["inference"]
    response = as_carol.patch(
        f"/api/v1/teams/{team.pk}/quotas/", {"guaranteed_gpus": "0", "reason": "mine now"}, format="json"
    )
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert Quota.objects.get(team=team, gpu_model__isnull=True).guaranteed_gpus == 1
    assert not QuotaChange.objects.filter(actor__username="carol").exists()


def test_a_team_you_cannot_see_is_404_without_its_name_and_one_you_see_but_may_not_edit_is_403(
    as_admin, as_bob, as_alice, teams
):
    team = teams["training"]
    change = as_admin.patch(
        f"/api/v1/teams/{team.pk}/quotas/", {"fair_share_weight": "2", "reason": "x"}, format="json"
    ).json()["change"]
    changes = QuotaChange.objects.count()
    for method, suffix, body in [
        ("patch", "quotas/", {"guaranteed_gpus": "9", "reason": "ours now"}),
        ("post", "quota-preview/", {"guaranteed_gpus": "9"}),
        ("post", f"quota-changes/{change['id']}/undo/", {"reason": "ours now"}),
    ]:
        url = f"/api/v1/teams/{team.pk}/{suffix}"
        hidden = getattr(as_bob, method)(url, body, format="json")
        assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "not_found", hidden.content
        assert team.slug not in hidden.content.decode()
        seen = getattr(as_alice, method)(url, body, format="json")
        assert seen.status_code == 403 and seen.json()["error"]["code"] == "forbidden", seen.content
        assert team.slug in seen.json()["error"]["message"]
    assert QuotaChange.objects.count() == changes
    assert Quota.objects.get(team=team, gpu_model=None).guaranteed_gpus == 4


def test_a_missing_reason_names_reason_and_a_long_one_its_limit(as_admin, teams):
    url = f"/api/v1/teams/{teams['inference'].pk}/quotas/"
    missing = as_admin.patch(url, {"guaranteed_gpus": "2"}, format="json").json()["error"]
    assert missing["field"] == "reason"
    long = as_admin.patch(url, {"guaranteed_gpus": "2", "reason": "x" * 301}, format="json").json()["error"]
    assert (long["field"], long["limit"], long["code"]) == ("reason", 300, "out_of_range")


def test_a_limit_below_the_guarantee_names_the_field_never_a_500(as_admin, teams):
    response = as_admin.patch(
        f"/api/v1/teams/{teams['inference'].pk}/quotas/", {"limit_gpus": "0.5", "reason": "x"}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "limit_gpus" and "at least the guarantee" in response.text


def test_the_preview_answers_and_saves_nothing(as_carol, teams):
    team = teams["training"]
    response = as_carol.post(
        f"/api/v1/teams/{team.pk}/quota-preview/", {"guaranteed_gpus": "8"}, format="json"
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (
        body["capacity"][0]["scope"] == "all GPU models" and body["capacity"][0]["guaranteed_gpus_after"] == 9
    )
    assert "not raise it" in body["refused"], "a team admin learns before saving that a raise is not theirs"
    assert Quota.objects.get(team=team, gpu_model__isnull=True).guaranteed_gpus == Decimal(4)


def test_undo_through_the_api_and_a_second_undo_conflicts(as_admin, teams):
    team = teams["training"]
    url = f"/api/v1/teams/{team.pk}/quotas/"
    change = as_admin.patch(
        url, {"fair_share_weight": "2", "reason": "priority project"}, format="json"
    ).json()
    undo_url = f"/api/v1/teams/{team.pk}/quota-changes/{change['change']['id']}/undo/"
    undone = as_admin.post(undo_url, {"reason": "project over"}, format="json")
    assert undone.status_code == 200 and undone.json()["undo_of"] == change["change"]["id"]
    assert undone.json()["note"].startswith(f"undo of change #{change['change']['id']}: ")
    again = as_admin.post(undo_url, {"reason": "once more"}, format="json")
    assert again.status_code == 409 and again.json()["error"]["field"] == "fair_share_weight"
    trail = as_admin.get(f"/api/v1/teams/{team.pk}/quota-changes/").json()
    assert [c["note"][:4] for c in trail["results"][:2]] == ["undo", "prio"]
