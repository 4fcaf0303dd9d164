"""`tessera usage` says the window it counted, as the team page and the chargeback say theirs, and counts a job that
ran as the usage API does."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from scheduling.choices import ActorKind, JobState
from scheduling.inventory.models import Gpu
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.ledger import slice_allocate
from scheduling.jobs.models import Job, JobEvent
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_transition
from tests.cli.test_cli import cli, logged_in  # noqa: F401 - the fixtures

pytestmark = pytest.mark.django_db(transaction=True)


def test_usage_states_its_window_and_counts_what_ran(logged_in, alice, teams, node):  # noqa: F811
    gpu = Gpu.objects.filter(node=node).order_by("index").first()
    job = job_submit(submitter=alice, team=teams["training"], spec=JobSpec(name="t", command="x", gpus=1))
    job_transition(
        job=job,
        to_state=JobState.PLACED,
        actor_kind=ActorKind.SCHEDULER,
        data={"gpus": [[node.name, gpu.index, gpu.memory_mib, 1000]]},
    )
    slice_allocate(job=job, gpu=gpu, memory_mib=gpu.memory_mib, compute_pct=100)
    job_transition(job=job, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT)
    # It has run for an hour: the default window ends on the minute, which a job started this second is past.
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    Job.objects.filter(pk=job.pk).update(
        submitted_at=an_hour_ago, placed_at=an_hour_ago, started_at=an_hour_ago
    )
    JobEvent.objects.filter(job=job).update(at=an_hour_ago)

    default = logged_in("usage", "--by", "team,user")
    assert default.returncode == 0, default.stderr
    found = re.search(r"Total: ([\d.]+) GPU-hours from (\S+ \S+) UTC to (\S+ \S+) UTC", default.stdout)
    assert found, default.stdout
    since, until = (datetime.strptime(found.group(i), "%Y-%m-%d %H:%M").replace(tzinfo=UTC) for i in (2, 3))
    assert until - since == timedelta(days=30) and abs(datetime.now(UTC) - until) < timedelta(minutes=2)
    assert "alice" in default.stdout and float(found.group(1)) >= 0.99

    fixed = logged_in("usage", "--since", "2026-11-01", "--until", "2026-11-03T12:00:00Z")
    assert "from 2026-11-01 00:00 UTC to 2026-11-03 12:00 UTC" in fixed.stdout, fixed.stdout
