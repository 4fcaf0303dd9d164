"""The history rollups: what the recorder writes each minute, that a minute is written once, the 5-minute GPU
windows, daily partitions and their pruning, hourly GPU-seconds equal to the usage API's, the queue-time rollup
(rolled once whatever the runs, read with the window's partial hours from the jobs), and the selectors' figures on
known rows."""

from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduling.agents.live_metrics import live_metrics_store
from scheduling.choices import ActorKind, JobState
from scheduling.history import partitions, recorder
from scheduling.history.models import (
    ClusterMinute,
    GpuEvent,
    GpuFiveMinute,
    ModelMinute,
    NodeMinute,
    TeamMinute,
    UsageHour,
    WaitHour,
    wait_bucket,
    wait_quantile,
)
from scheduling.history.selectors.capacity import capacity_series, queue_series
from scheduling.history.selectors.nodes import gpu_series
from scheduling.history.selectors.teams import quota_satisfaction
from scheduling.history.selectors.usage import usage_totals
from scheduling.history.selectors.waits import wait_series, wait_stats
from scheduling.history.selectors.windows import Window
from scheduling.inventory.models import Gpu
from scheduling.jobs.ledger import slice_allocate
from scheduling.jobs.models import Job
from scheduling.jobs.transitions import job_transition

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def _sample(node, utils: dict[int, float]) -> None:
    gpus = [
        {
            "index": i,
            "uuid": f"GPU-test-{i}",
            "util_pct": u,
            "memory_used_mib": 1000 * (i + 1),
            "power_w": 100.0,
            "temperature_c": 40 + i,
            "sm_clock_mhz": 1400,
            "ecc_uncorrected_volatile": 0,
        }
        for i, u in utils.items()
    ]
    async_to_sync(live_metrics_store)(node_name=node.name, sampled_at=T0.timestamp(), gpus=gpus)


def _run(job, gpu, *, memory_mib, compute_pct):
    job_transition(job=job, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER)
    slice_allocate(job=job, gpu=gpu, memory_mib=memory_mib, compute_pct=compute_pct)
    job_transition(job=job, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT)


def test_a_minute_is_recorded_once_with_the_cluster_as_it_stands(alice, teams, node, submit):
    job = submit(alice, teams["training"], gpu_memory_mib=20480, compute_pct=25, gpus=0)
    _run(job, Gpu.objects.get(node=node, index=6), memory_mib=20480, compute_pct=25)
    submit(alice, teams["training"], gpus=2)  # waits
    _sample(node, {0: 50.0, 6: 2.0})

    assert recorder.history_record(now=T0 + timedelta(seconds=7))
    assert not recorder.history_record(now=T0 + timedelta(seconds=40))  # the same minute: nothing twice

    row = NodeMinute.objects.get(node_id=node.pk)
    assert (row.at, row.gpus, row.allocated_milli, row.memory_allocated_mib) == (T0, 8, 250, 20480)
    assert row.util_pct == 26.0  # the mean of its two sampled cards
    model = ModelMinute.objects.get()
    # 8 cards ready, a quarter allocated, 0.52 used, 7 wholly free, 0.75 stranded on the shared card.
    assert (
        model.ready_gpus,
        model.allocated_milli,
        model.used_milli,
        model.free_gpus,
        model.stranded_milli,
    ) == (
        8,
        250,
        520,
        7,
        750,
    )
    team = TeamMinute.objects.get(team_id=teams["training"].pk)
    assert (team.guaranteed_milli, team.held_milli, team.pending_jobs, team.pending_milli) == (
        4000,
        250,
        1,
        2000,
    )
    assert ClusterMinute.objects.get().pending_jobs == 1
    # The slice's card ran at 2 %: a minute of a quarter GPU sat idle.
    assert UsageHour.objects.get().idle_gpu_seconds == pytest.approx(15.0)


def test_a_gpu_window_holds_the_mean_of_its_minutes(node):
    _sample(node, {0: 30.0})
    recorder.history_record(now=T0)
    _sample(node, {0: 90.0})
    recorder.history_record(now=T0 + timedelta(minutes=1))
    row = GpuFiveMinute.objects.get(gpu_id=Gpu.objects.get(node=node, index=0).pk)
    assert (row.at, row.samples, row.util_pct_sum, row.temperature_c_max) == (T0, 2, 120.0, 40)
    series = gpu_series(node_id=node.pk, w=Window("1h", T0, T0 + timedelta(hours=1), 300))
    assert series[0]["index"] == 0
    assert series[0]["util_pct"][0] == 60.0
    assert series[0]["util_pct"][1] is None  # a window with no sample is a gap, not a zero


def test_days_are_partitions_and_pruning_drops_what_is_past_retention(node):
    if not partitions.partitioned():
        pytest.skip("partitions are PostgreSQL's")
    for days_ago in (40, 31, 1):
        recorder.history_record(now=T0 - timedelta(days=days_ago))
    assert NodeMinute.objects.count() == 3
    gone = partitions.history_prune(now=T0, retention_days=30)
    assert gone["history_node_minute"] == 2  # two days' partitions dropped whole
    assert NodeMinute.objects.count() == 1
    assert ClusterMinute.objects.count() == 1  # the small tables pruned by delete
    days = partitions.partition_days(NodeMinute)
    assert T0.date() - timedelta(days=1) in days and T0.date() + timedelta(days=2) in days


def test_hourly_gpu_seconds_equal_the_usage_api_to_the_gpu_second(as_admin, alice, teams, node, submit):
    job = submit(alice, teams["training"], gpus=2)
    _run(job, Gpu.objects.get(node=node, index=0), memory_mib=81920, compute_pct=100)
    now = datetime.now(UTC)
    Job.objects.filter(pk=job.pk).update(started_at=now - timedelta(minutes=50))
    job.events.filter(to_state=JobState.PLACED).update(at=now - timedelta(minutes=50))
    recorder.usage_hours_roll(now=now)
    hourly = sum(UsageHour.objects.values_list("gpu_seconds", flat=True))
    api = as_admin.get(
        f"/api/v1/usage/?group_by=team&until={now.isoformat().replace('+00:00', 'Z')}"
        f"&since={(now - timedelta(hours=2)).isoformat().replace('+00:00', 'Z')}"
    ).json()
    assert hourly == pytest.approx(api[0]["gpu_hours"] * 3600, abs=1.0)
    assert hourly == pytest.approx(2 * 50 * 60, abs=1.0)
    by_model = usage_totals(since=now - timedelta(hours=2), until=now, group="model")
    assert by_model[0]["model"] == "A100-80GB"


def _started(submit, user, team, *, at: datetime, wait_s: float) -> Job:
    job = submit(user, team, gpus=1)
    Job.objects.filter(pk=job.pk).update(submitted_at=at - timedelta(seconds=wait_s), started_at=at)
    return job


def test_the_wait_histogram_reads_a_quantile_within_10_percent():
    for wait in (0.2, 1, 7, 95, 3600, 86400 * 3, 86400 * 29):
        assert wait_quantile({wait_bucket(wait): 1}) == pytest.approx(wait, rel=0.1, abs=0.5)
    assert wait_quantile({}) is None
    assert wait_bucket(86400 * 400) == wait_bucket(86400 * 31)  # past 30 days: one last bucket


def test_the_waits_roll_is_idempotent_and_the_window_ends_come_from_the_jobs(alice, bob, teams, node, submit):
    training, inference = teams["training"], teams["inference"]
    for k, wait in enumerate([10, 20, 30, 40, 1000]):  # in T0's hour, rolled
        _started(submit, alice, training, at=T0 + timedelta(minutes=10 * k), wait_s=wait)
    _started(submit, bob, inference, at=T0 + timedelta(minutes=5), wait_s=60)
    _started(submit, alice, training, at=T0 + timedelta(hours=2, minutes=5), wait_s=500)  # the open hour

    assert recorder.waits_roll(now=T0 + timedelta(hours=2, minutes=10), since=T0 - timedelta(hours=1)) == 7
    rows = sorted(WaitHour.objects.values_list("hour", "team_id", "bucket", "jobs", "wait_s_sum"))
    # Again (over the same hours, or from the hour before the newest rolled): the same rows, nothing twice.
    assert recorder.waits_roll(now=T0 + timedelta(hours=2, minutes=10), since=T0 - timedelta(hours=1)) == 7
    assert recorder.waits_roll(now=T0 + timedelta(hours=2, minutes=15)) == 1
    assert sorted(WaitHour.objects.values_list("hour", "team_id", "bucket", "jobs", "wait_s_sum")) == rows
    assert sum(r[3] for r in rows) == 7

    # Closed hours are read from the rollup, not the jobs: rewriting the jobs' waits changes nothing there.
    Job.objects.filter(started_at__lt=T0 + timedelta(hours=1)).update(submitted_at=T0 - timedelta(days=1))
    until = T0 + timedelta(hours=2, minutes=30)
    with CaptureQueriesContext(connection) as queries:
        stats = wait_stats(since=T0, until=until, team_ids=[training.pk])
    assert len(queries) == 3  # the newest hour rolled, the rollup's sums, the jobs of the open hour
    assert (stats["jobs"], stats["wait_mean_s"]) == (6, round(1600 / 6, 1))  # the mean is exact
    assert stats["wait_p95_s"] == pytest.approx(1000, rel=0.1)
    alone = wait_stats(since=T0, until=T0 + timedelta(hours=1), team_ids=[training.pk])
    assert (alone["jobs"], alone["wait_mean_s"]) == (5, 220.0)
    assert alone["wait_p95_s"] == pytest.approx(1000, rel=0.1)
    # A window that starts inside an hour reads that hour's part from the jobs (rewritten: a day's wait).
    part = wait_stats(since=T0 + timedelta(minutes=35), until=until, team_ids=[training.pk])
    assert (part["jobs"], part["wait_mean_s"]) == (2, (86400 + 2400 + 500) / 2)
    everyone = wait_series(w=Window("1d", T0, until, 3600), step_s=3600)
    assert everyone["jobs"] == 7
    assert everyone["series"]["started_jobs"][:3] == [6, None, 1]
    assert everyone["series"]["wait_mean_s"][0] == round(1160 / 6, 3)
    assert wait_stats(since=T0, until=until, team_ids=[]) == {
        "jobs": 0,
        "wait_mean_s": None,
        "wait_p95_s": None,
    }

    # The roll replaces an hour whole: a job that moved out of it leaves no trace behind.
    Job.objects.filter(team=inference).update(started_at=T0 + timedelta(hours=2, minutes=6))
    recorder.waits_roll(now=T0 + timedelta(hours=2, minutes=20), since=T0)
    assert WaitHour.objects.filter(team_id=inference.pk).get().hour == T0 + timedelta(hours=2)
    assert sum(WaitHour.objects.values_list("jobs", flat=True)) == 7
    rows = WaitHour.objects.count()
    assert (
        partitions.history_prune(now=T0 + timedelta(days=31), retention_days=30)["history_wait_hour"] == rows
    )


def test_satisfaction_and_inversions_on_known_rows(teams):
    team = teams["training"]
    # Owed min(4, held + pending) each minute: held 2 of 4 owed, then 4 of 4.
    TeamMinute.objects.bulk_create(
        [
            TeamMinute(
                at=T0,
                team_id=team.pk,
                guaranteed_milli=4000,
                held_milli=2000,
                borrowed_milli=0,
                pending_jobs=1,
                pending_milli=4000,
                running_jobs=1,
            ),
            TeamMinute(
                at=T0 + timedelta(minutes=1),
                team_id=team.pk,
                guaranteed_milli=4000,
                held_milli=6000,
                borrowed_milli=2000,
                pending_jobs=0,
                pending_milli=0,
                running_jobs=2,
            ),
        ]
    )
    assert quota_satisfaction(team_id=team.pk, since=T0, until=T0 + timedelta(hours=1)) == 0.75


def test_series_are_one_query_each_whatever_the_window(node):
    for minute in range(30):
        recorder.history_record(now=T0 + timedelta(minutes=minute))
    w = Window("1h", T0, T0 + timedelta(hours=1), 300)
    with CaptureQueriesContext(connection) as queries:
        series = capacity_series(w=w)
    assert len(queries) == 2  # the rows, the model names
    assert series[0]["ready_gpus"][:6] == [8.0] * 6 and series[0]["ready_gpus"][6] is None
    assert queue_series(w=w)["pending_jobs"][0] == 0.0


def test_xid_events_are_kept_one_row_each(node):
    recorder.gpu_events_record(node_id=node.pk, gpus=[{"uuid": "GPU-test-3", "xid_events": [79, 48]}])
    assert sorted(GpuEvent.objects.values_list("code", flat=True)) == [48, 79]
    assert GpuEvent.objects.filter(gpu_id=Gpu.objects.get(node=node, index=3).pk).count() == 2
