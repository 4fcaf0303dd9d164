"""A per-GPU-model quota saved through the quota service binds the scheduling cycle run against the database."""

from __future__ import annotations

from decimal import Decimal

import pytest

from quotas.models import Quota
from quotas.services import quota_save
from scheduling.choices import JobState
from scheduling.cycle import runner, snapshot
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Slice
from scheduling.jobs.submit import job_submit

pytestmark = pytest.mark.django_db


def submit(user, team, **spec):
    spec.setdefault("command", "echo hi")
    spec.setdefault("name", "job")
    return job_submit(submitter=user, team=team, spec=JobSpec(**spec))


@pytest.fixture
def a100_capped_at_two(teams, a100):
    """ai-lab/training may hold at most 2 A100-80GB (its all-models limit, 8 GPUs, would allow more)."""
    return quota_save(
        quota=Quota(
            team=teams["training"],
            gpu_model=a100,
            guaranteed_gpu_memory_mib=80 * 1024,
            guaranteed_gpus=Decimal(1),
            limit_gpus=Decimal(2),
        ),
        actor=None,
    )


def test_the_snapshot_carries_the_per_model_row_beside_the_all_models_quota(node, teams, a100_capped_at_two):
    quota = snapshot.snapshot_from_db().quotas["ai-lab/training"]
    assert quota.limit_compute_milli == 8000
    (row,) = quota.per_model
    assert (row.model, row.guaranteed_compute_milli, row.limit_compute_milli) == ("A100-80GB", 1000, 2000)
    assert snapshot.snapshot_from_db().quotas["ai-lab/inference"].per_model == ()


def test_a_cycle_refuses_to_take_a_team_past_its_per_model_limit(node, alice, teams, a100_capped_at_two):
    first = submit(alice, teams["training"], gpus=2)
    report = runner.cycle_run_once()
    assert report.placed == 1
    first.refresh_from_db()
    assert first.state == JobState.PLACED
    # Within the all-models guarantee (4 GPUs, 320 GiB) but beyond the A100 one (1 GPU, 80 GiB): borrowed.
    assert first.borrowed

    second = submit(alice, teams["training"], gpus=1)
    report = runner.cycle_run_once()
    second.refresh_from_db()
    assert report.placed == 0
    assert second.state == JobState.PENDING
    assert second.pending_reason_code == "model-quota-limit"
    assert "ai-lab/training is at its A100-80GB limit (2 GPUs)" in second.pending_reason
    assert Slice.objects.filter(job__team=teams["training"]).count() == 2  # six idle A100s stay idle to it
