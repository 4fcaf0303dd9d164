"""Incremental passes: between full cycles, a long queue's head and its new jobs are placed on what is free
without re-scoring the rest; a full cycle still runs on its interval and keeps the queue's order."""

from __future__ import annotations

import pytest

from scheduling.cycle import runner
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_transition

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


def submit(user, team, **spec):
    spec.setdefault("command", "python train.py")
    spec.setdefault("name", "job")
    return job_submit(submitter=user, team=team, spec=JobSpec(**spec))


@pytest.fixture
def long_queue(settings, node, alice, teams):
    """A queue the settings call long (3 or more waiting), with incremental passes over its first 2: two 3-GPU
    jobs run on the node's 8 cards, four more wait behind them, ranked by a full cycle; 2 cards stay free."""
    settings.TESSERA_INCREMENTAL_MIN_PENDING = 3
    settings.TESSERA_INCREMENTAL_QUEUE_DEPTH = 2
    settings.TESSERA_FULL_CYCLE_INTERVAL_S = 3600
    jobs = [submit(alice, teams["training"], name=f"big-{i}", gpus=3) for i in range(6)]
    assert runner.cycle_kind() == "full"  # no full cycle yet
    report = runner.cycle_run_once(kind=runner.cycle_kind())
    assert (report.kind, report.pending, report.placed) == ("full", 6, 2)
    waiting = list(Job.objects.filter(state="pending").order_by("queue_position"))
    assert [j.queue_position for j in waiting] == [1, 2, 3, 4]
    return jobs[0], waiting


def positions() -> dict[int, int | None]:
    return dict(Job.objects.filter(state="pending").values_list("pk", "queue_position"))


def test_a_new_job_is_placed_by_an_incremental_pass_that_reads_only_the_queues_head(long_queue, alice, teams):
    _, waiting = long_queue
    before = positions()
    small = submit(alice, teams["training"], name="small", gpus=1)
    assert runner.cycle_kind() == "incremental"
    report = runner.cycle_run_once(kind=runner.cycle_kind())
    # It saw the first two of the queue and the new job, not the two behind them.
    assert (report.kind, report.pending, report.placed) == ("incremental", 3, 1)
    small.refresh_from_db()
    assert small.state == "placed"
    # The queue's order is the full cycle's: no position rewritten, none given.
    assert positions() == {pk: pos for pk, pos in before.items()}
    for job in waiting:
        job.refresh_from_db()
        assert job.pending_reason_code not in ("", "queued")


def test_a_job_that_does_not_fit_waits_with_a_reason_and_no_position_until_the_full_cycle(
    long_queue, settings, alice, teams
):
    late = submit(alice, teams["training"], name="late", gpus=3)
    report = runner.cycle_run_once(kind=runner.cycle_kind())
    assert (report.kind, report.placed) == ("incremental", 0)
    late.refresh_from_db()
    assert late.queue_position is None and late.pending_reason_code not in ("", "queued")
    settings.TESSERA_FULL_CYCLE_INTERVAL_S = 0  # the full cycle is due
    assert runner.cycle_kind() == "full"
    report = runner.cycle_run_once(kind=runner.cycle_kind())
    assert (report.kind, report.pending) == ("full", 5)
    late.refresh_from_db()
    assert late.queue_position == 5


def test_freed_cards_go_to_the_queues_head_in_an_incremental_pass(long_queue):
    first, waiting = long_queue
    first.refresh_from_db()
    for state in ("running", "succeeded"):  # as its agent reports it: its cards are free again
        job_transition(job=first, to_state=state, actor_kind="agent")
    report = runner.cycle_run_once(kind=runner.cycle_kind())
    assert (report.kind, report.placed) == ("incremental", 1)
    head = waiting[0]
    head.refresh_from_db()
    assert head.state == "placed"


def test_a_short_queue_always_gets_full_cycles(settings, node, alice, teams):
    settings.TESSERA_FULL_CYCLE_INTERVAL_S = 3600
    submit(alice, teams["training"], gpus=1)
    assert runner.cycle_run_once(kind=runner.cycle_kind()).kind == "full"
    submit(alice, teams["training"], gpus=1)
    assert runner.cycle_kind() == "full"  # 1 waiting at the last full cycle: below the minimum (2,000)


def test_a_throttled_arrays_next_task_starts_in_an_incremental_pass(long_queue, settings, alice, teams):
    """A %1 array is ranked after the whole queue while its one task runs; that task ending must let the next one
    start in the incremental pass its end asks for, not at the next full cycle."""
    array = submit(alice, teams["training"], name="sweep", gpus=1, array="0-9%1")
    settings.TESSERA_FULL_CYCLE_INTERVAL_S = 0
    assert runner.cycle_run_once(kind=runner.cycle_kind()).kind == "full"
    settings.TESSERA_FULL_CYCLE_INTERVAL_S = 3600
    (task,) = Job.objects.filter(array_job_id=array.pk, state="placed")
    array.refresh_from_db()
    assert array.queue_position > settings.TESSERA_INCREMENTAL_QUEUE_DEPTH  # held back: ranked last
    for state in ("running", "succeeded"):
        job_transition(job=task, to_state=state, actor_kind="agent")
    report = runner.cycle_run_once(kind=runner.cycle_kind())
    assert (report.kind, report.placed) == ("incremental", 1)
    assert Job.objects.filter(array_job_id=array.pk, state="placed").count() == 1
