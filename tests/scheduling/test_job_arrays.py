"""Job arrays: written as Slurm writes them, stored as one row until placed, placed task by task by the same
cycle, held to their %N, fair against other teams' work, and cancelled whole or in part."""

from __future__ import annotations

import pytest

from scheduling.cycle import runner
from scheduling.cycle.desired_state import desired_state_for_node
from scheduling.errors import ServiceError
from scheduling.jobs.array_indexes import ArrayError, ArraySpec, TaskIndexes
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job
from scheduling.jobs.submit import job_submit

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


def submit(user, team, **spec):
    spec.setdefault("command", "python sweep.py")
    spec.setdefault("name", "sweep")
    return job_submit(submitter=user, team=team, spec=JobSpec(**spec))


def test_task_indexes_as_slurm_writes_them():
    array = ArraySpec.parse("0-999%50")
    assert (len(array.indexes), array.max_running, array.written()) == (1000, 50, "0-999%50")
    stepped = TaskIndexes.parse("0-100:10,5,200-202")
    assert stepped.first(4) == [0, 5, 10, 20] and len(stepped) == 15
    assert stepped.without({20, 5, 200, 100}).written() == "0-10:10,30-90:10,201-202"
    assert TaskIndexes.parse("7-7").written() == "7"
    for wrong, says in (
        ("", "names no tasks"),
        ("5-1", "runs backwards"),
        ("1,,2", "empty part"),
        ("x", "is not a task index"),
        ("0-9%0", "%0 would never run"),
        ("1,1", "task 1 is given twice"),
        ("0-9%x", "not a whole number"),
        ("0-9999999", "go up to"),
    ):
        with pytest.raises(ArrayError, match=says):
            ArraySpec.parse(wrong)


def test_an_array_is_one_row_until_its_tasks_are_placed(node, alice, teams):
    array = submit(alice, teams["training"], gpus=1, array="0-999%50")
    assert Job.objects.count() == 1
    assert (array.array_job_id, array.array_pending, array.array_task_count) == (array.pk, "0-999", 1000)
    assert "an array of 1,000 tasks (0-999%50)" in array.events.get().message


def test_the_cycle_places_tasks_as_rows_of_their_own_with_their_index(node, alice, teams):
    array = submit(alice, teams["training"], gpus=1, array="0-9")
    runner.cycle_run_once()
    tasks = Job.objects.filter(array_job_id=array.pk).exclude(pk=array.pk).order_by("array_task_id")
    # 8 cards, one GPU a task: 8 placed, 2 wait in the array's row, which says why.
    assert [t.array_task_id for t in tasks] == list(range(8))
    assert {t.state for t in tasks} == {"placed"}
    array.refresh_from_db()
    assert (array.state, array.array_pending, array.array_task_id) == ("pending", "8-9", None)
    assert array.pending_reason_code and array.pending_reason_code != "queued"
    first = tasks[0]
    assert first.submitted_at == array.submitted_at and first.events.get(code="array_task")
    state, _ = desired_state_for_node(node=node)
    (entry,) = [j for j in state.jobs if j["job_id"] == str(first.pk)]
    assert entry["env"]["TESSERA_ARRAY_TASK_ID"] == "0"
    assert entry["env"]["TESSERA_ARRAY_JOB_ID"] == str(array.pk)
    assert entry["env"]["TESSERA_ARRAY_TASK_COUNT"] == "10"


def test_the_last_task_placed_is_the_arrays_own_row(node, alice, teams):
    array = submit(alice, teams["training"], gpus=1, array="3,5")
    runner.cycle_run_once()
    array.refresh_from_db()
    other = Job.objects.exclude(pk=array.pk).get()
    assert (array.state, array.array_task_id, array.array_pending) == ("placed", 5, "")
    assert (other.state, other.array_task_id, other.array_job_id) == ("placed", 3, array.pk)


def test_a_throttled_array_never_runs_more_than_its_limit(node, alice, teams):
    array = submit(alice, teams["training"], gpu_memory_mib=1024, compute_pct=5, array="0-99%3")
    runner.cycle_run_once()
    # Said in the cycle that placed its first three, not one later.
    assert Job.objects.get(pk=array.pk).pending_reason_code == "array_throttled"
    for _ in range(2):
        runner.cycle_run_once()
    tasks = Job.objects.filter(array_job_id=array.pk, array_task_id__isnull=False)
    assert tasks.count() == 3 and set(tasks.values_list("state", flat=True)) == {"placed"}
    array.refresh_from_db()
    assert array.pending_reason_code == "array_throttled"
    assert (
        "At most 3 of its tasks run at once" in array.pending_reason and "97 waiting" in array.pending_reason
    )


def test_one_teams_big_array_does_not_starve_another_teams_singles(node, alice, bob, teams):
    """Training's 5,000-task array came first, at the same priority as inference's 10 singles. The 20 slices
    the node's two MPS cards hold are shared by fair share, task by task: each team within its guarantee (training
    4 GPUs, inference 1), ranked by how much of it it holds, so the singles are not left behind the sweep."""
    kind = {"gpu_memory_mib": 4096, "compute_pct": 10, "priority": "training"}
    submit(alice, teams["training"], array="0-4999", **kind)
    singles = [submit(bob, teams["inference"], name=f"eval-{i}", **kind) for i in range(10)]
    runner.cycle_run_once()
    placed = Job.objects.filter(state="placed")
    by_team = {
        slug: placed.filter(team__slug=slug).count() for slug in ("ai-lab/training", "ai-lab/inference")
    }
    # In share order (held / guarantee, ties to the earlier submit): training's k-th task ranks at k/40,
    # inference's m-th single at m/10; the 20 below 0.4 are training's 0-15 and inference's 0-3.
    assert by_team == {"ai-lab/training": 16, "ai-lab/inference": 4}, by_team
    waiting = Job.objects.get(pk=singles[4].pk)
    assert waiting.state == "pending" and waiting.queue_position is not None


def test_array_bounds_are_refused_naming_the_field(node, alice, teams, settings):
    settings.TESSERA_MAX_ARRAY_TASKS = 100
    with pytest.raises(ServiceError) as too_many:
        submit(alice, teams["training"], gpus=1, array="0-100")
    assert too_many.value.field == "array" and too_many.value.limit == 100
    assert "has 101 tasks; an array has at most 100" in too_many.value.message
    with pytest.raises(ServiceError) as wrong:
        submit(alice, teams["training"], gpus=1, array="0-x")
    assert wrong.value.field == "array" and wrong.value.code == "array_syntax"
    assert Job.objects.count() == 0


def _cancel_placed(array, user) -> int:
    """Cancel the whole array; the statements it took."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from scheduling.jobs.array_tasks import array_cancel

    with CaptureQueriesContext(connection) as statements:
        array_cancel(job=array, actor=user)
    return len(statements)


def test_an_arrays_placed_tasks_are_cancelled_together_and_give_their_cards_back(node, alice, teams):
    from django.utils import timezone

    from portal import database
    from scheduling.inventory.models import Gpu
    from scheduling.jobs.models import JobEvent, Slice

    node.last_heartbeat_at = timezone.now()  # heard from: its agent stops what is cancelled at once
    node.save(update_fields=["last_heartbeat_at"])
    few = submit(alice, teams["training"], gpus=4, array="0-1")
    runner.cycle_run_once()
    few_took = _cancel_placed(few, alice)
    many = submit(alice, teams["training"], gpus=1, array="0-7")
    runner.cycle_run_once()  # 8 placed on the node's 8 cards
    assert Job.objects.filter(array_job_id=many.pk, state="placed").count() == 8
    many_took = _cancel_placed(many, alice)
    tasks = Job.objects.filter(array_job_id=many.pk)
    assert set(tasks.values_list("state", flat=True)) == {"cancelled"} and tasks.count() == 8
    assert not Slice.objects.exists()
    assert not Gpu.objects.filter(allocated_compute_pct__gt=0).exists()
    assert not Gpu.objects.filter(allocated_memory_mib__gt=0).exists()
    ended = JobEvent.objects.filter(
        job__array_job_id=many.pk, job__array_task_id__isnull=False, to_state="cancelled"
    )
    assert ended.count() == 8 and set(ended.values_list("actor__username", "message")) == {
        ("alice", "Cancelled by alice.")
    }
    if database.postgresql():  # elsewhere the ledger is written card by card
        assert many_took == few_took  # 8 tasks or 2: the same statements


def test_cancelled_tasks_on_a_silent_node_keep_their_cards_until_it_is_heard_from(node, alice, teams):
    from datetime import timedelta

    from django.utils import timezone

    from scheduling.inventory.models import Gpu

    array = submit(alice, teams["training"], gpus=1, array="0-9")
    runner.cycle_run_once()
    node.last_heartbeat_at = timezone.now() - timedelta(hours=1)  # silent: it may run them on until its fence
    node.save(update_fields=["last_heartbeat_at"])
    _cancel_placed(array, alice)
    assert set(Job.objects.filter(array_job_id=array.pk).values_list("state", flat=True)) == {"cancelled"}
    assert Gpu.objects.filter(allocated_compute_pct=100).count() == 8
