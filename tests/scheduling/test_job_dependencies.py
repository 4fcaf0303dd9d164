"""Job dependencies as sbatch users write them (afterok, afterany, afternotok, singleton), for jobs and for whole
arrays: a job waits out of the queue saying for what, starts once it is met, ends as dependency_never_satisfied
(its owner told) once it can never be, and a dependency that cannot be met is refused at submit."""

from __future__ import annotations

import pytest
from django.core import mail

from scheduling.choices import ActorKind, JobState
from scheduling.cycle import runner
from scheduling.errors import ServiceError
from scheduling.jobs.documents import SpecError
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job
from scheduling.jobs.spec import spec_from_mapping
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_transition
from scheduling.notifications.services import notification_settings_save, notifications_deliver_due

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


def submit(user, team, **spec):
    spec.setdefault("command", "python step.py")
    spec.setdefault("name", "step")
    spec.setdefault("gpus", 1)
    return job_submit(submitter=user, team=team, spec=JobSpec(**spec))


def end(job, state: str) -> None:
    """The job runs on its agent, then ends as `state`."""
    job = Job.objects.get(pk=job.pk)
    if job.state == JobState.PLACED:
        job = job_transition(job=job, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT)
    job_transition(job=job, to_state=state, actor_kind=ActorKind.AGENT)


def fresh(job) -> Job:
    return Job.objects.get(pk=job.pk)


def test_sbatch_dependency_words_and_the_list_form_are_read_alike():
    written = spec_from_mapping(
        {
            "name": "e",
            "command": "x",
            "gpus": 1,
            "depends_on": "afterok:12:13,afterany:14,afternotok:15,singleton",
        }
    ).spec
    assert written.depends_on == ((12, "succeeded"), (13, "succeeded"), (14, "ended"), (15, "failed"))
    assert written.singleton is True
    listed = spec_from_mapping(
        {"name": "e", "command": "x", "gpus": 1, "depends_on": [{"job": 12}, {"job": "14", "when": "ended"}]}
    ).spec
    assert listed.depends_on == ((12, "succeeded"), (14, "ended"))
    for wrong, says in (
        ("after:12", "is not one of afterok"),
        ("afterok", "is not one of afterok"),
        ("afterok:x", "'x' is not a job id"),
        ("afterok:12,afterany:12", "names job 12 twice"),
        ([{"job": 1, "when": "soon"}], "when must be one of succeeded, ended, failed"),
    ):
        with pytest.raises(SpecError, match=says) as refused:
            spec_from_mapping({"name": "e", "command": "x", "gpus": 1, "depends_on": wrong})
        assert refused.value.field == "depends_on"


def test_afterok_waits_out_of_the_queue_saying_why_then_starts(node, alice, teams):
    train = submit(alice, teams["training"], name="train")
    evaluate = submit(alice, teams["training"], name="eval", depends_on=((train.pk, "succeeded"),))
    runner.cycle_run_once()
    assert fresh(train).state == "placed"
    waiting = fresh(evaluate)
    assert waiting.state == "pending" and waiting.pending_reason_code == "dependency"
    assert waiting.pending_reason == f"Waits for job {train.pk} to succeed (it is placed)."
    assert waiting.queue_position is None
    end(train, JobState.SUCCEEDED)
    runner.cycle_run_once()
    assert fresh(evaluate).state == "placed"


def test_afterany_starts_after_a_failure_and_afternotok_never_after_a_success(node, alice, teams):
    alice.email = "alice@example.org"
    alice.save()
    notification_settings_save(user=alice, job_events=[], email=True, webhook_url="")  # asked for nothing
    first = submit(alice, teams["training"], name="first")
    anyway = submit(alice, teams["training"], name="report", depends_on=((first.pk, "ended"),))
    on_failure = submit(alice, teams["training"], name="cleanup", depends_on=((first.pk, "failed"),))
    runner.cycle_run_once()
    end(first, JobState.SUCCEEDED)
    runner.cycle_run_once()
    assert fresh(anyway).state == "placed"
    never = fresh(on_failure)
    assert never.state == "failed"
    assert never.events.get(code="dependency_never_satisfied").message == (
        f"Its dependency can never be met: job {first.pk} succeeded, and this job was to start only if it "
        "failed."
    )
    notifications_deliver_due()
    assert [m.subject for m in mail.outbox] == [f"[Tessera] job {on_failure.pk} cleanup failed"]


def test_an_evaluation_waits_for_a_whole_sweep_and_never_runs_if_part_of_it_failed(node, alice, teams):
    sweep = submit(alice, teams["training"], name="sweep", array="0-9")  # 8 cards: 8 tasks at first
    evaluate = submit(alice, teams["training"], name="eval", depends_on=((sweep.pk, "succeeded"),))
    runner.cycle_run_once()
    tasks = list(Job.objects.filter(array_job_id=sweep.pk, state="placed"))
    assert len(tasks) == 8
    assert (
        fresh(evaluate).pending_reason
        == f"Waits for array {sweep.pk} to succeed (0 of its 10 tasks have ended)."
    )
    for task in tasks[:7]:
        end(task, JobState.SUCCEEDED)
    end(tasks[7], JobState.FAILED)
    runner.cycle_run_once()
    never = fresh(evaluate)
    assert never.state == "failed" and never.events.filter(code="dependency_never_satisfied").exists()
    assert "array" in never.events.get(code="dependency_never_satisfied").message


def test_a_singleton_waits_for_the_earlier_job_of_its_name(node, alice, teams):
    first = submit(alice, teams["training"], name="nightly", singleton=True)
    second = submit(alice, teams["training"], name="nightly", singleton=True)
    other = submit(alice, teams["training"], name="other", singleton=True)
    runner.cycle_run_once()
    assert (fresh(first).state, fresh(other).state) == ("placed", "placed")
    waiting = fresh(second)
    assert waiting.state == "pending" and waiting.pending_reason_code == "singleton"
    assert f"waits for your job {first.pk} of the same name (nightly) to end" in waiting.pending_reason
    end(first, JobState.CANCELLED)
    runner.cycle_run_once()
    assert fresh(second).state == "placed"


def test_a_dependency_that_cannot_be_met_or_seen_is_refused_at_submit(node, alice, bob, teams):
    done = submit(alice, teams["training"], name="done")
    runner.cycle_run_once()
    end(done, JobState.FAILED)
    bobs = submit(bob, teams["inference"], name="bobs")
    next_id = Job.objects.order_by("-pk").first().pk + 1  # the job being submitted (a cycle on itself)
    for depends_on, says in (
        (
            ((done.pk, "succeeded"),),
            f"job {done.pk} did not succeed (it is failed): this job could never start",
        ),
        (((bobs.pk, "ended"),), f"there is no job {bobs.pk} that you may see"),
        (((next_id, "ended"),), f"there is no job {next_id} that you may see"),
    ):
        with pytest.raises(ServiceError) as refused:
            submit(alice, teams["training"], name="later", depends_on=depends_on)
        assert (refused.value.field, refused.value.code) == ("depends_on", "bad_dependency")
        assert says in refused.value.message
    assert not Job.objects.filter(name="later").exists()


def test_aftercorr_starts_each_task_after_the_same_task_of_the_other_array(node, alice, teams):
    """sbatch's aftercorr: task i of `evaluate` after task i of `train` succeeded; one whose training failed ends
    as dependency_never_satisfied, the others run."""
    train = submit(alice, teams["training"], name="train", array="0-2", gpu_memory_mib=1024, gpus=0)
    spec = spec_from_mapping(
        {
            "name": "eval",
            "command": "x",
            "gpu_memory": "1GiB",
            "array": "0-2",
            "depends_on": f"aftercorr:{train.pk}",
        }
    ).spec
    evaluate = job_submit(submitter=alice, team=teams["training"], spec=spec)
    runner.cycle_run_once()
    trained = {t.array_task_id: t for t in Job.objects.filter(array_job_id=train.pk)}
    assert {t.state for t in trained.values()} == {"placed"}
    waiting = fresh(evaluate)
    assert (waiting.state, waiting.pending_reason_code) == ("pending", "dependency")
    assert (
        f"Each of its tasks waits for the same task of array {train.pk} to succeed" in waiting.pending_reason
    )
    end(trained[0], JobState.SUCCEEDED)
    end(trained[1], JobState.FAILED)
    runner.cycle_run_once()
    tasks = {t.array_task_id: t.state for t in Job.objects.filter(array_job_id=evaluate.pk)}
    assert tasks == {0: "placed", 1: "failed", None: "pending"}, tasks  # task 2 still in the array's row
    assert fresh(evaluate).array_pending == "2"
    failed = Job.objects.get(array_job_id=evaluate.pk, array_task_id=1)
    assert (
        f"task 1 of array {train.pk} did not succeed"
        in failed.events.get(code="dependency_never_satisfied").message
    )
    end(trained[2], JobState.SUCCEEDED)
    runner.cycle_run_once()
    assert (fresh(evaluate).array_task_id, fresh(evaluate).state) == (2, "placed")  # the last: the row itself


def test_aftercorr_is_refused_unless_both_are_arrays_with_the_same_tasks(node, alice, teams):
    train = submit(alice, teams["training"], name="train", array="0-2")
    single = submit(alice, teams["training"], name="single")
    runner.cycle_run_once()
    task = Job.objects.filter(array_job_id=train.pk).exclude(pk=train.pk).first()
    for array, on, says in (
        ("", train.pk, "this job is no array"),
        ("0-2", task.pk, f"job {task.pk} is a task of array {train.pk}: name the array"),
        ("0-2", single.pk, f"job {single.pk} is not an array"),
        ("0-3", train.pk, f"array {train.pk} has no task 3"),
    ):
        with pytest.raises(ServiceError, match=says):
            submit(alice, teams["training"], name="eval", array=array, depends_on=((on, "each"),))


def test_aftercorr_on_a_task_cancelled_before_it_was_placed_never_starts(node, alice, teams):
    train = submit(alice, teams["training"], name="train", array="0-1")
    evaluate = submit(alice, teams["training"], name="eval", array="0-1", depends_on=((train.pk, "each"),))
    from scheduling.jobs.array_indexes import TaskIndexes
    from scheduling.jobs.array_tasks import array_cancel

    array_cancel(job=train, actor=alice, tasks=TaskIndexes.parse("1"))  # never placed
    runner.cycle_run_once()
    end(Job.objects.get(array_job_id=train.pk, array_task_id=0), JobState.SUCCEEDED)
    runner.cycle_run_once()
    states = {t.array_task_id: t.state for t in Job.objects.filter(array_job_id=evaluate.pk)}
    assert states == {0: "placed", 1: "failed"}, states


def test_an_arrays_first_row_ending_by_any_path_ends_its_tasks_not_yet_placed(node, alice, teams):
    from scheduling.jobs.selectors import array_summaries
    from scheduling.jobs.transitions import job_cancel

    array = submit(alice, teams["training"], name="sweep", array="0-99")
    job_cancel(job=array, actor=alice)  # as the admin site cancels a job
    array = fresh(array)
    assert (array.state, array.array_pending) == ("cancelled", "")
    assert array_summaries(jobs=[array])[array.pk].counts == {"cancelled": 100}
