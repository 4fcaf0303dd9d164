"""Submit-time cluster limits follow the inventory as it changes, and the one-query helpers agree with the
ORM rules they replace on the submit path."""

from decimal import Decimal

import pytest

from scheduling import services
from scheduling.choices import GpuHealth
from scheduling.models import Gpu, GpuModel, Node


def _submit(user, team, **spec):
    spec.setdefault("name", "job")
    spec.setdefault("command", "python run.py")
    return services.job_submit(submitter=user, team=team, spec=services.JobSpec(**spec))


def _add_node(name, model, *, gpus, numa_split=4):
    node = Node.objects.create(name=name, cpu_milli=64_000, memory_mib=512 * 1024)
    for i in range(gpus):
        Gpu.objects.create(
            node=node,
            index=i,
            uuid=f"GPU-{name}-{i}",
            model=model,
            memory_mib=model.memory_mib,
            numa_node=i // numa_split,
        )
    return node


@pytest.mark.django_db
def test_a_gang_refused_for_want_of_nodes_is_accepted_once_a_node_joins(alice, teams, node, a100):
    with pytest.raises(services.ServiceError, match="the cluster has 1"):
        _submit(alice, teams["training"], gpus=4, nodes=2)
    _add_node("a100-02", a100, gpus=4)
    assert _submit(alice, teams["training"], gpus=4, nodes=2).state == "pending"


@pytest.mark.django_db
def test_failed_gpus_shrink_the_largest_group_at_once(alice, teams, node):
    assert _submit(alice, teams["training"], gpus=8).state == "pending"
    Gpu.objects.filter(node=node, index=7).update(health=GpuHealth.FAILED)
    with pytest.raises(services.ServiceError, match="the most on any node is 7"):
        _submit(alice, teams["training"], gpus=8)
    Gpu.objects.filter(node=node, index=7).update(health=GpuHealth.OK)
    assert _submit(alice, teams["training"], gpus=8).state == "pending"


@pytest.mark.django_db
def test_a_new_gpu_model_is_known_to_the_next_submit(alice, teams, node):
    with pytest.raises(services.ServiceError, match="Unknown GPU model H200"):
        _submit(alice, teams["training"], gpus=1, gpu_models=["H200"])
    h200 = GpuModel.objects.create(name="H200", memory_mib=143_771, compute_capability=Decimal("9.0"))
    with pytest.raises(services.ServiceError, match="the most on any node is 0"):
        _submit(alice, teams["training"], gpus=1, gpu_models=["H200"])
    _add_node("h200-01", h200, gpus=8)
    assert _submit(alice, teams["training"], gpus=8, gpu_models=["H200"]).state == "pending"
    assert _submit(alice, teams["training"], gpu_memory_mib=140_000, compute_pct=50).state == "pending"
    h200.memory_mib = 100_000
    h200.save()
    with pytest.raises(services.ServiceError, match="largest allowed GPU has"):
        _submit(alice, teams["training"], gpu_memory_mib=140_000, compute_pct=50)


@pytest.mark.django_db
@pytest.mark.parametrize("topology", ["none", "numa"])
def test_the_one_query_counts_agree_with_the_orm_rules(node, a100, topology):
    _add_node("a100-02", a100, gpus=6, numa_split=2)
    _add_node("a100-03", a100, gpus=3, numa_split=1)
    Gpu.objects.filter(node__name="a100-02", index__in=[0, 1]).update(health=GpuHealth.FAILED)
    other = GpuModel.objects.create(name="L4", memory_mib=23_034, compute_capability=Decimal("8.9"))
    _add_node("l4-01", other, gpus=2)
    for allowed in ({a100.id}, {other.id}, {a100.id, other.id}, set()):
        for gpus in (1, 2, 3, 6, 8, 9):
            got = services._gpu_counts(allowed_models=allowed, topology=topology, gpus=gpus)
            want = (
                services._largest_gpu_group(allowed_models=allowed, topology=topology),
                services._nodes_with_at_least(allowed_models=allowed, gpus=gpus),
            )
            assert got == want, (allowed, gpus)


@pytest.mark.django_db
def test_the_team_default_class_falls_back_to_the_lowest_class(alice, teams, priority_classes):
    from quotas.models import PriorityClass, Quota
    from quotas.selectors import priority_class_default_for_team

    for team in teams.values():
        member, default = services._membership_and_default_class(user_id=alice.pk, team_id=team.pk)
        assert member == (team.slug == "ai-lab/training")
        assert default == priority_class_default_for_team(team=team)
    Quota.objects.filter(team=teams["inference"]).update(default_priority_class=None)
    _, default = services._membership_and_default_class(user_id=alice.pk, team_id=teams["inference"].pk)
    assert default == PriorityClass.objects.order_by("value").first()
    assert default.name == priority_class_default_for_team(team=teams["inference"]).name


@pytest.mark.django_db
def test_the_one_statement_insert_writes_what_the_orm_saves_write(alice, teams, node, monkeypatch):
    from django.db import connection
    from django.forms.models import model_to_dict

    from scheduling.models import Job, JobEvent

    spec = {
        "gpus": 2,
        "env": {"A": "1"},
        "gpu_models": ["A100-80GB"],
        "max_runtime_s": 60,
        "priority": "inference",
    }
    fast = _submit(alice, teams["training"], **spec)
    monkeypatch.setattr(connection, "vendor", "other")
    plain = _submit(alice, teams["training"], **spec)
    monkeypatch.undo()

    def row(job):
        stored = Job.objects.get(pk=job.pk)
        event = JobEvent.objects.get(job=stored)
        job_fields = {k: v for k, v in model_to_dict(stored).items() if k != "id"}
        event_fields = {k: v for k, v in model_to_dict(event).items() if k not in ("id", "job")}
        return job_fields, event_fields, stored.submitted_at is not None and event.at is not None

    assert row(fast) == row(plain)
    assert row(fast)[0]["env"] == {"A": "1"} and row(fast)[2]
    assert fast.pk and not fast._state.adding and fast.events.count() == 1
