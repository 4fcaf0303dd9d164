"""Jobs in images in the portal's pages, through Django's test client: the submit form says which images and
mounts the chosen team has, refuses an image outside its list beside the field (a permission, named), keeps an
allowed one; the job's page names its image; the admin site edits a team's allowed images and mounts."""

from __future__ import annotations

import html
import json
import re

import pytest
from django.test import Client

from quotas.models import QuotaChange, TeamMount
from quotas.services import team_images_save, team_mount_save
from scheduling.cycle import whatif
from scheduling.jobs.models import Job

pytestmark = pytest.mark.django_db
IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
FORM = {
    "name": "in-image",
    "team": "ai-lab/training",
    "kind": "whole",
    "gpus": "1",
    "topology": "none",
    "nodes": "1",
    "command_form": "argv",
    "command": "python train.py",
}


@pytest.fixture(autouse=True)
def _fresh_snapshot(monkeypatch):
    monkeypatch.setattr(whatif, "_cached", None)


@pytest.fixture
def images(teams, admin_user):
    org = teams["org"]
    org.allowed_images = "nvcr.io/nvidia/*"
    team_images_save(team=org, actor=admin_user)
    team_mount_save(
        mount=TeamMount(team=org, name="datasets", host_path="/srv/datasets", container_path="/datasets"),
        actor=admin_user,
    )


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_form_names_the_teams_images_and_mounts_and_refuses_another_image_beside_its_field(
    alice, node, images
):
    client = _signed_in(alice)
    page = html.unescape(client.get("/jobs/new/").content.decode())
    assert re.search(r'id="images-list">nvcr.io/nvidia/\*<', page)
    assert re.search(r'id="mounts-list">datasets: /datasets, read-only<', page)
    options = json.loads(
        re.search(r'<script id="image-options" type="application/json">(.*?)</script>', page).group(1)
    )
    assert options["ai-lab/training"] == {
        "images": ["nvcr.io/nvidia/*"],
        "mounts": ["datasets: /datasets, read-only"],
    }

    refused = client.post(
        "/jobs/new/", {**FORM, "image": "docker.io/library/python:3.12", "mounts": "datasets"}
    )
    said = dict(re.findall(r'id="error-(\w+)">([^<]*)<', html.unescape(refused.content.decode())))
    assert refused.status_code == 400 and not Job.objects.exists()
    assert said["image"].startswith(
        "Image docker.io/library/python:3.12 is not one of team ai-lab/training's allowed"
    )
    assert "Can never run" not in said["image"]

    taken = client.post("/jobs/new/", {**FORM, "image": IMAGE, "mounts": "datasets"})
    job = Job.objects.get()
    assert taken.status_code == 302 and (job.image, job.mounts) == (IMAGE, ["datasets"])
    shown = html.unescape(client.get(f"/jobs/{job.pk}/").content.decode())
    assert f'<code id="job-image">{IMAGE}</code> with datasets' in shown
    again = html.unescape(client.get(f"/jobs/new/?from={job.pk}").content.decode())
    assert f'value="{IMAGE}"' in again and 'value="datasets"' in again


def test_the_admin_site_edits_a_teams_images_and_mounts_and_records_them(admin_user, teams):
    client = _signed_in(admin_user)
    team = teams["training"]
    page = client.get(f"/admin/quotas/team/{team.pk}/change/").content.decode()
    assert "Jobs in images" in page and "Allowed images" in page and "Mounts for jobs in images" in page
    seen = set(QuotaChange.objects.values_list("pk", flat=True))
    form = {
        "slug": team.slug,
        "display_name": team.display_name,
        "parent": team.parent_id,
        "allowed_images": "nvcr.io/nvidia/*",
        "network": "none",
    }
    for prefix in ("quotas", "priority_class_grants", "mounts", "memberships", "quota_changes"):
        form.update({f"{prefix}-TOTAL_FORMS": "0", f"{prefix}-INITIAL_FORMS": "0"})
    form.update(
        {
            "mounts-TOTAL_FORMS": "1",
            "mounts-0-name": "data",
            "mounts-0-host_path": "/data/training",
            "mounts-0-container_path": "/data",
            "mounts-0-read_only": "on",
        }
    )
    response = client.post(f"/admin/quotas/team/{team.pk}/change/", form)
    assert response.status_code == 302, re.findall(
        r'class="errorlist[^"]*">(.*?)</ul>', response.content.decode()
    )
    team.refresh_from_db()
    assert (team.allowed_images, team.network) == ("nvcr.io/nvidia/*", "none")
    assert TeamMount.objects.get(team=team).container_path == "/data"
    notes = set(QuotaChange.objects.filter(team=team).exclude(pk__in=seen).values_list("note", flat=True))
    assert notes == {"jobs in images", "mount data added"}
