"""Multi-node jobs in the portal: ranks, addresses and a rendezvous port per placement; what each member's agent
is sent; the gang's outcome from its members' reports (all succeed, or the first failure decides)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import IntegrityError, transaction
from django.test import override_settings
from django.utils import timezone

from scheduling.agents.reports.hello import node_hello
from scheduling.agents.reports.job_status import job_report
from scheduling.choices import JobState
from scheduling.cycle import apply, lease
from scheduling.cycle.desired_state import desired_jobs
from scheduling.cycle.watchdog import lost_jobs_check, node_mark_lost
from scheduling.engine import types as eng
from scheduling.inventory.models import Gpu, Node
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import GangMember, Job
from scheduling.jobs.selectors import job_phases
from scheduling.jobs.submit import job_submit
from scheduling.realtime import groups

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


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


def test_a_gang_succeeds_only_once_every_member_exited_0(nodes, running_gang):
    job = running_gang
    assert job_report(node_id=nodes["a"].pk, payload=report(job, "exited", exit_code=0)).changed
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    waiting = job.events.get(code="gang_member_exited")
    assert waiting.message == "rank 0 on a100-01 exited with code 0; waiting for 1 more member(s)."
    assert entry(nodes["b"], job) is not None  # the member still running is still wanted

    assert job_report(node_id=nodes["b"].pk, payload=report(job, "exited", exit_code=0)).changed
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and job.exit_code == 0
    assert job.events.get(to_state=JobState.SUCCEEDED).message == (
        "All 2 members exited with code 0 (a100-01, a100-02)."
    )
    assert not job.slices.exists() and not GangMember.objects.filter(job=job).exists()
    # The first member's exit is an event within the running phase, not a phase of its own.
    assert [p["kind"] for p in job_phases(job=job, events=list(job.events.all()))] == [
        "queued",
        "starting",
        "running",
    ]


def test_a_failing_member_fails_the_gang_which_stops_the_others_and_ends_once_they_have(nodes, running_gang):
    job = running_gang
    assert job_report(node_id=nodes["b"].pk, payload=report(job, "exited", exit_code=3)).changed
    job.refresh_from_db()
    # Decided, named and stopping: no node wants it any more, so its agents stop what still runs, with grace.
    assert job.state == JobState.RUNNING and job.exit_code == 3
    decided = job.events.get(code="gang_member_failed")
    assert decided.message == (
        "rank 1 on a100-02 exited with code 3: the gang fails. Stopping the other members (rank 0 on a100-01) "
        "with 120 s grace."
    )
    assert decided.data["stopping"] == ["a100-01"] and decided.data["grace_s"] == 120
    assert entry(nodes["a"], job) is None and entry(nodes["b"], job) is None
    assert job.slices.count() == 2  # the GPUs stay held until the members have stopped

    stop = report(job, "stopped", exit_code=-15, reason="not_desired")
    assert job_report(node_id=nodes["a"].pk, payload=stop).changed
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.exit_code == 3
    failed = job.events.get(to_state=JobState.FAILED)
    assert failed.code == "gang_failed"
    assert failed.message == (
        "Failed: rank 1 on a100-02 exited with code 3. All 2 members have ended: rank 0 on a100-01 was stopped "
        "(not_desired), code -15; rank 1 on a100-02 exited with code 3."
    )
    assert (failed.data["failed_node"], failed.data["failed_rank"], failed.data["exit_code"]) == (
        "a100-02",
        1,
        3,
    )
    assert not job.slices.exists() and not GangMember.objects.filter(job=job).exists()
    # A repeated report changes nothing.
    assert not job_report(node_id=nodes["a"].pk, payload=stop).changed
    # Its timeline shows the stop of the others as a phase of its own.
    phases = job_phases(job=job, events=list(job.events.all()))
    assert [p["kind"] for p in phases] == ["queued", "starting", "running", "stopping"]
    assert phases[-1]["start"] == decided.at and phases[-1]["end"] == failed.at


def test_a_member_killed_by_its_limit_fails_the_gang_too(nodes, running_gang):
    job = running_gang
    killed = report(job, "killed", exit_code=-9, reason="max_runtime")
    assert job_report(node_id=nodes["a"].pk, payload=killed).changed
    assert job.events.get(code="gang_member_failed").message.startswith(
        "rank 0 on a100-01 was killed (max_runtime), code -9: the gang fails."
    )


def test_a_member_whose_agent_never_started_it_counts_as_stopped_when_another_fails(nodes, gang):
    job = gang
    assert job_report(node_id=nodes["b"].pk, payload=report(job, "started")).changed
    assert job_report(node_id=nodes["b"].pk, payload=report(job, "exited", exit_code=1)).changed
    job.refresh_from_db()
    # a100-01's agent had not started it: dropped from its desired state, it never will, so nothing is awaited.
    assert job.state == JobState.FAILED and job.exit_code == 1
    assert "rank 0 on a100-01 was not started" in job.events.get(to_state=JobState.FAILED).message


def test_a_member_lost_while_its_gang_runs_requeues_the_whole_gang(nodes, running_gang):
    job = running_gang
    assert job_report(node_id=nodes["a"].pk, payload=report(job, "lost")).changed
    job.refresh_from_db()
    assert job.state == JobState.PENDING and not GangMember.objects.filter(job=job).exists()
    assert entry(nodes["b"], job) is None


def test_a_node_lost_while_its_gang_is_failing_fails_the_gang_instead_of_requeueing_it(nodes, running_gang):
    job = running_gang
    job_report(node_id=nodes["b"].pk, payload=report(job, "exited", exit_code=3))
    assert node_mark_lost(node_id=nodes["a"].pk, now=timezone.now() + timedelta(hours=1)) == [job.pk]
    # Its member on the lost node has surely stopped only once the fence has passed.
    assert lost_jobs_check(now=timezone.now() + timedelta(days=1)) == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.exit_code == 3
    failed = job.events.get(to_state=JobState.FAILED)
    assert failed.code == "gang_failed" and failed.message.startswith(
        "Failed: rank 1 on a100-02 exited with code 3."
    )


def test_a_gang_being_failed_is_not_preempted(nodes, running_gang):
    job = running_gang
    job_report(node_id=nodes["b"].pk, payload=report(job, "exited", exit_code=3))
    eviction = eng.Eviction(str(job.pk), "99", "preempted", 30.0)
    result = apply.apply_decisions(decisions=eng.Decisions(evictions=(eviction,)), epoch=lease.epoch_issue())
    job.refresh_from_db()
    assert result.evicted == [] and job.state == JobState.RUNNING


def test_preempting_a_running_gang_drops_its_members_with_its_slices(nodes, running_gang):
    job = running_gang
    eviction = eng.Eviction(str(job.pk), "99", "preempted", 30.0)
    apply.apply_decisions(decisions=eng.Decisions(evictions=(eviction,)), epoch=lease.epoch_issue())
    job.refresh_from_db()
    assert job.state == JobState.PREEMPTED and not GangMember.objects.filter(job=job).exists()


def test_hello_records_the_address_its_agent_reports_and_refuses_one_that_is_no_host(nodes):
    b = nodes["b"]
    assert node_hello(node_id=b.pk, payload={"address": "10.0.0.2"})["address"] == "10.0.0.2"
    assert Node.objects.get(pk=b.pk).address == "10.0.0.2"
    refused = node_hello(node_id=b.pk, payload={"address": "10.0.0.9 slots=64"})
    assert refused["address_refused"] == "10.0.0.9 slots=64"
    node_hello(node_id=b.pk, payload={"address": None})  # an agent without --address keeps what was set
    assert Node.objects.get(pk=b.pk).address == "10.0.0.2"


def test_a_members_failure_tells_the_peers_agent_and_the_jobs_followers_only_after_commit(
    nodes, running_gang, settings, django_capture_on_commit_callbacks
):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    layer = get_channel_layer()
    followers, agent_a = (async_to_sync(layer.new_channel)() for _ in range(2))
    async_to_sync(layer.group_add)(groups.job(running_gang.pk), followers)
    async_to_sync(layer.group_add)(groups.node("a100-01"), agent_a)

    def received(channel):
        async def first():
            try:
                return await asyncio.wait_for(layer.receive(channel), 0.5)
            except TimeoutError:
                return None

        return async_to_sync(first)()

    with django_capture_on_commit_callbacks() as callbacks:
        job_report(node_id=nodes["b"].pk, payload=report(running_gang, "exited", exit_code=3))
    assert received(followers) is None and received(agent_a) is None  # nothing before the commit
    for callback in callbacks:
        callback()
    assert received(agent_a) == {"type": "desired.changed", "node": "a100-01"}
    pushed = received(followers)
    assert (pushed["type"], pushed["code"], pushed["state"]) == (
        "job.changed",
        "gang_member_failed",
        "running",
    )
