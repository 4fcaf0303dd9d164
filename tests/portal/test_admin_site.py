"""The admin site as an admin reads it: quota sizes typed and shown in GiB and GPUs as the portal shows them,
every field of the apps' models labelled in words, and each quota linked to the portal's quota editor."""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.test import Client

from quotas.models import Quota, QuotaChange

pytestmark = pytest.mark.django_db

# Words a label must not show as Django derives them from a field's name ("Guaranteed gpu memory mib").
RAW = re.compile(r"\b(gpu|gpus|mib|cpu|uuid|numa|nvlink|mig|pct|milli|url|s)\b")


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _inference_quota(teams) -> Quota:
    return Quota.objects.get(team=teams["inference"], gpu_model__isnull=True)


def test_every_field_and_model_of_the_apps_in_the_admin_is_labelled_in_words():
    raw = []
    for model in admin.site._registry:
        if model._meta.app_label not in ("quotas", "scheduling"):
            continue
        plural = str(model._meta.verbose_name_plural)
        names = [str(model._meta.verbose_name), plural, *(str(f.verbose_name) for f in model._meta.fields)]
        raw += [f"{model.__name__}: {name}" for name in names if RAW.search(name)]
        if plural.endswith("ss"):
            raw.append(f"{model.__name__}: {plural}")
    assert not raw, raw


def test_a_quotas_change_page_shows_gib_and_gpus_and_links_the_portals_editor(admin_user, teams):
    quota = _inference_quota(teams)  # 1 GPU and 64 GiB guaranteed; at most 2 GPUs and 128 GiB
    page = _signed_in(admin_user).get(f"/admin/quotas/quota/{quota.pk}/change/").content.decode()
    assert re.search(r'name="guaranteed_gpu_memory_mib" value="64"', page), "64 GiB, not 65536 MiB"
    assert re.search(r'name="limit_gpus" value="2"', page), "2 GPUs, not 2.000"
    assert "Guaranteed GPU memory (GiB)" in page and "GPU limit" in page
    assert "65536" not in page and "2.000" not in page
    assert 'href="/teams/ai-lab/inference/quota/?scope=all"' in page


def test_a_quota_saved_in_the_admin_in_gib_is_stored_in_mib_and_an_unchanged_one_needs_no_reason(
    admin_user, teams
):
    quota = _inference_quota(teams)
    url = f"/admin/quotas/quota/{quota.pk}/change/"
    form = {
        "team": teams["inference"].pk,
        "gpu_model": "",
        "guaranteed_gpu_memory_mib": "64",
        "limit_gpu_memory_mib": "128",
        "guaranteed_gpus": "1",
        "limit_gpus": "2",
        "fair_share_weight": "1",
        "default_priority_class": quota.default_priority_class_id,
        "reason": "",
    }
    client = _signed_in(admin_user)
    assert client.post(url, form).status_code == 302, "nothing changed: no reason asked"
    assert not QuotaChange.objects.filter(actor=admin_user).exists()
    assert (
        client.post(
            url, {**form, "guaranteed_gpu_memory_mib": "32.5", "reason": "serving shrinks"}
        ).status_code
        == 302
    )
    quota.refresh_from_db()
    assert quota.guaranteed_gpu_memory_mib == 33280
    change = QuotaChange.objects.get(actor=admin_user)
    listing = _signed_in(admin_user).get("/admin/quotas/quotachange/").content.decode()
    assert "guaranteed GPU memory: 64 GiB → 32.5 GiB" in listing and str(change.pk) in listing


def test_the_quota_list_reads_in_gpus_and_gib_and_links_each_row_to_the_editor(admin_user, teams):
    page = _signed_in(admin_user).get("/admin/quotas/quota/").content.decode()
    assert "1 GPU · 64 GiB" in page and "2 GPUs · 128 GiB" in page and "4 GPUs · 320 GiB" in page
    assert 'href="/teams/ai-lab/training/quota/?scope=all"' in page
    assert "65536" not in page and "4.000" not in page


def test_the_admin_index_names_notification_settings_once(admin_user):
    page = _signed_in(admin_user).get("/admin/").content.decode()
    assert "Notification settings" in page and "settingss" not in page.lower()


def test_every_admin_list_and_page_of_the_apps_opens(admin_user, alice, teams, node):
    from scheduling.jobs.fields import JobSpec
    from scheduling.jobs.submit import job_submit

    job = job_submit(
        submitter=alice,
        team=teams["training"],
        spec=JobSpec(name="j", command="true", gpus=0, gpu_memory_mib=8192, compute_pct=25),
    )
    client = _signed_in(admin_user)
    for model in admin.site._registry:
        meta = model._meta
        if meta.app_label not in ("quotas", "scheduling"):
            continue
        listing = client.get(f"/admin/{meta.app_label}/{meta.model_name}/")
        assert listing.status_code == 200, meta.model_name
        first = model.objects.first()
        if first is not None:
            assert (
                client.get(f"/admin/{meta.app_label}/{meta.model_name}/{first.pk}/change/").status_code == 200
            )
    jobs = client.get("/admin/scheduling/job/").content.decode()
    assert "8 GiB" in jobs and f"/admin/scheduling/job/{job.pk}/change/" in jobs
    assert "80 GiB" in client.get("/admin/scheduling/gpu/").content.decode()


def test_the_admin_site_says_it_is_tesseras(admin_user):
    page = _signed_in(admin_user).get("/admin/").content.decode()
    assert "Tessera administration" in page and "Django administration" not in page


def test_an_admin_signs_a_user_out_everywhere_from_the_user_list(admin_user, alice):
    from quotas.models import ApiToken
    from quotas.tokens import api_token_create

    api_token_create(user=alice, name="laptop")
    researcher = _signed_in(alice)
    assert researcher.get("/jobs/").status_code == 200
    response = _signed_in(admin_user).post(
        "/admin/auth/user/", {"action": "sign_out_everywhere", "_selected_action": [alice.pk]}, follow=True
    )
    assert "Signed out 1 user: 1 sessions ended, 1 tokens revoked." in response.content.decode()
    assert not ApiToken.objects.filter(user=alice, revoked_at__isnull=True).exists()
    assert researcher.get("/jobs/").status_code == 302, "her session ended: the sign-in page"
