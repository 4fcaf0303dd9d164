from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from quotas.models import Quota, QuotaChange
from quotas.services import quota_save


@pytest.mark.django_db
def test_the_database_refuses_negative_guaranteed_memory(teams):
    quota = Quota.objects.get(team=teams["training"])
    with (
        pytest.raises(IntegrityError, match="quota_guaranteed_gpu_memory_mib_nonnegative"),
        transaction.atomic(),
    ):
        Quota.objects.filter(pk=quota.pk).update(guaranteed_gpu_memory_mib=-1)


@pytest.mark.django_db
def test_the_database_refuses_a_limit_below_the_guarantee(teams):
    quota = Quota.objects.get(team=teams["training"])
    with (
        pytest.raises(IntegrityError, match="quota_limit_gpu_memory_mib_gte_guaranteed"),
        transaction.atomic(),
    ):
        Quota.objects.filter(pk=quota.pk).update(limit_gpu_memory_mib=quota.guaranteed_gpu_memory_mib - 1)
    with pytest.raises(IntegrityError, match="quota_limit_gpus_gte_guaranteed"), transaction.atomic():
        Quota.objects.filter(pk=quota.pk).update(limit_gpus=Decimal("0.5"))


@pytest.mark.django_db
def test_the_service_names_the_field_of_a_limit_below_the_guarantee(teams):
    quota = Quota.objects.get(team=teams["training"])
    quota.limit_gpu_memory_mib = 1024
    with pytest.raises(ValidationError) as caught:
        quota_save(quota=quota, actor=None)
    assert "limit_gpu_memory_mib" in caught.value.message_dict
    assert "at least the guarantee" in caught.value.message_dict["limit_gpu_memory_mib"][0]
    quota.refresh_from_db()
    assert quota.limit_gpu_memory_mib == 640 * 1024, "nothing stored is lost by a refused change"


@pytest.mark.django_db
def test_the_service_records_each_changed_field_with_old_and_new_values(teams, admin_user):
    quota = Quota.objects.get(team=teams["inference"])
    quota.guaranteed_gpu_memory_mib = 80 * 1024
    change = quota_save(quota=quota, actor=admin_user, source="api", note="more memory for serving")
    assert change.changes == {"guaranteed_gpu_memory_mib": {"old": 64 * 1024, "new": 80 * 1024}}
    assert change.actor == admin_user
    assert quota_save(quota=quota, actor=admin_user) is None, "an unchanged save records nothing"


@pytest.mark.django_db
def test_a_team_has_one_all_models_quota(teams):
    with pytest.raises(IntegrityError), transaction.atomic():
        Quota.objects.create(team=teams["training"], guaranteed_gpu_memory_mib=1)


@pytest.mark.django_db
def test_an_admin_quota_edit_leaves_an_audit_record_visible_on_the_team_page(client, admin_user, teams):
    quota = Quota.objects.get(team=teams["inference"])
    client.force_login(admin_user)
    url = f"/admin/quotas/quota/{quota.pk}/change/"
    form = {
        "team": quota.team_id,
        "gpu_model": "",
        "guaranteed_gpu_memory_mib": "96",  # GiB, as the admin form takes them
        "limit_gpu_memory_mib": "128",
        "guaranteed_gpus": "1",
        "limit_gpus": "2",
        "fair_share_weight": "1",
        "default_priority_class": quota.default_priority_class_id,
        "reason": "a second serving model",
    }
    response = client.post(url, form)
    assert response.status_code == 302, response.content.decode()[:2000]
    change = QuotaChange.objects.filter(team=teams["inference"], actor=admin_user).get()
    assert change.source == "admin" and change.note == "a second serving model"
    assert change.changes["guaranteed_gpu_memory_mib"] == {"old": 64 * 1024, "new": 96 * 1024}
    team_page = client.get(f"/admin/quotas/team/{teams['inference'].pk}/change/").content.decode()
    assert "Quota changes (audit trail)" in team_page
    assert "guaranteed GPU memory: 64 GiB → 96 GiB" in team_page


@pytest.mark.django_db
def test_the_admin_form_shows_a_limit_below_guarantee_on_the_field(client, admin_user, teams):
    quota = Quota.objects.get(team=teams["inference"])
    client.force_login(admin_user)
    form = {
        "team": quota.team_id,
        "gpu_model": "",
        "guaranteed_gpu_memory_mib": "64",
        "limit_gpu_memory_mib": "1",
        "guaranteed_gpus": "1",
        "limit_gpus": "2",
        "fair_share_weight": "1",
        "default_priority_class": "",
    }
    response = client.post(f"/admin/quotas/quota/{quota.pk}/change/", form)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["limit_gpu_memory_mib"] == ["The limit (1 GiB) must be at least the guarantee (64 GiB)."]
    assert not QuotaChange.objects.filter(actor=admin_user).exists()


@pytest.mark.django_db
def test_the_admin_form_refuses_negative_memory_on_the_field(client, admin_user, teams):
    quota = Quota.objects.get(team=teams["inference"])
    client.force_login(admin_user)
    form = {
        "team": quota.team_id,
        "gpu_model": "",
        "guaranteed_gpu_memory_mib": -5,
        "limit_gpu_memory_mib": "",
        "guaranteed_gpus": "1",
        "limit_gpus": "",
        "fair_share_weight": "1",
        "default_priority_class": "",
    }
    response = client.post(f"/admin/quotas/quota/{quota.pk}/change/", form)
    assert response.status_code == 200
    assert (
        "greater than or equal to 0"
        in response.context["adminform"].form.errors["guaranteed_gpu_memory_mib"][0]
    )


@pytest.mark.django_db
def test_a_quota_edit_through_the_team_inline_is_audited(client, admin_user, teams):
    team = teams["training"]
    quota = Quota.objects.get(team=team)
    client.force_login(admin_user)
    page = client.get(f"/admin/quotas/team/{team.pk}/change/")
    data = {"slug": team.slug, "display_name": team.display_name, "parent": team.parent_id or ""}
    for formset in page.context["inline_admin_formsets"]:
        fs = formset.formset
        prefix = fs.prefix
        data[f"{prefix}-TOTAL_FORMS"] = len(fs.forms)
        data[f"{prefix}-INITIAL_FORMS"] = fs.initial_form_count()
        for i, f in enumerate(fs.forms):
            for name, field in f.fields.items():
                # As the page renders it (the form's own units: GiB for memory).
                value = field.prepare_value(f.initial.get(name, field.initial))
                if hasattr(value, "pk"):
                    value = value.pk
                data[f"{prefix}-{i}-{name}"] = "" if value is None else value
    quota_prefix = next(
        fs.formset.prefix for fs in page.context["inline_admin_formsets"] if fs.formset.model is Quota
    )
    data[f"{quota_prefix}-0-guaranteed_gpus"] = "6"
    data[f"{quota_prefix}-0-reason"] = "the spring training push"
    response = client.post(f"/admin/quotas/team/{team.pk}/change/", data)
    assert response.status_code == 302, response.context["errors"] if response.context else response
    quota.refresh_from_db()
    assert quota.guaranteed_gpus == Decimal("6")
    change = QuotaChange.objects.get(team=team, actor=admin_user)
    assert change.changes == {"guaranteed_gpus": {"old": "4", "new": "6"}}, (
        "memory posted back in GiB, unchanged"
    )
    assert change.note == "the spring training push"


@pytest.mark.django_db
def test_the_admin_form_asks_for_a_reason_and_saves_nothing_without_one(client, admin_user, teams):
    quota = Quota.objects.get(team=teams["inference"])
    client.force_login(admin_user)
    form = {
        "team": quota.team_id,
        "gpu_model": "",
        "guaranteed_gpu_memory_mib": "96",
        "limit_gpu_memory_mib": "128",
        "guaranteed_gpus": "1",
        "limit_gpus": "2",
        "fair_share_weight": "1",
        "default_priority_class": quota.default_priority_class_id,
    }
    response = client.post(f"/admin/quotas/quota/{quota.pk}/change/", form)
    assert response.status_code == 200
    assert "reason is required" in response.context["adminform"].form.errors["reason"][0]
    assert not QuotaChange.objects.filter(actor=admin_user).exists()
