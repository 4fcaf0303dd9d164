"""Which priority classes a team may use: classes open to all teams, grants (with per-class limits) edited on the
team's admin page, each change audited like a quota change."""

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from quotas.models import QuotaChange, TeamPriorityClass
from quotas.services import priority_class_grant_delete, priority_class_grant_save

pytestmark = pytest.mark.django_db


def test_preemptible_default_classes_are_open_to_all_teams_and_critical_is_not(priority_classes):
    open_to_all = {name for name, pc in priority_classes.items() if pc.open_to_all_teams}
    assert open_to_all == {"training", "inference"}


def test_a_grant_and_each_change_of_its_limit_are_audited(teams, priority_classes, admin_user):
    grant = TeamPriorityClass(team=teams["training"], priority_class=priority_classes["critical"])
    created = priority_class_grant_save(grant=grant, actor=admin_user, source="api")
    assert created.changes == {"priority_class": {"old": None, "new": "critical (1000)"}}
    assert (created.team, created.actor, created.source) == (teams["training"], admin_user, "api")
    assert created.note == "priority class critical granted"
    grant.limit_gpus = Decimal("2.5")
    assert priority_class_grant_save(grant=grant, actor=admin_user).changes == {
        "limit_gpus": {"old": None, "new": "2.5"}
    }
    assert priority_class_grant_save(grant=grant, actor=admin_user) is None, (
        "an unchanged save records nothing"
    )
    removed = priority_class_grant_delete(grant=grant, actor=admin_user)
    assert removed.changes == {
        "priority_class": {"old": "critical (1000)", "new": None},
        "limit_gpus": {"old": "2.5", "new": None},
    }
    assert not TeamPriorityClass.objects.exists()
    assert QuotaChange.objects.filter(team=teams["training"], actor=admin_user).count() == 3


def test_a_negative_per_class_limit_is_refused_naming_the_field(teams, priority_classes):
    grant = TeamPriorityClass(
        team=teams["training"], priority_class=priority_classes["critical"], limit_gpus=Decimal(-1)
    )
    with pytest.raises(ValidationError) as caught:
        priority_class_grant_save(grant=grant, actor=None)
    assert "limit_gpus" in caught.value.message_dict
    with pytest.raises(IntegrityError, match="grant_limit_gpus_nonnegative"), transaction.atomic():
        grant.save()


def test_a_team_is_granted_a_class_once(teams, priority_classes, grant):
    grant(teams["training"], "critical")
    with pytest.raises(IntegrityError, match="grant_unique_team_class"), transaction.atomic():
        TeamPriorityClass.objects.create(team=teams["training"], priority_class=priority_classes["critical"])


def _team_page_data(page, team) -> dict:
    """The team's admin form as the page shows it, every inline included, ready to post back."""
    data = {"slug": team.slug, "display_name": team.display_name, "parent": team.parent_id or ""}
    for formset in page.context["inline_admin_formsets"]:
        fs = formset.formset
        data[f"{fs.prefix}-TOTAL_FORMS"] = len(fs.forms)
        data[f"{fs.prefix}-INITIAL_FORMS"] = fs.initial_form_count()
        for i, f in enumerate(fs.forms):
            for name, field in f.fields.items():
                # As the page renders it (the form's own units: GiB for memory).
                value = field.prepare_value(f.initial.get(name, field.initial))
                if hasattr(value, "pk"):
                    value = value.pk
                data[f"{fs.prefix}-{i}-{name}"] = "" if value is None else value
    return data


def _grant_prefix(page) -> str:
    return next(
        fs.formset.prefix
        for fs in page.context["inline_admin_formsets"]
        if fs.formset.model is TeamPriorityClass
    )


def test_an_admin_grants_a_class_with_a_limit_on_the_team_page_and_it_is_audited(
    client, admin_user, teams, priority_classes
):
    team = teams["inference"]
    client.force_login(admin_user)
    url = f"/admin/quotas/team/{team.pk}/change/"
    page = client.get(url)
    data, prefix = _team_page_data(page, team), _grant_prefix(page)
    data[f"{prefix}-TOTAL_FORMS"] = 1
    data[f"{prefix}-0-priority_class"] = priority_classes["critical"].pk
    data[f"{prefix}-0-limit_gpus"] = "1"
    response = client.post(url, data)
    assert response.status_code == 302, response.context["errors"] if response.context else response
    grant = TeamPriorityClass.objects.get(team=team)
    assert (grant.priority_class.name, grant.limit_gpus) == ("critical", Decimal(1))
    change = QuotaChange.objects.get(team=team, actor=admin_user)
    assert change.source == "admin"
    assert change.changes == {
        "priority_class": {"old": None, "new": "critical (1000)"},
        "limit_gpus": {"old": None, "new": "1"},
    }
    assert "priority class critical granted" in client.get(url).content.decode()


def test_an_admin_removes_a_grant_on_the_team_page_and_it_is_audited(client, admin_user, teams, grant):
    team = teams["inference"]
    grant(team, "critical", limit_gpus=Decimal(1))
    client.force_login(admin_user)
    url = f"/admin/quotas/team/{team.pk}/change/"
    page = client.get(url)
    data, prefix = _team_page_data(page, team), _grant_prefix(page)
    data[f"{prefix}-0-DELETE"] = "on"
    response = client.post(url, data)
    assert response.status_code == 302, response.context["errors"] if response.context else response
    assert not TeamPriorityClass.objects.filter(team=team).exists()
    change = QuotaChange.objects.get(team=team, actor=admin_user)
    assert change.note == "priority class critical grant removed"
    assert change.changes["limit_gpus"] == {"old": "1", "new": None}
