import threading

import pytest
from django.db import IntegrityError, connection, transaction

from scheduling.choices import ActorKind, JobState
from scheduling.inventory.models import Gpu
from scheduling.inventory.selectors import overcommitted_gpus
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.ledger import SliceDoesNotFit, slice_allocate
from scheduling.jobs.models import Job, JobEvent, Slice
from scheduling.jobs.states import TRANSITIONS, IllegalTransition, check_transition
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_requeue, job_transition

pytestmark = pytest.mark.both_databases


def _job(alice, teams, **spec) -> Job:
    spec.setdefault("name", "train")
    spec.setdefault("command", "python train.py")
    return job_submit(submitter=alice, team=teams["training"], spec=JobSpec(**spec))


def test_every_state_has_its_transitions_declared():
    assert set(TRANSITIONS) == set(JobState.values)
    for targets in TRANSITIONS.values():
        assert targets <= set(JobState.values)


@pytest.mark.parametrize(
    ("from_state", "to_state"),
    [
        ("pending", "running"),
        ("succeeded", "pending"),
        ("cancelled", "running"),
        ("running", "placed"),
    ],
)
def test_an_illegal_transition_raises_with_the_allowed_ones(from_state, to_state):
    with pytest.raises(IllegalTransition, match=f"cannot go from {from_state} to {to_state}"):
        check_transition(job_id=7, from_state=from_state, to_state=to_state)


@pytest.mark.django_db
def test_a_job_walks_its_life_and_every_step_is_an_event(alice, teams, node):
    job = _job(alice, teams, gpus=1)
    job_transition(job=job, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER)
    job_transition(job=job, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT)
    job_transition(job=job, to_state=JobState.SUCCEEDED, actor_kind=ActorKind.AGENT)
    steps = list(JobEvent.objects.filter(job=job).values_list("from_state", "to_state"))
    assert steps == [("", "pending"), ("pending", "placed"), ("placed", "running"), ("running", "succeeded")]
    with pytest.raises(IllegalTransition):
        job_transition(job=job, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and job.finished_at is not None


@pytest.mark.django_db
def test_a_requeued_job_keeps_its_submit_time_and_gives_back_its_slices(alice, teams, node):
    job = _job(alice, teams, gpus=1)
    submitted_at = job.submitted_at
    gpu = Gpu.objects.get(node=node, index=0)
    job_transition(job=job, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER)
    slice_allocate(job=job, gpu=gpu, memory_mib=gpu.memory_mib, compute_pct=100)
    job_requeue(job=job, actor=None, reason="node maintenance")
    job.refresh_from_db()
    gpu.refresh_from_db()
    assert job.state == JobState.PENDING and job.submitted_at == submitted_at
    assert gpu.allocated_memory_mib == 0 and not Slice.objects.filter(job=job).exists()


@pytest.mark.django_db
def test_the_service_refuses_a_slice_larger_than_the_free_memory(alice, teams, node):
    gpu = Gpu.objects.get(node=node, index=6)  # MPS
    first = _job(alice, teams, gpu_memory_mib=60 * 1024, compute_pct=50)
    slice_allocate(job=first, gpu=gpu, memory_mib=60 * 1024, compute_pct=50)
    second = _job(alice, teams, gpu_memory_mib=30 * 1024, compute_pct=10)
    with pytest.raises(SliceDoesNotFit, match="20480 MiB and 50% compute free") as caught:
        slice_allocate(job=second, gpu=gpu, memory_mib=30 * 1024, compute_pct=10)
    assert caught.value.field == "memory_mib"
    gpu.refresh_from_db()
    assert gpu.allocated_memory_mib == 60 * 1024 and gpu.allocated_compute_pct == 50


@pytest.mark.django_db
def test_the_service_refuses_a_slice_of_an_exclusive_gpu(alice, teams, node):
    gpu = Gpu.objects.get(node=node, index=0)
    job = _job(alice, teams, gpu_memory_mib=1024, compute_pct=10)
    with pytest.raises(SliceDoesNotFit, match="exclusive"):
        slice_allocate(job=job, gpu=gpu, memory_mib=1024, compute_pct=10)


@pytest.mark.django_db
def test_the_database_itself_refuses_a_raw_overcommit(node):
    gpu = Gpu.objects.get(node=node, index=0)
    with pytest.raises(IntegrityError, match="gpu_memory_not_overcommitted"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE scheduling_gpu SET allocated_memory_mib = memory_mib + 1 WHERE id = %s", [gpu.pk]
            )
    with pytest.raises(IntegrityError, match="gpu_compute_not_overcommitted"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("UPDATE scheduling_gpu SET allocated_compute_pct = 101 WHERE id = %s", [gpu.pk])


@pytest.mark.django_db(transaction=True)
def test_twenty_threads_racing_for_one_gpu_leave_exactly_one_winner(alice, teams, node):
    gpu = Gpu.objects.get(node=node, index=7)  # MPS: a 50 GiB slice fits once
    jobs = [_job(alice, teams, gpu_memory_mib=50 * 1024, compute_pct=10, name=f"race-{i}") for i in range(20)]
    results: list[str] = []
    barrier = threading.Barrier(len(jobs))

    def allocate(job: Job) -> None:
        barrier.wait()
        try:
            slice_allocate(job=job, gpu=gpu, memory_mib=50 * 1024, compute_pct=10)
            results.append("won")
        except SliceDoesNotFit:
            results.append("conflict")
        finally:
            connection.close()

    threads = [threading.Thread(target=allocate, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["conflict"] * 19 + ["won"]
    assert Slice.objects.filter(gpu=gpu).count() == 1
    assert not overcommitted_gpus().exists()
