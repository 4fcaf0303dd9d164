"""Submit-time cluster limits follow the inventory as it changes, and the one-query helpers agree with the
ORM rules they replace on the submit path."""

from decimal import Decimal

import pytest
from django.db.models import Count

from scheduling import errors
from scheduling.choices import GpuHealth
from scheduling.inventory import selectors as inventory_selectors
from scheduling.inventory.models import Gpu, GpuModel, Node
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.submit import job_submit


def _submit(user, team, **spec):
    spec.setdefault("name", "job")
    spec.setdefault("command", "python run.py")
    return job_submit(submitter=user, team=team, spec=JobSpec(**spec))


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
    with pytest.raises(errors.ServiceError, match="the cluster has 1"):
        _submit(alice, teams["training"], gpus=4, nodes=2)
    _add_node("a100-02", a100, gpus=4)
    assert _submit(alice, teams["training"], gpus=4, nodes=2).state == "pending"


@pytest.mark.django_db
def test_failed_gpus_shrink_the_largest_group_at_once(alice, teams, node):
    assert _submit(alice, teams["training"], gpus=8).state == "pending"
    Gpu.objects.filter(node=node, index=7).update(health=GpuHealth.FAILED)
    with pytest.raises(errors.ServiceError, match="the most on any node is 7"):
        _submit(alice, teams["training"], gpus=8)
    Gpu.objects.filter(node=node, index=7).update(health=GpuHealth.OK)
    assert _submit(alice, teams["training"], gpus=8).state == "pending"


@pytest.mark.django_db
def test_a_new_gpu_model_is_known_to_the_next_submit(alice, teams, node):
    with pytest.raises(errors.ServiceError, match="Unknown GPU model H200"):
        _submit(alice, teams["training"], gpus=1, gpu_models=["H200"])
    h200 = GpuModel.objects.create(name="H200", memory_mib=143_771, compute_capability=Decimal("9.0"))
    with pytest.raises(errors.ServiceError, match="the most on any node is 0"):
        _submit(alice, teams["training"], gpus=1, gpu_models=["H200"])
    _add_node("h200-01", h200, gpus=8)
    # Four: eight H200s hold more GPU memory than the team may (640 GiB).
    assert _submit(alice, teams["training"], gpus=4, gpu_models=["H200"]).state == "pending"
    assert _submit(alice, teams["training"], gpu_memory_mib=140_000, compute_pct=50).state == "pending"
    h200.memory_mib = 100_000
    h200.save()
    with pytest.raises(errors.ServiceError, match="largest allowed GPU has"):
        _submit(alice, teams["training"], gpu_memory_mib=140_000, compute_pct=50)


def _largest_group_by_orm(*, allowed_models, topology):
    """The reference: the most healthy GPUs of the allowed models one node (for NUMA, one NUMA node) holds."""
    usable = Gpu.objects.filter(model_id__in=allowed_models).exclude(health=GpuHealth.FAILED)
    per = ("node_id", "numa_node") if topology == "numa" else ("node_id",)
    counts = usable.values(*per).annotate(n=Count("id")).order_by().values_list("n", flat=True)
    return max(counts, default=0)


def _nodes_with_at_least_by_orm(*, allowed_models, gpus):
    return (
        Gpu.objects.filter(model_id__in=allowed_models)
        .values("node_id")
        .annotate(n=Count("id"))
        .filter(n__gte=gpus)
        .order_by()
        .count()
    )


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
            got = inventory_selectors.whole_gpu_capacity(allowed_models=allowed, topology=topology, gpus=gpus)
            want = (
                _largest_group_by_orm(allowed_models=allowed, topology=topology) if allowed else 0,
                _nodes_with_at_least_by_orm(allowed_models=allowed, gpus=gpus),
            )
            assert got == want, (allowed, gpus)


def _allowed_by_orm(team):
    """The classes a team may use, by the rule as written (quotas.selectors._allowance), through the ORM."""
    from quotas.models import PriorityClass, Quota, TeamPriorityClass

    quota = Quota.objects.filter(team=team, gpu_model=None).first()
    default_id = quota.default_priority_class_id if quota else None
    own = dict(TeamPriorityClass.objects.filter(team=team).values_list("priority_class__name", "limit_gpus"))
    inherited = dict(
        TeamPriorityClass.objects.filter(team_id=team.parent_id).values_list(
            "priority_class__name", "limit_gpus"
        )
    )
    return {
        pc.name: own[pc.name] if pc.name in own else inherited.get(pc.name)
        for pc in PriorityClass.objects.all()
        if pc.open_to_all_teams or pc.name in own or pc.name in inherited or pc.pk == default_id
    }


@pytest.mark.django_db
def test_the_one_query_allowance_agrees_with_the_orm_rule(alice, teams, grant):
    from quotas.models import Team
    from quotas.selectors import team_allowances

    org = Team.objects.get(slug="ai-lab")
    grant(org, "critical", limit_gpus=Decimal(2))
    grant(teams["inference"], "critical", limit_gpus=Decimal("0.5"))
    grant(teams["training"], "training", limit_gpus=Decimal(6))
    allowances = team_allowances(user=alice)
    assert set(allowances) == set(Team.objects.values_list("pk", flat=True))
    for team in Team.objects.all():
        got = {g.priority_class.name: g.limit_gpus for g in allowances[team.pk].classes}
        assert got == _allowed_by_orm(team), team.slug
        assert allowances[team.pk].is_member == (team.slug == "ai-lab/training")
    assert {g.priority_class.name: g.limit_gpus for g in allowances[teams["training"].pk].classes} == {
        "critical": Decimal(2),  # the organisation's grant
        "training": Decimal(6),
        "inference": None,
    }


@pytest.mark.django_db
def test_the_team_default_class_falls_back_to_the_lowest_class_it_may_use(teams, priority_classes):
    from quotas.models import Quota
    from quotas.selectors import team_allowance

    assert team_allowance(team=teams["training"]).default_class.name == "training"
    Quota.objects.filter(team=teams["training"]).update(default_priority_class=None)
    assert team_allowance(team=teams["training"]).default_class.name == "inference"
    priority_classes["inference"].open_to_all_teams = False
    priority_classes["inference"].save()
    assert team_allowance(team=teams["training"]).default_class.name == "training"


@pytest.mark.django_db
def test_a_submit_stores_the_job_and_its_first_event(alice, teams, node):
    from scheduling.jobs.models import Job, JobEvent

    spec = {
        "gpus": 2,
        "env": {"A": "1"},
        "gpu_models": ["A100-80GB"],
        "max_runtime_s": 60,
        "priority": "inference",
    }
    job = _submit(alice, teams["training"], **spec)
    assert job.pk and not job._state.adding
    stored = Job.objects.get(pk=job.pk)
    assert stored.env == {"A": "1"} and stored.gpus == 2 and stored.max_runtime_s == 60
    assert stored.priority_class.name == "inference" and stored.submitted_at is not None
    assert (stored.state, stored.pending_reason_code) == ("pending", "queued")
    event = JobEvent.objects.get(job=stored)
    assert (event.from_state, event.to_state, event.code, event.actor) == ("", "pending", "submitted", alice)


@pytest.mark.django_db
def test_a_4_gpu_nvlink_job_the_scheduler_would_place_is_accepted_at_submit(alice, teams, a100):
    """Links 0-1 plus the 4-clique {1, 2, 3, 4}: a greedy grouping finds 3 linked cards, the engine finds 4, and
    submit validation asks the engine."""
    from scheduling.choices import LinkKind
    from scheduling.engine import types as eng
    from scheduling.engine.capacity import most_whole_gpus
    from scheduling.inventory.models import GpuLink

    node = _add_node("nv-01", a100, gpus=5, numa_split=8)
    cards = {g.index: g for g in node.gpus.all()}
    pairs = [(0, 1), (1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 4)]
    for a, b in pairs:
        GpuLink.objects.create(gpu_a=cards[a], gpu_b=cards[b], kind=LinkKind.NVLINK, nvlink_count=4)
    job = _submit(alice, teams["training"], gpus=4, topology="nvlink")
    assert job.state == "pending"
    with pytest.raises(
        errors.ServiceError,
        match="5 NVLink-connected GPUs on one node can never be had: the most on any node is 4",
    ):
        _submit(alice, teams["training"], gpus=5, topology="nvlink")
    # The engine places it on that node (the same rule submit asked).
    engine_node = eng.Node(
        name="nv-01",
        cpu_milli=64_000,
        memory_mib=512 * 1024,
        gpus=tuple(eng.Gpu(index=i, uuid=f"u{i}", model="A100-80GB", memory_mib=81_920) for i in range(5)),
        nvlink=frozenset(pairs),
    )
    assert most_whole_gpus(eng.Request(gpus=4, topology=eng.TopologyNeed.NVLINK), engine_node) == 4
