"""The teams, quota editor and fairness pages through Django's test client: who may open and save what, GiB on
the form and MiB in the database, the preview saving nothing, and a pending job's "why ahead"."""

from __future__ import annotations

import html
import re

import pytest

from quotas.models import Quota, QuotaChange
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.submit import job_submit
from tests.quotas.editor import quota_form, signed_in

pytestmark = pytest.mark.django_db


def test_a_team_admin_saves_a_lower_guarantee_in_gib_and_sees_the_audit_row(carol, teams, node):
    client = signed_in(carol)
    url = "/teams/ai-lab/training/quota/"
    page = client.get(url).content.decode()
    assert 'value="320"' in page, "memory is shown in GiB"
    response = client.post(url, quota_form(guaranteed_gib="256", reason="fewer big runs this quarter"))
    assert response.status_code == 302
    quota = Quota.objects.get(team=teams["training"], gpu_model__isnull=True)
    assert quota.guaranteed_gpu_memory_mib == 256 * 1024
    page = client.get(url).content.decode()
    assert "fewer big runs this quarter" in page and "320 GiB → <b>256 GiB</b>" in page


def test_without_a_reason_the_form_says_so_next_to_the_field_and_saves_nothing(carol, teams, node):
    response = signed_in(carol).post("/teams/ai-lab/training/quota/", quota_form(guaranteed_gpus="3"))
    assert response.status_code == 400
    assert 'id="error-reason"' in response.content.decode()
    assert not QuotaChange.objects.filter(actor=carol).exists()


def test_a_team_admin_of_another_team_gets_403_on_page_and_post(carol, teams, node):
    client = signed_in(carol)
    assert client.get("/teams/ai-lab/inference/quota/").status_code == 403
    response = client.post("/teams/ai-lab/inference/quota/", quota_form(guaranteed_gpus="0", reason="x"))
    assert response.status_code == 403
    assert Quota.objects.get(team=teams["inference"], gpu_model__isnull=True).guaranteed_gpus == 1


def test_the_preview_shows_capacity_and_saves_nothing(admin_user, teams, node):
    response = signed_in(admin_user).post(
        "/teams/ai-lab/training/quota/preview/", quota_form(guaranteed_gpus="8")
    )
    page = response.content.decode()
    assert response.status_code == 200 and "Guarantees against capacity" in page
    assert "over-committed" in page, "9 GPUs guaranteed on an 8-GPU cluster"
    assert Quota.objects.get(team=teams["training"], gpu_model__isnull=True).guaranteed_gpus == 4


def test_fairness_shows_the_tree_to_any_member_without_jobs(alice, bob, teams, node):
    job_submit(
        submitter=alice,
        team=teams["training"],
        spec=JobSpec(name="secret-name", command="x", gpus=1),
    )
    page = signed_in(bob).get("/fairness/").content.decode()
    assert "ai-lab/training" in page and "ai-lab/inference" in page and "(organisation)" in page
    assert "secret-name" not in page and "alice" not in page


def test_a_pending_jobs_page_explains_how_the_teams_stand(alice, teams, node):
    job = job_submit(submitter=alice, team=teams["training"], spec=JobSpec(name="j", command="x", gpus=1))
    client = signed_in(alice)
    assert f'hx-get="/jobs/{job.pk}/?part=ahead"' in client.get(f"/jobs/{job.pk}/").content.decode()
    part = client.get(f"/jobs/{job.pk}/?part=ahead").content.decode()
    assert "fits within ai-lab/training's guarantee" in part
    assert "is within its guarantee (0 of 4 GPUs)" in part


def test_a_count_of_one_reads_one_gpu_not_one_gpus(client, bob, teams):
    """ai-lab/inference is guaranteed 1 GPU: the teams list and its page say so in the singular."""
    client.force_login(bob)
    listing = " ".join(html.unescape(re.sub(r"<[^>]+>", "", client.get("/teams/").content.decode())).split())
    page = " ".join(html.unescape(client.get("/teams/ai-lab/inference/").content.decode()).split())
    assert "1 GPU ·" in listing and "1 GPUs" not in listing
    assert "1 GPUs" not in page
