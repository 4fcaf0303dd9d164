"""The queue page's other-team rows say why they wait in general words, never the scheduler's code nor the
other team's own reason text; the API's queue keeps the code, as docs/api.md says."""

from __future__ import annotations

import pytest
from django.test import Client

from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job
from scheduling.jobs.submit import job_submit

pytestmark = pytest.mark.django_db


def test_another_teams_waiting_job_says_why_in_general_words_not_its_code(alice, bob, teams, node):
    job = job_submit(
        submitter=alice,
        team=teams["training"],
        spec=JobSpec(name="alice-secret", command="python run.py", gpus=8),
    )
    secret_reason = "needs 8 whole GPUs on one node; a100-01 has 3 (alice-secret's own words)"
    Job.objects.filter(pk=job.pk).update(
        pending_reason_code="insufficient-gpus", pending_reason=secret_reason
    )
    as_bob = Client()
    as_bob.force_login(bob)

    page = as_bob.get("/queue/").content.decode()
    assert "no node has enough free whole GPUs" in page
    assert "insufficient-gpus" not in page and "a100-01 has 3" not in page and "alice-secret" not in page

    [entry] = as_bob.get("/api/v1/queue/").json()["results"]
    assert (entry["pending_reason_code"], entry["pending_reason"]) == ("insufficient-gpus", None)
    assert entry["pending_reason_general"] == "no node has enough free whole GPUs"
