from decimal import Decimal

import pytest

from scheduling import errors
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job
from scheduling.jobs.submit import job_spec_of, job_submit


def _submit(user, team, **spec):
    spec.setdefault("name", "job")
    spec.setdefault("command", "python run.py")
    return job_submit(submitter=user, team=team, spec=JobSpec(**spec))


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"gpu_memory_mib": -1}, "gpu_memory_mib", "must not be negative"),
        (
            {"gpu_memory_mib": 96 * 1024, "compute_pct": 10},
            "gpu_memory",
            "largest allowed GPU has (81920 MiB)",
        ),
        (
            {"gpus": 1, "gpu_models": ["V100"]},
            "gpu_models",
            "Unknown GPU model V100; known models: A100-80GB",
        ),
        ({"gpus": 16, "topology": "nvlink"}, "gpus", "the most on any node is 8"),
        ({"gpus": 2, "nodes": 3}, "nodes", "the cluster has 1"),
        ({"compute_pct": 150}, "compute_pct", "at most 100"),
        ({"gpus": 1, "gpu_memory_mib": 1024}, "gpus", "not both"),
        ({"gpus": 1, "priority": "urgent"}, "priority", "Unknown priority 'urgent'"),
        (
            {"gpus": 1, "priority": "critical", "preemptible": True},
            "preemptible",
            "priority class critical is never preempted; drop preemptible or choose another priority",
        ),
    ],
)
def test_a_spec_that_can_never_run_is_refused_naming_the_field(
    alice, teams, node, grant, spec, field, message
):
    grant(teams["training"], "critical")
    with pytest.raises(errors.ServiceError) as caught:
        _submit(alice, teams["training"], **spec)
    assert caught.value.field == field
    assert message in caught.value.message
    assert not Job.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("seconds", "limit"), [(59, 60), (7 * 86400 + 1, 7 * 86400), (90.5, None), (True, None)]
)
def test_a_checkpoint_interval_outside_a_minute_to_a_week_or_not_whole_is_refused(
    alice, teams, node, seconds, limit
):
    with pytest.raises(errors.ServiceError) as caught:
        _submit(alice, teams["training"], gpus=1, checkpoint_interval_s=seconds)
    assert (caught.value.field, caught.value.limit) == ("checkpoint_interval_s", limit)
    assert "from 60 (1 minute) to 604800 (7 days)" in caught.value.message
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_database_refuses_a_checkpoint_interval_of_zero(alice, teams, node):
    from django.db import IntegrityError, transaction

    job = _submit(alice, teams["training"], gpus=1, checkpoint_interval_s=60)
    with pytest.raises(IntegrityError, match="job_checkpoint_interval_positive"), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(checkpoint_interval_s=0)


@pytest.mark.django_db
def test_a_resubmitted_job_keeps_its_checkpoint_interval(alice, teams, node):
    job = _submit(alice, teams["training"], gpus=1, checkpoint_interval_s=1800)
    again = job_submit(submitter=alice, team=teams["training"], spec=job_spec_of(job))
    again.refresh_from_db()
    assert again.checkpoint_interval_s == 1800


@pytest.mark.django_db
def test_a_team_you_are_not_in_is_refused(alice, teams, node):
    with pytest.raises(errors.ServiceError, match="not a member of team ai-lab/inference") as caught:
        _submit(alice, teams["inference"], gpus=1)
    assert caught.value.field == "team"


@pytest.mark.django_db
def test_a_spec_over_quota_but_within_the_cluster_is_accepted_and_waits(alice, teams, node):
    job = _submit(alice, teams["training"], gpus=8, topology="nvlink")  # the guarantee is 4 GPUs
    assert job.state == "pending"
    assert job.priority_class.name == "training", "the team's default priority class applies"


@pytest.mark.django_db
def test_a_never_preempted_class_takes_jobs_that_ask_not_to_be_or_say_nothing(alice, teams, node, grant):
    grant(teams["training"], "critical")
    quiet = _submit(alice, teams["training"], gpus=1, priority="critical")
    explicit = _submit(alice, teams["training"], gpus=1, priority="critical", preemptible=False)
    assert (quiet.preemptible, explicit.preemptible) == (False, False)


@pytest.mark.django_db
def test_a_slice_bigger_than_any_installed_card_is_refused_though_a_bigger_model_is_in_the_catalogue(
    alice, teams, node
):
    from decimal import Decimal

    from scheduling.errors import ServiceError
    from scheduling.inventory.models import GpuModel

    GpuModel.objects.create(name="H200-141GB", memory_mib=143_771, compute_capability=Decimal("9.0"))
    with pytest.raises(ServiceError, match="largest allowed GPU has \\(81920 MiB\\)"):
        _submit(alice, teams["training"], gpu_memory_mib=100 * 1024, compute_pct=10)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "spec, field, words",
    [
        ({"memory_mib": 9999 * 1024}, "memory", "the largest node has 1024 GiB"),
        ({"cpu_milli": 500_000}, "cpu", "the largest node has 128"),
    ],
)
def test_host_resources_no_node_has_are_refused_at_submit(alice, teams, node, spec, field, words):
    from scheduling.errors import ServiceError

    with pytest.raises(ServiceError, match=words) as refused:
        _submit(alice, teams["training"], gpus=1, **spec)
    assert refused.value.field == field


# -- Priority classes a team may use, and the team's limits ------------------------------------------------------


def _set_quota(team, **values):
    from quotas.models import Quota
    from quotas.services import quota_save

    quota = Quota.objects.get(team=team, gpu_model=None)
    for name, value in values.items():
        setattr(quota, name, value)
    quota_save(quota=quota, actor=None)


@pytest.mark.django_db
def test_a_class_the_team_may_not_use_is_refused_listing_the_ones_it_may(alice, teams, node):
    with pytest.raises(errors.ServiceError) as caught:
        _submit(alice, teams["training"], gpus=1, priority="critical")
    assert caught.value.field == "priority"
    assert caught.value.code == "priority_not_granted"
    assert caught.value.message == (
        "team ai-lab/training may not use priority class critical; it may use: training, inference; default "
        "training."
    )
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_granted_class_is_used_and_a_grant_to_the_organisation_holds_for_its_teams(
    alice, teams, node, grant
):
    from quotas.models import Team, TeamPriorityClass

    grant(teams["training"], "critical")
    assert _submit(alice, teams["training"], gpus=1, priority="critical").priority_class.name == "critical"
    TeamPriorityClass.objects.filter(team=teams["training"]).delete()
    grant(Team.objects.get(slug="ai-lab"), "critical")
    assert _submit(alice, teams["training"], gpus=1, priority="critical").priority_class.name == "critical"


@pytest.mark.django_db
def test_the_default_class_applies_when_none_is_named_and_is_always_usable(
    alice, teams, node, priority_classes
):
    assert _submit(alice, teams["training"], gpus=1).priority_class.name == "training"
    # A class closed to other teams is open to the team whose default it is.
    _set_quota(teams["training"], default_priority_class=priority_classes["critical"])
    assert _submit(alice, teams["training"], gpus=1).priority_class.name == "critical"


@pytest.mark.django_db
def test_a_job_beyond_the_teams_gpu_limit_is_refused_naming_the_field_and_the_limit(alice, teams, node):
    _set_quota(teams["training"], guaranteed_gpus=2, limit_gpus=3)
    with pytest.raises(errors.ServiceError) as caught:
        _submit(alice, teams["training"], gpus=4)
    assert (caught.value.field, caught.value.limit) == ("gpus", 3)
    assert caught.value.message == (
        "gpus: this job needs 4 GPUs but team ai-lab/training may hold at most 3 GPUs (its limit)."
    )
    assert _submit(alice, teams["training"], gpus=3).state == "pending", "at the limit is within it"


@pytest.mark.django_db
def test_a_job_beyond_the_teams_limit_at_its_class_is_refused(alice, teams, node, grant):
    grant(teams["training"], "training", limit_gpus=Decimal(2))
    with pytest.raises(errors.ServiceError) as caught:
        _submit(alice, teams["training"], gpus=3)
    assert (caught.value.field, caught.value.limit) == ("gpus", 2)
    assert caught.value.message == (
        "gpus: this job needs 3 GPUs but team ai-lab/training may hold at most 2 GPUs at priority training "
        "(its limit for that class)."
    )
    assert _submit(alice, teams["training"], gpus=3, priority="inference").state == "pending"


@pytest.mark.django_db
def test_a_job_beyond_the_teams_gpu_memory_limit_is_refused_counting_the_smallest_card(
    bob, teams, node, a100
):
    from scheduling.inventory.models import Gpu, GpuModel, Node

    # ai-lab/inference may hold 128 GiB: two A100s of 80 GiB never fit in it.
    with pytest.raises(errors.ServiceError) as caught:
        _submit(bob, teams["inference"], gpus=2)
    assert (caught.value.field, caught.value.limit) == ("gpus", f"{128 * 1024}MiB")
    assert caught.value.message == (
        "gpus: this job needs at least 160 GiB of GPU memory (2 x a card of at least 80 GiB) but team "
        "ai-lab/inference may hold at most 128 GiB (its limit)."
    )
    # With two 16 GiB cards in the cluster the job may fit: it is accepted and waits.
    t4 = GpuModel.objects.create(name="T4", memory_mib=16 * 1024, compute_capability=Decimal("7.5"))
    small = Node.objects.create(name="t4-01", cpu_milli=32_000, memory_mib=192 * 1024)
    for i in range(2):
        Gpu.objects.create(node=small, index=i, uuid=f"GPU-t4-{i}", model=t4, memory_mib=t4.memory_mib)
    assert _submit(bob, teams["inference"], gpus=2).state == "pending"
    with pytest.raises(errors.ServiceError, match="at least 160 GiB"):
        _submit(bob, teams["inference"], gpus=2, min_gpu_memory_mib=40 * 1024)
