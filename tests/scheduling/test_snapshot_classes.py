"""The snapshot feeds the engine each job's priority class by name and how often it checkpoints, and each team's
per-class limits from its grants (its own, else its organisation's), in milli-GPU."""

from __future__ import annotations

from decimal import Decimal

import pytest

from quotas.models import Team
from scheduling.choices import ActorKind, JobState
from scheduling.cycle import snapshot
from scheduling.engine import types as eng
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_transition

pytestmark = pytest.mark.django_db


def submit(user, team, **spec):
    spec.setdefault("command", "echo hi")
    spec.setdefault("name", "job")
    return job_submit(submitter=user, team=team, spec=JobSpec(**spec))


def test_pending_and_running_jobs_carry_their_priority_class_by_name(node, alice, teams):
    running = submit(alice, teams["training"], gpus=1, priority="inference")
    job_transition(job=running, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER)
    pending = submit(alice, teams["training"], gpus=1)
    snap = snapshot.snapshot_from_db()
    assert [(j.id, j.priority_class) for j in snap.running] == [(str(running.pk), "inference")]
    assert [(j.id, j.priority_class) for j in snap.pending] == [(str(pending.pk), "training")]


def test_pending_and_running_jobs_carry_how_often_they_checkpoint(node, alice, teams):
    running = submit(alice, teams["training"], gpus=1, checkpoint_interval_s=1800)
    job_transition(job=running, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER)
    pending = submit(alice, teams["training"], gpus=1, checkpoint_interval_s=600)
    never = submit(alice, teams["training"], gpus=1)
    snap = snapshot.snapshot_from_db()
    assert [(j.id, j.checkpoint_interval_s) for j in snap.running] == [(str(running.pk), 1800.0)]
    assert [(j.id, j.checkpoint_interval_s) for j in snap.pending] == [
        (str(pending.pk), 600.0),
        (str(never.pk), None),
    ]
    assert isinstance(snap.running[0].checkpoint_interval_s, float)


def test_the_snapshot_carries_class_limits_from_the_grants(node, teams, grant):
    grant(Team.objects.get(slug="ai-lab"), "critical", limit_gpus=Decimal(2))
    grant(teams["training"], "training", limit_gpus=Decimal("1.5"))
    grant(teams["inference"], "critical", limit_gpus=None)  # its own grant, with no limit, wins
    quotas = snapshot.snapshot_from_db().quotas
    assert quotas["ai-lab/training"].class_limits == (
        eng.ClassLimit("critical", 2000),
        eng.ClassLimit("training", 1500),
    )
    assert quotas["ai-lab/training"].class_limit("inference") is None
    assert quotas["ai-lab/training"].limit_compute_milli == 8000, "the quota itself is unchanged"
    assert quotas["ai-lab/inference"].class_limits == ()
    # The organisation has no quota row; it gets one carrying only its limits.
    assert quotas["ai-lab"] == eng.Quota(team="ai-lab", class_limits=(eng.ClassLimit("critical", 2000),))


@pytest.mark.both_databases
def test_the_snapshot_reads_each_jobs_moments_to_the_microsecond_as_its_row_holds_them(node, alice, teams):
    # The snapshot reads submit and start times as Unix seconds computed by the database; they must be the
    # moments the rows hold, as the engine's view of a loaded job (`engine_job`) has them.
    from datetime import UTC, datetime

    running = submit(alice, teams["training"], gpus=1)
    job_transition(job=running, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER)
    pending, on_the_second = (
        submit(alice, teams["training"], gpus=1),
        submit(alice, teams["training"], gpus=1),
    )
    type(pending).objects.filter(pk=pending.pk).update(
        submitted_at=datetime(2026, 12, 7, 17, 41, 15, 849123, UTC)
    )
    type(pending).objects.filter(pk=on_the_second.pk).update(
        submitted_at=datetime(2026, 12, 7, 17, 41, 16, tzinfo=UTC)
    )
    snap = snapshot.snapshot_from_db()
    read = {j.id: (j.submit_time, j.start_time) for j in (*snap.running, *snap.pending)}
    for job in (running, pending, on_the_second):
        job.refresh_from_db()
        view = snapshot.engine_job(job)
        assert read[str(job.pk)] == pytest.approx((view.submit_time, view.start_time), abs=1e-6)
    assert read[str(pending.pk)][0] == pytest.approx(1796665275.849123, abs=1e-6)
    assert read[str(on_the_second.pk)] == (1796665276.0, None)
    assert read[str(running.pk)][1] is not None
