import pytest

from scheduling import errors
from scheduling.jobs import services
from scheduling.jobs.models import Job


def _submit(user, team, **spec):
    spec.setdefault("name", "job")
    spec.setdefault("command", "python run.py")
    return services.job_submit(submitter=user, team=team, spec=services.JobSpec(**spec))


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
def test_a_spec_that_can_never_run_is_refused_naming_the_field(alice, teams, node, spec, field, message):
    with pytest.raises(errors.ServiceError) as caught:
        _submit(alice, teams["training"], **spec)
    assert caught.value.field == field
    assert message in caught.value.message
    assert not Job.objects.exists()


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
def test_a_never_preempted_class_takes_jobs_that_ask_not_to_be_or_say_nothing(alice, teams, node):
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
