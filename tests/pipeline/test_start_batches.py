"""Start reports recorded together (job_starts_record): each answered as job_report answers it alone, in a number of
statements that does not grow with the batch; and a cycle's lock on its nodes never holds up their heartbeats."""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from scheduling import lock_objects
from scheduling.agents.reports.heartbeats import node_heartbeat_checked
from scheduling.agents.reports.job_status import StartReport, job_report, job_starts_record
from scheduling.choices import JobState, NodeState
from scheduling.cycle import apply, lease
from scheduling.engine import types as eng
from scheduling.inventory.models import Gpu, Node
from scheduling.inventory.services import _hash_token, node_issue_token, node_set_state
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.submit import job_submit
from scheduling.notifications.models import Notification
from scheduling.notifications.services import notification_settings_save

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


@pytest.fixture
def second_node(a100):
    node = Node.objects.create(name="a100-02", cpu_milli=128_000, memory_mib=1024 * 1024)
    for i in range(8):
        Gpu.objects.create(node=node, index=i, uuid=f"GPU-two-{i}", model=a100, memory_mib=81920, numa_node=0)
    return node


def _placed(people, teams, where: list[tuple[str, int]]):
    """One single-GPU job per (node, gpu index), placed there by one cycle; alternately alice's and bob's."""
    jobs = [
        job_submit(
            submitter=people[k % len(people)],
            team=teams["training"] if k % 2 == 0 else teams["inference"],
            spec=JobSpec(name=f"j{k}", command="true", gpus=1),
        )
        for k in range(len(where))
    ]
    placements = tuple(
        eng.Placement(str(j.pk), (eng.Assignment(name, index, 81920, 1000),))
        for j, (name, index) in zip(jobs, where, strict=True)
    )
    result = apply.apply_decisions(decisions=eng.Decisions(placements=placements), epoch=lease.epoch_issue())
    assert len(result.placed) == len(jobs), result.conflicts
    for j in jobs:
        j.refresh_from_db()
    return jobs


def _started(job, **extra):
    return {"job_id": str(job.pk), "attempt": job.attempt, "state": "started", "pid": 40 + job.pk, **extra}


def _token(node) -> str:
    return node_issue_token(node=node)


def test_a_batch_of_starts_moves_each_to_running_as_one_report_would(node, second_node, alice, bob, teams):
    notification_settings_save(
        user=alice, job_events=["start"], email=False, webhook_url="https://hooks.example/a"
    )
    jobs = _placed([alice, bob], teams, [("a100-01", 0), ("a100-01", 1), ("a100-02", 0), ("a100-02", 1)])
    _token(node), _token(second_node)
    node.refresh_from_db(), second_node.refresh_from_db()
    on = {"a100-01": node, "a100-02": second_node}
    nodes_of = [on["a100-01"], on["a100-01"], on["a100-02"], on["a100-02"]]
    reports = [
        StartReport(n.pk, n.agent_token_hash, _started(j)) for j, n in zip(jobs, nodes_of, strict=True)
    ]
    reports[1] = StartReport(node.pk, node.agent_token_hash, _started(jobs[1], adopted=True))

    outcomes = job_starts_record(reports=reports)

    assert [(o.ok, o.changed) for o in outcomes] == [(True, True)] * 4
    for job, n in zip(jobs, nodes_of, strict=True):
        job.refresh_from_db()
        event = job.events.get(to_state=JobState.RUNNING)
        assert job.state == JobState.RUNNING and job.started_at is not None
        assert event.actor_kind == "agent" and event.code == "started" and event.from_state == JobState.PLACED
        assert event.data == {"node": n.name, "attempt": job.attempt, "pid": 40 + job.pk}
    assert (
        jobs[0].events.get(to_state=JobState.RUNNING).message
        == f"Started on a100-01 (pid {40 + jobs[0].pk})."
    )
    assert jobs[1].events.get(to_state=JobState.RUNNING).message.startswith("Re-adopted on a100-01")
    # Alice asked to hear of her jobs' starts (jobs 0 and 2); bob did not.
    told = sorted(Notification.objects.filter(kind="start").values_list("job_id", flat=True))
    assert told == sorted([jobs[0].pk, jobs[2].pk])


@pytest.mark.postgresql_only("set-based writes; SQLite, in process, takes a statement per row")
def test_the_statements_a_batch_takes_do_not_grow_with_it(node, alice, bob, teams):
    jobs = _placed([alice, bob], teams, [("a100-01", i) for i in range(6)])
    _token(node)
    node.refresh_from_db()

    def statements(batch) -> int:
        with CaptureQueriesContext(connection) as q:
            outcomes = job_starts_record(
                reports=[StartReport(node.pk, node.agent_token_hash, _started(j)) for j in batch]
            )
        assert all(o.changed for o in outcomes)
        return len(q.captured_queries)

    assert statements(jobs[:1]) == statements(jobs[1:])


def test_each_report_in_a_batch_gets_the_answer_it_would_get_alone(node, second_node, alice, bob, teams):
    a, b, c, d = _placed(
        [alice, bob], teams, [("a100-01", 0), ("a100-01", 1), ("a100-01", 2), ("a100-02", 0)]
    )
    assert job_report(node_id=node.pk, payload=_started(c)).changed  # c runs already
    _token(node), _token(second_node)
    node.refresh_from_db(), second_node.refresh_from_db()
    rotated = StartReport(second_node.pk, _hash_token("tna_an-old-token"), _started(d))
    reports = [
        StartReport(
            node.pk, node.agent_token_hash, {**_started(a), "attempt": a.attempt + 3}
        ),  # stale attempt
        StartReport(node.pk, node.agent_token_hash, {**_started(b), "job_id": "999999"}),  # no such job
        StartReport(node.pk, node.agent_token_hash, _started(c)),  # running already
        StartReport(node.pk, node.agent_token_hash, _started(d)),  # placed on the other node
        StartReport(node.pk, node.agent_token_hash, {"state": "started"}),  # malformed
        rotated,  # the connection's token is no longer the node's
        StartReport(node.pk, node.agent_token_hash, _started(b)),
        StartReport(node.pk, node.agent_token_hash, _started(b)),  # the same report twice
    ]
    alone = []
    for r in reports[:5]:
        with transaction.atomic():
            sid = transaction.savepoint()
            alone.append(job_report(node_id=r.node_id, payload=r.payload))
            transaction.savepoint_rollback(sid)

    together = job_starts_record(reports=reports)

    assert together[:5] == alone, (together, alone)
    assert together[5] is None
    assert [(o.ok, o.changed) for o in together[6:]] == [(True, True), (True, False)]
    for job, state in ((a, JobState.PLACED), (b, JobState.RUNNING), (d, JobState.PLACED)):
        job.refresh_from_db()
        assert job.state == state
    assert b.events.filter(to_state=JobState.RUNNING).count() == 1


def test_a_lost_nodes_starts_are_refused_in_a_batch_as_alone(node, alice, bob, teams):
    (job,) = _placed([alice], teams, [("a100-01", 0)])
    _token(node)
    node.refresh_from_db()
    Node.objects.filter(pk=node.pk).update(state=NodeState.LOST)
    (outcome,) = job_starts_record(reports=[StartReport(node.pk, node.agent_token_hash, _started(job))])
    assert not outcome.ok and "lost" in outcome.error
    job.refresh_from_db()
    assert job.state == JobState.PLACED


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgresql_only("row locks; SQLite takes one writer at a time")
def test_a_cycle_holding_its_nodes_never_holds_up_their_heartbeats_but_does_hold_a_state_change(
    node, admin_user
):
    _token(node)
    node.refresh_from_db()
    held, release = threading.Event(), threading.Event()

    def cycle_apply():  # what apply_decisions takes on the nodes it places on, held as a long apply holds it
        try:
            with transaction.atomic():
                lock_objects.nodes_for_placement(names=[node.name])
                held.set()
                release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=cycle_apply)
    thread.start()
    try:
        assert held.wait(5)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")
        # Had it waited for the cycle's commit, it would have failed on the 2 s lock timeout, as the cordon does.
        seen = node_heartbeat_checked(node_id=node.pk, token_hash=node.agent_token_hash, running=[])
        assert seen.token_current
        with pytest.raises(OperationalError, match="lock timeout"):  # a cordon waits for the cycle's commit
            node_set_state(node=node, state=NodeState.CORDONED, actor=admin_user, reason="maintenance")
    finally:
        release.set()
        thread.join()
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    node.refresh_from_db()
    assert node.last_heartbeat_at is not None and node.state == NodeState.READY


def test_a_start_report_with_a_bad_field_is_refused_alone_and_the_rest_of_its_batch_lands(
    node, alice, bob, teams
):
    good, bad = _placed([alice, bob], teams, [("a100-01", 0), ("a100-01", 1)])
    _token(node)
    node.refresh_from_db()
    reports = [
        StartReport(node.pk, node.agent_token_hash, _started(bad, exit_code="not a number")),
        StartReport(node.pk, node.agent_token_hash, _started(good)),
    ]
    refused, landed = job_starts_record(reports=reports)
    assert not refused.ok and "ValueError" in refused.error and not refused.retry
    assert landed.ok and landed.changed
    good.refresh_from_db(), bad.refresh_from_db()
    assert good.state == JobState.RUNNING and bad.state == JobState.PLACED
