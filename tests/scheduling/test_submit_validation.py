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
