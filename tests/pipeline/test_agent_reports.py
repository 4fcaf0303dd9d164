"""What agents report, applied to the database: idempotent, and refused when it is about someone else's work."""

from __future__ import annotations

import pytest

from scheduling.agents.reports.heartbeats import node_heartbeat
from scheduling.agents.reports.hello import node_hello
from scheduling.agents.reports.job_status import job_report
from scheduling.agents.reports.node_events import node_event
from scheduling.choices import GpuHealth, JobState, NodeState
from scheduling.cycle import apply, lease
from scheduling.engine import types as eng
from scheduling.inventory.models import Gpu, Node
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job, Slice
from scheduling.jobs.submit import job_submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def placed(node, alice, teams):
    """A one-GPU job placed on a100-01/gpu0."""
    job = job_submit(submitter=alice, team=teams["training"], spec=JobSpec(name="j", command="true", gpus=1))
    placement = eng.Placement(str(job.pk), (eng.Assignment("a100-01", 0, 81920, 1000),))
    apply.apply_decisions(decisions=eng.Decisions(placements=(placement,)), epoch=lease.epoch_issue())
    job.refresh_from_db()
    assert job.state == JobState.PLACED
    return job


@pytest.fixture
def running(node, placed):
    """The placed job, started."""
    job = placed
    assert job_report(node_id=node.pk, payload=report(job, "started")).changed
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job


def report(job, state, **extra):
    return {"job_id": str(job.pk), "attempt": job.attempt, "state": state, "pid": 42, **extra}


def test_a_repeated_final_report_changes_nothing(node, running):
    first = job_report(node_id=node.pk, payload=report(running, "exited", exit_code=0))
    again = job_report(node_id=node.pk, payload=report(running, "exited", exit_code=0))
    running.refresh_from_db()
    assert first.changed and again.ok and not again.changed
    assert (
        running.state == JobState.SUCCEEDED
        and running.events.filter(to_state=JobState.SUCCEEDED).count() == 1
    )


def test_it_refuses_a_report_about_another_attempt(node, running):
    outcome = job_report(node_id=node.pk, payload={**report(running, "exited", exit_code=0), "attempt": 7})
    running.refresh_from_db()
    assert not outcome.ok and "stale" in outcome.error
    assert running.state == JobState.RUNNING


def test_it_refuses_a_report_from_a_node_the_job_is_not_on(node, running, a100):
    other = Node.objects.create(name="a100-02", cpu_milli=1000, memory_mib=1024)
    outcome = job_report(node_id=other.pk, payload=report(running, "exited", exit_code=0))
    running.refresh_from_db()
    assert not outcome.ok and running.state == JobState.RUNNING


def test_it_refuses_reports_from_a_lost_node(node, running):
    Node.objects.filter(pk=node.pk).update(state=NodeState.LOST)
    outcome = job_report(node_id=node.pk, payload=report(running, "exited", exit_code=0))
    assert not outcome.ok and "lost" in outcome.error


def test_a_stop_after_preemption_requeues_it_with_its_submit_time(node, running):
    eviction = eng.Eviction(str(running.pk), "99", "preempted", 30.0)
    apply.apply_decisions(decisions=eng.Decisions(evictions=(eviction,)), epoch=lease.epoch_issue())
    submitted_at = running.submitted_at
    assert job_report(
        node_id=node.pk, payload=report(running, "stopped", exit_code=-15, reason="not_desired")
    ).changed
    running.refresh_from_db()
    assert running.state == JobState.PENDING and running.submitted_at == submitted_at
    assert running.events.last().code == "requeued"


def test_a_job_killed_for_its_runtime_fails_with_that_reason(node, running):
    job_report(node_id=node.pk, payload=report(running, "killed", exit_code=-15, reason="max_runtime"))
    running.refresh_from_db()
    assert running.state == JobState.FAILED and running.exit_code == -15
    assert running.events.last().code == "max_runtime"


def test_a_placement_on_gpus_the_node_does_not_have_is_requeued_not_failed(node, alice, teams):
    job = job_submit(submitter=alice, team=teams["training"], spec=JobSpec(name="j", command="true", gpus=1))
    placement = eng.Placement(str(job.pk), (eng.Assignment("a100-01", 1, 81920, 1000),))
    apply.apply_decisions(decisions=eng.Decisions(placements=(placement,)), epoch=lease.epoch_issue())
    job.refresh_from_db()
    job_report(node_id=node.pk, payload=report(job, "launch_failed", reason="GPU(s) not on this node: GPU-x"))
    job.refresh_from_db()
    assert job.state == JobState.PENDING and not job.slices.exists()


def test_a_prevented_interference_is_recorded_on_the_job(node, running):
    payload = {
        "kind": "prevented_neighbour_interference",
        "job_id": str(running.pk),
        "attempt": 1,
        "gpu_uuid": "GPU-test-0",
        "used_mib": 6144,
        "limit_mib": 4096,
        "pids": [43],
    }
    assert node_event(node_id=node.pk, payload=payload).ok
    event = running.events.get(code="prevented_neighbour_interference")
    assert event.data["used_mib"] == 6144 and event.from_state == event.to_state == JobState.RUNNING


def test_hello_renames_gpus_by_index_and_marks_unreported_ones_failed(node):
    gpus = [{"index": i, "uuid": f"GPU-real-{i}", "memory_total_mib": 81920} for i in range(7)]
    result = node_hello(node_id=node.pk, payload={"inventory": {"gpus": gpus}, "agent_version": "0.1.0"})
    assert result["uuid_updated"] == list(range(7)) and result["missing"] == [7]
    assert Gpu.objects.get(node=node, index=3).uuid == "GPU-real-3"
    assert Gpu.objects.get(node=node, index=7).health == GpuHealth.FAILED
    node.refresh_from_db()
    assert node.last_heartbeat_at is not None and node.sync.agent_version == "0.1.0"


def test_hello_brings_a_lost_node_back(node):
    Node.objects.filter(pk=node.pk).update(state=NodeState.LOST)
    gpus = [{"index": i, "uuid": f"GPU-test-{i}"} for i in range(8)]
    node_hello(node_id=node.pk, payload={"inventory": {"gpus": gpus}})
    node.refresh_from_db()
    assert node.state == NodeState.READY


def alive(job, **extra):
    return {"job_id": str(job.pk), "attempt": job.attempt, "state": "running", "pid": 7, **extra}


@pytest.fixture
def no_start_grace(monkeypatch):
    """The heartbeat records a missed start at once (not START_REPORT_GRACE_S after the placement)."""
    from scheduling.agents.reports import heartbeats

    monkeypatch.setattr(heartbeats, "START_REPORT_GRACE_S", 0.0)


def test_a_heartbeat_that_shows_the_job_running_records_the_start_report_that_never_came(
    node, placed, no_start_grace
):
    assert node_heartbeat(node_id=node.pk, running=[alive(placed)]) == [placed.pk]
    placed.refresh_from_db()
    started = placed.events.get(to_state=JobState.RUNNING)
    assert placed.state == JobState.RUNNING and started.message.startswith("Seen running (by its heartbeat)")
    # Level-triggered and idempotent: the next heartbeat, and the late start report itself, change nothing.
    assert node_heartbeat(node_id=node.pk, running=[alive(placed)]) == []
    late = job_report(node_id=node.pk, payload=report(placed, "started"))
    assert late.ok and not late.changed
    assert placed.events.filter(to_state=JobState.RUNNING).count() == 1


def test_a_heartbeat_moves_nothing_it_does_not_run_here(node, placed, a100, no_start_grace):
    other = Node.objects.create(name="a100-02", cpu_milli=1000, memory_mib=1024)
    garbage = ["x", {"job_id": "nope"}, {"job_id": str(placed.pk)}, None]
    stopping = alive(placed, state="stopping")
    assert node_heartbeat(node_id=other.pk, running=[alive(placed)]) == []  # placed on a100-01, not here
    assert node_heartbeat(node_id=node.pk, running=[alive(placed, attempt=placed.attempt + 1)]) == []
    assert node_heartbeat(node_id=node.pk, running=[stopping, *garbage]) == []
    assert node_heartbeat(node_id=node.pk, running="not a list") == []
    placed.refresh_from_db()
    assert placed.state == JobState.PLACED


def _interference(job) -> dict:
    return {
        "kind": "prevented_neighbour_interference",
        "job_id": str(job.pk),
        "attempt": job.attempt,
        "gpu_uuid": "GPU-test-0",
        "used_mib": 6144,
        "limit_mib": 4096,
    }


def test_an_event_sent_again_with_the_same_message_id_is_recorded_once(node, running):
    for _ in range(3):  # a reconnect, or the same message on several connections
        assert node_event(node_id=node.pk, payload=_interference(running), message_id="m-17").ok
    assert running.events.filter(code="prevented_neighbour_interference").count() == 1
    assert node_event(node_id=node.pk, payload=_interference(running), message_id="m-18").ok
    assert running.events.filter(code="prevented_neighbour_interference").count() == 2


def test_an_event_about_a_job_that_has_ended_is_refused(node, running, alice):
    from scheduling.jobs.transitions import job_cancel

    job_cancel(job=running, actor=alice)
    before = running.events.count()
    outcome = node_event(node_id=node.pk, payload=_interference(running), message_id="m-19")
    assert not outcome.ok
    assert running.events.count() == before


def test_an_event_with_a_message_id_too_long_to_store_is_refused_not_recorded_again_and_again(node, running):
    # The id is what makes a repeat a no-op; one longer than the stored id (64) could not be matched again.
    before = running.events.count()
    for _ in range(3):
        outcome = node_event(node_id=node.pk, payload=_interference(running), message_id="m-" + "7" * 100)
        assert not outcome.ok and "64" in outcome.error
    assert running.events.count() == before


def test_unenforced_mps_is_a_warning_per_real_node_and_said_once_for_simulated_ones(
    node, caplog, monkeypatch
):
    import logging

    from scheduling.agents.reports import node_events

    monkeypatch.setattr(node_events, "_simulated_mps_said", False)
    caplog.set_level(logging.INFO, logger="scheduling.agents.reports.node_events")
    detail = "nvidia-cuda-mps-control not found; MPS limits are not enforced"
    for simulated in (True, True, False, False):
        payload = {"kind": "mps_unavailable", "detail": detail, "simulated": simulated}
        assert node_event(node_id=node.pk, payload=payload).ok
    said = [(r.levelname, r.node) for r in caplog.records if "MPS" in r.getMessage()]
    assert said == [("INFO", node.name), ("WARNING", node.name), ("WARNING", node.name)]


def test_a_checked_heartbeat_records_the_node_alive_and_names_the_starts_it_missed(node, placed):
    from datetime import timedelta

    from django.utils import timezone

    from scheduling.agents.reports.heartbeats import (
        START_REPORT_GRACE_S,
        heartbeat_catch_up,
        node_heartbeat_checked,
    )
    from scheduling.cycle.models import NodeSync
    from scheduling.inventory.services import node_issue_token

    node_issue_token(node=node)
    token_hash = Node.objects.get(pk=node.pk).agent_token_hash
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=None)
    refused = node_heartbeat_checked(node_id=node.pk, token_hash="not-its-token", running=[alive(placed)])
    assert refused.token_current is False
    node.refresh_from_db()
    assert node.last_heartbeat_at is None  # nothing recorded

    NodeSync.objects.update_or_create(node=node, defaults={"desired_version": 7})
    seen = node_heartbeat_checked(node_id=node.pk, token_hash=token_hash, running=[alive(placed)])
    node.refresh_from_db()
    assert (seen.token_current, seen.desired_version, seen.behind) == (True, 7, ())
    assert node.last_heartbeat_at is not None
    # Placed just now: its start report may still be on its way, so the heartbeat does not race it ...
    assert heartbeat_catch_up(node_id=node.pk, running=[alive(placed)]) == []
    # ... but once the grace has passed, the heartbeat names it and the catch-up records the start.
    Job.objects.filter(pk=placed.pk).update(
        placed_at=timezone.now() - timedelta(seconds=START_REPORT_GRACE_S + 1)
    )
    seen = node_heartbeat_checked(node_id=node.pk, token_hash=token_hash, running=[alive(placed), "garbage"])
    assert seen.behind == (placed.pk,)
    assert heartbeat_catch_up(node_id=node.pk, running=[alive(placed)]) == [placed.pk]
    placed.refresh_from_db()
    assert placed.state == JobState.RUNNING

    Node.objects.filter(pk=node.pk).update(state=NodeState.LOST)
    assert node_heartbeat_checked(node_id=node.pk, token_hash=token_hash, running=[]).token_current
    node.refresh_from_db()
    assert node.state == NodeState.READY  # a lost node speaking again is revived, as node_heartbeat does


@pytest.mark.both_databases
def test_heartbeats_checked_together_each_get_the_answer_they_would_get_alone(node, placed, no_start_grace):
    # The agents' sockets write the heartbeats of many nodes in one statement (socket/beats.py): each must be
    # answered as if checked alone, in the order given, whatever the others are.
    from scheduling.agents.reports.heartbeats import Beat, node_heartbeats_checked
    from scheduling.cycle.models import NodeSync
    from scheduling.inventory.services import node_issue_token

    lost = Node.objects.create(name="a100-02", cpu_milli=1000, memory_mib=1024, state=NodeState.LOST)
    silent = Node.objects.create(name="a100-03", cpu_milli=1000, memory_mib=1024)
    for n in (node, lost, silent):
        node_issue_token(node=n)
    token = dict(Node.objects.values_list("pk", "agent_token_hash"))
    Node.objects.update(last_heartbeat_at=None)
    NodeSync.objects.update_or_create(node=node, defaults={"desired_version": 7})
    seen = node_heartbeats_checked(
        beats=[
            Beat(node.pk, token[node.pk], [alive(placed), {"job_id": str(10**30), "state": "running"}]),
            Beat(silent.pk, "not-its-token", [alive(placed)]),  # a rotated token: nothing recorded for it
            Beat(lost.pk, token[lost.pk], []),  # a lost node speaking again: revived
            Beat(node.pk, token[node.pk], []),  # the same node twice in one batch (a reconnect)
            Beat(10**12, "no-such-node", []),
        ]
    )
    assert [(s.token_current, s.desired_version, s.behind) for s in seen] == [
        (True, 7, (placed.pk,)),  # the start it missed; a job id out of any id's range skipped, not an error
        (False, None, ()),
        (True, None, ()),
        (True, 7, ()),
        (False, None, ()),
    ]
    beat_at = dict(Node.objects.values_list("pk", "last_heartbeat_at"))
    assert beat_at[node.pk] is not None and beat_at[lost.pk] is not None and beat_at[silent.pk] is None
    assert Node.objects.get(pk=lost.pk).state == NodeState.READY
    assert node_heartbeats_checked(beats=[]) == []


def _plan_nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", ()):
        yield from _plan_nodes(child)


def _a_wave_placed_after_the_statistics(placed, a100, count: int = 3000) -> None:
    """Statistics taken with one job placed (as before a cycle's wave), then `count` more placed, each with a card
    on another node: what the planner believes and what the tables hold part ways, as in an array's first minute."""
    from django.db import connection

    other = Node.objects.create(name="a100-09", cpu_milli=1000, memory_mib=1024)
    card = Gpu.objects.create(node=other, index=0, uuid="GPU-other-0", model=a100, memory_mib=81920)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    template = Job.objects.get(pk=placed.pk)
    clones = []
    for i in range(count):
        template.pk, template.name = None, f"wave-{i}"
        clones.append(Job(**{f.attname: getattr(template, f.attname) for f in Job._meta.concrete_fields}))
    clones = Job.objects.bulk_create(clones, batch_size=1000)
    Slice.objects.bulk_create(
        [Slice(job=j, gpu=card, memory_mib=1024, compute_pct=1) for j in clones], batch_size=1000
    )


def _indexes_used(sql: str, params) -> tuple[list[str], set[str]]:
    """The scans of the jobs' and slices' tables in the statement's plan, and the indexes of those tables it uses."""
    from django.db import connection

    tables = (Job._meta.db_table, Slice._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        (plan,) = cursor.fetchone()[0]
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = ANY(%s)", [list(tables)])
        indexes = {name for (name,) in cursor.fetchall()}
    nodes = list(_plan_nodes(plan["Plan"]))
    scans = [f"{n['Node Type']} on {n['Relation Name']}" for n in nodes if n.get("Relation Name") in tables]
    return scans, {n["Index Name"] for n in nodes if n.get("Index Name") in indexes}


def _postgresql_only():
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the statements' plans are PostgreSQL's (SQLite reads these one by one)")


def test_a_heartbeats_jobs_are_read_by_their_ids_while_thousands_are_placed(node, placed, a100):
    # While an array's 8,000 tasks were placed and starting, each heartbeat's check of the jobs it runs walked the
    # index on (state, submitted_at) over all of them (the statistics, taken before, saw almost none placed):
    # a batch of heartbeats took up to 11 s of the database's CPU. The jobs named are looked up by id.
    from django.utils import timezone

    from scheduling.agents.reports.heartbeats import Beat, _alive, heartbeats_sql

    _postgresql_only()
    _a_wave_placed_after_the_statistics(placed, a100)
    beats = [Beat(node.pk, "token", [alive(placed)]) for _ in range(50)]
    scans, used = _indexes_used(*heartbeats_sql(beats, [_alive(b.running) for b in beats], timezone.now()))
    assert scans and not any(s.startswith("Seq Scan") for s in scans), scans
    assert used == {f"{Job._meta.db_table}_pkey"}, used


def test_one_nodes_desired_state_reads_its_cards_and_their_jobs_by_id_while_thousands_are_placed(
    node, placed, a100
):
    # Each agent's acknowledgement reads its node's desired state. Asked for the node's cards of active jobs, the
    # planner joined every slice to every placed job's entry in the state index: 9 s for one node's eight cards
    # while an array's tasks started. The cards are read by the node's GPU ids, their jobs by id.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from scheduling.cycle.desired_state import desired_jobs

    _postgresql_only()
    _a_wave_placed_after_the_statistics(placed, a100)
    with CaptureQueriesContext(connection) as ctx:
        assert [int(j["job_id"]) for j in desired_jobs(node=node)] == [placed.pk]
    job_state_index = {"job_state_submitted"}
    for query in ctx.captured_queries:
        if Job._meta.db_table not in query["sql"] and Slice._meta.db_table not in query["sql"]:
            continue
        scans, used = _indexes_used(query["sql"], None)  # the statement as sent, its values inlined
        assert not used & job_state_index, (query["sql"][:300], used)
        assert f"Seq Scan on {Job._meta.db_table}" not in scans, (query["sql"][:300], scans)
