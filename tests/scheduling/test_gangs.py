"""Multi-node jobs in the portal: ranks, addresses and a rendezvous port per placement; what each member's agent
is sent; the gang's outcome from its members' reports (all succeed, or the first failure decides)."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction
from django.test import override_settings

from scheduling.agents.reports import job_report, node_hello
from scheduling.choices import JobState
from scheduling.cycle import apply, lease
from scheduling.cycle.desired_state import desired_jobs
from scheduling.engine import types as eng
from scheduling.inventory.models import Gpu, Node
from scheduling.jobs.models import GangMember, Job
from scheduling.jobs.services import JobSpec, job_submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes(node, a100):
    """a100-01 (8 GPUs, registered at 10.0.0.1) and a100-02 (4 GPUs, no address: its name stands for it)."""
    Node.objects.filter(pk=node.pk).update(address="10.0.0.1")
    other = Node.objects.create(name="a100-02", cpu_milli=128_000, memory_mib=1024 * 1024)
    for i in range(4):
        Gpu.objects.create(node=other, index=i, uuid=f"GPU-two-{i}", model=a100, memory_mib=81920)
    return {"a": Node.objects.get(pk=node.pk), "b": other}


def place_gang(alice, teams, *, gpu: int = 0, name: str = "gang") -> tuple[Job, apply.ApplyResult]:
    """Submit a 2-node gang of one GPU per node and apply its placement on GPU `gpu` of both nodes."""
    job = job_submit(
        submitter=alice, team=teams["training"], spec=JobSpec(name=name, command="true", gpus=1, nodes=2)
    )
    placement = eng.Placement(
        str(job.pk),
        (eng.Assignment("a100-02", gpu, 81920, 1000), eng.Assignment("a100-01", gpu, 81920, 1000)),
    )
    result = apply.apply_decisions(
        decisions=eng.Decisions(placements=(placement,)), epoch=lease.epoch_issue()
    )
    job.refresh_from_db()
    return job, result


@pytest.fixture
def gang(nodes, alice, teams):
    job, _ = place_gang(alice, teams)
    assert job.state == JobState.PLACED
    return job


@pytest.fixture
def running_gang(nodes, gang):
    for n in nodes.values():
        assert job_report(node_id=n.pk, payload=report(gang, "started")).ok
    gang.refresh_from_db()
    assert gang.state == JobState.RUNNING
    return gang


def report(job, state, **extra):
    return {"job_id": str(job.pk), "attempt": job.attempt, "state": state, "pid": 42, **extra}


def entry(node, job):
    return next((e for e in desired_jobs(node=node) if e["job_id"] == str(job.pk)), None)


def test_a_placed_gang_has_ranks_in_node_name_order_its_nodes_addresses_and_one_rendezvous_port(nodes, gang):
    members = list(
        GangMember.objects.filter(job=gang).order_by("rank").values_list("node__name", "address", "port")
    )
    assert members == [("a100-01", "10.0.0.1", 29500), ("a100-02", "a100-02", None)]
    expected_members = [
        {"node": "a100-01", "address": "10.0.0.1", "slots": 1},
        {"node": "a100-02", "address": "a100-02", "slots": 1},
    ]
    assert entry(nodes["a"], gang)["gang"] == {"rank": 0, "master_port": 29500, "members": expected_members}
    assert entry(nodes["b"], gang)["gang"] == {"rank": 1, "master_port": 29500, "members": expected_members}


def test_a_job_of_one_node_has_no_gang(node, alice, teams):
    job = job_submit(
        submitter=alice, team=teams["training"], spec=JobSpec(name="one", command="true", gpus=1)
    )
    placement = eng.Placement(str(job.pk), (eng.Assignment("a100-01", 0, 81920, 1000),))
    apply.apply_decisions(decisions=eng.Decisions(placements=(placement,)), epoch=lease.epoch_issue())
    assert "gang" not in entry(node, job) and not GangMember.objects.exists()


@override_settings(TESSERA_GANG_PORT_FIRST=29600, TESSERA_GANG_PORT_LAST=29601)
def test_gangs_rendezvousing_on_one_host_get_their_own_ports_until_the_range_is_used_up(nodes, alice, teams):
    first, _ = place_gang(alice, teams, gpu=0, name="first")
    second, _ = place_gang(alice, teams, gpu=1, name="second")
    third, result = place_gang(alice, teams, gpu=2, name="third")
    ports = dict(GangMember.objects.filter(rank=0).values_list("job_id", "port"))
    assert ports == {first.pk: 29600, second.pk: 29601}
    assert third.state == JobState.PENDING and not third.slices.exists()
    assert "every rendezvous port 29600-29601 on 10.0.0.1" in result.conflicts[third.pk]
    # The database refuses a second live gang on one address and port, whoever writes it.
    with pytest.raises(IntegrityError), transaction.atomic():
        GangMember.objects.create(
            job=third, attempt=1, node=nodes["a"], rank=0, address="10.0.0.1", port=29600
        )


def test_hello_records_the_address_its_agent_reports_and_refuses_one_that_is_no_host(nodes):
    b = nodes["b"]
    assert node_hello(node_id=b.pk, payload={"address": "10.0.0.2"})["address"] == "10.0.0.2"
    assert Node.objects.get(pk=b.pk).address == "10.0.0.2"
    refused = node_hello(node_id=b.pk, payload={"address": "10.0.0.9 slots=64"})
    assert refused["address_refused"] == "10.0.0.9 slots=64"
    node_hello(node_id=b.pk, payload={"address": None})  # an agent without --address keeps what was set
    assert Node.objects.get(pk=b.pk).address == "10.0.0.2"
