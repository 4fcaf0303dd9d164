"""/metrics tells the truth after an outage: connected follows the heartbeat, admission waits start at the last
requeue, lost and requeued jobs are counted, readiness is exported, and a failing collector leaves the rest."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from portal.metrics import metrics_body
from scheduling.choices import ActorKind, JobState
from scheduling.cycle import runner, watchdog
from scheduling.cycle.models import NodeSync
from scheduling.inventory.models import Node
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job, JobEvent
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_requeue
from scheduling.observability import exposition, job_events

pytestmark = pytest.mark.django_db


def _samples() -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(metrics_body().decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def _value(samples, name: str, **labels) -> float | None:
    found = [s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    return sum(found) if found else None


def _submit(alice, teams, **spec) -> Job:
    spec.setdefault("command", "sleep 60")
    spec.setdefault("name", "job")
    return job_submit(submitter=alice, team=teams["training"], spec=JobSpec(gpus=1, **spec))


@pytest.fixture(autouse=True)
def _no_remembered_counts():
    job_events.job_event_counts_forget()
    yield
    job_events.job_event_counts_forget()


def test_an_agent_whose_socket_never_closed_is_not_connected_once_it_has_gone_silent(node):
    # A web process killed mid-session never records the socket's close: only the heartbeat tells.
    now = timezone.now()
    NodeSync.objects.update_or_create(node=node, defaults={"connected_at": now - timedelta(minutes=5)})
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=now - timedelta(seconds=90))
    silent = _samples()
    assert _value(silent, "tessera_agent_connected", node="a100-01") == 0
    assert _value(silent, "tessera_agent_connection", node="a100-01", connection="silent") == 1
    assert _value(silent, "tessera_agent_heartbeat_age_seconds", node="a100-01") >= 90

    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now())
    heard = _samples()
    assert _value(heard, "tessera_agent_connected", node="a100-01") == 1
    assert _value(heard, "tessera_agent_connection", node="a100-01", connection="connected") == 1


def test_the_deadlines_alerts_measure_against_are_exported(node, settings):
    settings.TESSERA_NODE_LOST_AFTER_S = 50
    settings.TESSERA_AGENT_FENCE_AFTER_S = 600
    m = _samples()
    assert _value(m, "tessera_node_lost_after_seconds") == 50
    assert _value(m, "tessera_agent_fence_after_seconds") == 600
    assert _value(m, "tessera_agent_heartbeat_interval_seconds") == 5


def _wait_sum(job: Job) -> float:
    labels = {"cluster_queue": job.team.slug, "priority_class": job.priority_class.name}
    return REGISTRY.get_sample_value("kueue_admission_wait_time_seconds_sum", labels) or 0.0


def test_a_requeued_job_s_admission_wait_counts_from_its_requeue_not_from_its_submit(node, alice, teams):
    job = _submit(alice, teams)
    two_hours_ago = timezone.now() - timedelta(hours=2)
    Job.objects.filter(pk=job.pk).update(submitted_at=two_hours_ago)
    JobEvent.objects.filter(job=job).update(at=two_hours_ago)
    before = _wait_sum(job)
    runner.cycle_run_once()
    job.refresh_from_db()
    assert job.state == JobState.PLACED
    first = _wait_sum(job) - before
    assert 7190 < first < 7300  # its first placement waited since its submit

    job_requeue(job=job, actor=None, actor_kind=ActorKind.ADMIN, reason="test")
    before = _wait_sum(job)
    runner.cycle_run_once()
    job.refresh_from_db()
    # Its place in the queue is kept.
    assert job.state == JobState.PLACED and job.submitted_at == two_hours_ago
    assert _wait_sum(job) - before < 60  # the hours before the requeue (placed, running) are no wait


def test_a_cycle_task_tells_the_agents_before_it_reads_its_admission_waits(node, alice, teams, monkeypatch):
    # The waits are a query over every job placed (a second for an array's 8,000 tasks on a busy machine): the
    # cycle task runs it once the agents have their new desired states, and the waits are still observed.
    job = _submit(alice, teams)
    calls: list[str] = []
    sync, waits = runner.desired_state_sync, runner.admission_waits
    monkeypatch.setattr(runner, "desired_state_sync", lambda: calls.append("agents told") or sync())
    monkeypatch.setattr(runner, "admission_waits", lambda **kw: calls.append("waits read") or waits(**kw))
    before = _wait_sum(job)
    runner.run_cycles(holder="test")
    job.refresh_from_db()
    assert job.state == JobState.PLACED
    assert calls[:2] == ["agents told", "waits read"]
    assert _wait_sum(job) > before


def test_a_cycle_task_keeps_the_collector_paused_from_its_read_until_the_agents_are_told(
    node, alice, teams, monkeypatch
):
    # Each full collection walks the whole heap, the cycle's 20,000-job snapshot included: three of them took
    # 0.27 s of a 1.5 s cycle when only the engine paused the collector. It is on again once the agents are told.
    import gc

    from scheduling.cycle import apply

    _submit(alice, teams)
    enabled: dict[str, bool] = {}

    def noting(name, fn):
        def run(*args, **kwargs):
            enabled[name] = gc.isenabled()
            return fn(*args, **kwargs)

        return run

    monkeypatch.setattr(runner, "snapshot_from_db", noting("read", runner.snapshot_from_db))
    monkeypatch.setattr(runner, "apply_decisions", noting("apply", runner.apply_decisions))
    monkeypatch.setattr(apply, "jobs_place", noting("placements", apply.jobs_place))
    monkeypatch.setattr(runner, "desired_state_sync", noting("agents told", runner.desired_state_sync))
    monkeypatch.setattr(runner, "admission_waits", noting("metrics", runner.admission_waits))
    assert gc.isenabled()
    runner.run_cycles(holder="test")
    assert enabled == {
        "read": False,
        "apply": False,
        "placements": False,
        "agents told": False,
        "metrics": True,
    }
    assert gc.isenabled()


def _lose_node_and_requeue(node, settings) -> None:
    settings.TESSERA_NODE_LOST_AFTER_S = 30
    now = timezone.now()
    at = now - timedelta(seconds=60)
    while at < now:
        watchdog.watch_resumed_at(now=at)
        at += timedelta(seconds=10)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=now - timedelta(seconds=31))
    watchdog.nodes_check(now=now)
    watchdog.lost_jobs_check(now=now + timedelta(days=1))


def test_jobs_lost_with_their_node_and_requeued_are_counted(node, alice, teams, settings, fresh_watch):
    m = _samples()
    lost_before = _value(m, "tessera_jobs_lost_total", reason="node_lost") or 0
    requeued_before = _value(m, "tessera_jobs_requeued_total", reason="requeued_node_lost") or 0
    job = _submit(alice, teams)
    runner.cycle_run_once()
    _lose_node_and_requeue(node, settings)
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    m = _samples()
    assert _value(m, "tessera_jobs_lost_total", reason="node_lost") == lost_before + 1
    assert _value(m, "tessera_jobs_requeued_total", reason="requeued_node_lost") == requeued_before + 1
    # A submit is not a requeue.
    assert _value(m, "tessera_jobs_requeued_total", reason="submitted") is None


def test_settled_events_are_remembered_and_newer_ones_counted_on_top(
    node, alice, teams, settings, fresh_watch
):
    job = _submit(alice, teams)
    runner.cycle_run_once()
    _lose_node_and_requeue(node, settings)
    old = timezone.now() - timedelta(seconds=job_events.SETTLED_S + 60)
    JobEvent.objects.filter(job=job).update(at=old)
    first = job_events.job_event_counts()
    assert job_events._tally.settled_upto_id > 0
    assert first[(JobState.LOST, "node_lost")] >= 1
    # A second loss after the first was settled: counted on top, never twice.
    Node.objects.filter(pk=node.pk).update(state="ready", last_heartbeat_at=timezone.now())
    runner.cycle_run_once()
    job.refresh_from_db()
    assert job.state == JobState.PLACED
    _lose_node_and_requeue(node, settings)
    again = job_events.job_event_counts()
    assert again[(JobState.LOST, "node_lost")] == first[(JobState.LOST, "node_lost")] + 1
    assert job_events.job_event_counts() == again


@override_settings(REDIS_URL="redis://127.0.0.1:9/0")
def test_metrics_say_what_readyz_says_when_redis_is_down(node):
    m = _samples()
    assert _value(m, "tessera_ready") == 0
    assert _value(m, "tessera_readiness_check", check="redis") == 0
    assert _value(m, "tessera_readiness_check", check="database") == 1


def test_a_collector_that_fails_leaves_the_others_and_says_so(node, monkeypatch):
    def broken():
        raise RuntimeError("the database went away")

    monkeypatch.setattr(exposition._STATE_COLLECTORS["scheduler"], "collect", broken)
    m = _samples()
    assert _value(m, "tessera_metrics_collector_success", collector="scheduler") == 0
    assert _value(m, "tessera_metrics_collector_success", collector="agents") == 1
    assert "tessera_scheduler_epoch" not in m
    assert _value(m, "tessera_agent_heartbeat_interval_seconds") == 5
    assert _value(m, "tessera_readiness_check", check="database") == 1
