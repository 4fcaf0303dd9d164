"""A pending job's reason says when the scheduler itself is the problem, in the API and on the portal."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from scheduling.cycle import liveness
from scheduling.cycle.models import SchedulerLease
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.submit import job_submit

pytestmark = pytest.mark.django_db


def _submit(user, team):
    spec = JobSpec(name="waits", command="python train.py", gpus=1)
    return job_submit(submitter=user, team=team, spec=spec)


def _last_cycle(ago_s: float) -> None:
    SchedulerLease.objects.update_or_create(
        pk=1, defaults={"issued_at": timezone.now() - timedelta(seconds=ago_s)}
    )
    liveness._last[0] = float("-inf")  # forget the process's cached answer


def test_a_stopped_scheduler_is_named_in_the_pending_reason(alice, teams, node, settings):
    settings.TESSERA_CYCLE_INTERVAL_S = 5
    job = _submit(alice, teams["training"])
    client = Client()
    client.force_login(alice)

    _last_cycle(3)
    assert (
        client.get(f"/api/v1/jobs/{job.pk}/").json()["pending_reason"]
        == "Waiting for the next scheduling cycle."
    )

    _last_cycle(150)
    body = client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["pending_reason_code"] == "scheduler_stalled"
    assert body["pending_reason"].startswith("No scheduling cycle for 2 min: the scheduler is not running.")
    queue = client.get("/api/v1/queue/").json()
    assert queue["results"][0]["pending_reason_code"] == "scheduler_stalled", queue
    assert "the scheduler is not running" in client.get(f"/jobs/{job.pk}/").content.decode()
    assert "the scheduler is not running" in client.get("/jobs/").content.decode()


def test_before_any_cycle_a_job_is_told_once_it_has_waited_three_intervals(alice, teams, node, settings):
    settings.TESSERA_CYCLE_INTERVAL_S = 5
    SchedulerLease.objects.filter(pk=1).delete()
    liveness._last[0] = float("-inf")
    job = _submit(alice, teams["training"])
    from scheduling.jobs.selectors import pending_reason

    assert pending_reason(job)[0] == "queued"
    job.submitted_at = timezone.now() - timedelta(seconds=60)
    assert pending_reason(job) == (
        "scheduler_stalled",
        "No scheduling cycle has run yet: the scheduler is not running.",
    )
