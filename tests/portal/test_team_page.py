"""A team's page: aggregates for everyone, members and chargeback for its members and staff only, the chargeback
CSV equal to the usage API's, bad dates named, and the seed's figures from the rollups."""

from __future__ import annotations

import csv
import html
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from scheduling.choices import ActorKind, JobState
from scheduling.history import recorder
from scheduling.inventory.models import Gpu
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.ledger import slice_allocate
from scheduling.jobs.models import Job
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_transition

pytestmark = pytest.mark.django_db


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _running(user, team, gpu, **spec):
    spec = {"name": "train", "command": "python train.py", "gpus": 1, **spec}
    job = job_submit(submitter=user, team=team, spec=JobSpec(**spec))
    job_transition(job=job, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER)
    slice_allocate(job=job, gpu=gpu, memory_mib=gpu.memory_mib, compute_pct=100)
    job_transition(job=job, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT)
    return job


def test_a_member_sees_the_quota_the_holding_the_members_and_the_chargeback(alice, teams, node):
    _running(alice, teams["training"], Gpu.objects.get(node=node, index=0))
    recorder.history_record()
    page = _signed_in(alice).get("/teams/ai-lab/training/").content.decode()
    assert "GPUs held now" in page and "GPUs guaranteed" in page
    assert "Members" in page and "alice" in page
    assert "Chargeback" in page and "Download CSV" in page
    assert 'id="team-chart"' in page


def test_another_teams_member_sees_aggregates_but_no_people_and_no_csv(alice, bob, teams, node):
    _running(alice, teams["training"], Gpu.objects.get(node=node, index=0))
    client = _signed_in(bob)
    page = client.get("/teams/ai-lab/training/").content.decode()
    assert "GPUs held now" in page
    assert "alice" not in page and "Chargeback" not in page
    refused = client.get("/teams/ai-lab/training/chargeback.csv")
    words = " ".join(html.unescape(refused.content.decode()).split())
    # A permission, said as one: not "no such team" about a team whose page bob has just seen.
    assert refused.status_code == 403 and "only its members and the site's admins may download it" in words
    assert client.get("/teams/no-such-team/").status_code == 404


def test_the_chargeback_csv_equals_the_usage_api(alice, admin_user, teams, node):
    job = _running(alice, teams["training"], Gpu.objects.get(node=node, index=0))
    earlier = datetime.now(UTC) - timedelta(hours=5)
    Job.objects.filter(pk=job.pk).update(started_at=earlier)
    job.events.filter(to_state__in=[JobState.PLACED, JobState.RUNNING]).update(at=earlier)
    client = _signed_in(admin_user)
    today = datetime.now(UTC).date()
    since = today - timedelta(days=2)
    exported = client.get(f"/teams/ai-lab/training/chargeback.csv?since={since}&until={today}")
    assert exported["Content-Type"].startswith("text/csv")
    ours = list(csv.DictReader(io.StringIO(exported.content.decode())))
    start = datetime(since.year, since.month, since.day, tzinfo=UTC).isoformat().replace("+00:00", "Z")
    api = client.get(f"/api/v1/usage/?team=ai-lab/training&group_by=team,user,model&since={start}&format=csv")
    theirs = list(csv.DictReader(io.StringIO(api.content.decode())))
    assert [r["user"] for r in ours] == ["alice"] and ours[0]["model"] == "A100-80GB"
    # The page's export ends now, as the API's does: the same rows to the GPU-second (4 decimals of an hour).
    assert [(r["team"], r["user"], r["model"]) for r in ours] == [
        (r["team"], r["user"], r["model"]) for r in theirs
    ]
    for mine, api_row in zip(ours, theirs, strict=True):
        assert abs(float(mine["gpu_hours"]) - float(api_row["gpu_hours"])) <= 1 / 3600
    assert float(ours[0]["gpu_hours"]) == pytest.approx(5.0, abs=0.01)


def test_bad_chargeback_dates_are_named_and_nothing_breaks(alice, teams, node):
    client = _signed_in(alice)
    page = client.get("/teams/ai-lab/training/?since=yesterday").content.decode()
    assert "since must be a date such as 2026-11-01" in page
    response = client.get("/teams/ai-lab/training/chargeback.csv?since=2026-12-05&until=2026-12-01")
    assert response.status_code == 400 and b"since must be on or before until" in response.content
    assert client.get("/teams/ai-lab/training/?window=nonsense").status_code == 200


def test_the_teams_list_links_each_team_to_its_page(alice, teams, node):
    page = _signed_in(alice).get("/teams/").content.decode()
    name = '<span class="nowrap">ai-lab/</span><wbr><span class="nowrap">training</span>'  # wraps at its '/' only
    assert f'<a href="/teams/ai-lab/training/">{name}</a>' in page


def test_a_team_admin_gets_an_edit_quota_link_and_a_member_does_not(alice, carol, teams, node):
    assert (
        "/teams/ai-lab/training/quota/" in _signed_in(carol).get("/teams/ai-lab/training/").content.decode()
    )
    assert (
        "/teams/ai-lab/training/quota/"
        not in _signed_in(alice).get("/teams/ai-lab/training/").content.decode()
    )
