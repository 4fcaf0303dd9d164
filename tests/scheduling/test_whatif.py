"""The submit form's what-if: the engine's answer on the current snapshot for a job not submitted, placing and
storing nothing; on a large cluster the snapshot is read again in the background, never on the request."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from scheduling.cycle import whatif
from scheduling.cycle.runner import cycle_run_once
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.ledger import slice_allocate
from scheduling.jobs.models import Job
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_transition


@pytest.fixture(autouse=True)
def _fresh_snapshot(monkeypatch):
    monkeypatch.setattr(whatif, "_cached", None)


def _spec(**fields) -> JobSpec:
    fields.setdefault("name", "what-if")
    fields.setdefault("command", "python train.py")
    return JobSpec(**fields)


@pytest.mark.django_db
def test_a_job_that_fits_starts_now_and_nothing_is_stored(alice, teams, node):
    answer = whatif.job_whatif(user=alice, team=teams["training"], spec=_spec(gpus=2, topology="nvlink"))
    assert answer.verdict == "now"
    assert "a100-01" in answer.text
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_a_job_that_can_never_run_says_why(alice, teams, node):
    answer = whatif.job_whatif(user=alice, team=teams["training"], spec=_spec(gpus=9))
    assert answer.verdict == "never"
    assert (
        answer.text == "Can never run here: 9 GPUs on one node can never be had: the most on any node is 8."
    )


@pytest.mark.django_db
def test_on_a_full_node_the_answer_is_when_the_running_jobs_max_runtimes_end(alice, bob, teams, node):
    for i in range(8):
        job_submit(
            submitter=alice, team=teams["training"], spec=_spec(name=f"hold-{i}", gpus=1, max_runtime_s=3600)
        )
    cycle_run_once()
    assert Job.objects.filter(state="placed").count() == 8
    answer = whatif.job_whatif(user=bob, team=teams["inference"], spec=_spec(gpus=1))
    assert answer.verdict == "later", answer
    assert 3000 <= (answer.eta_s or 0) <= 3700, answer
    assert answer.text.startswith("Starts in about 60 min: node a100-01 is reserved for this job"), answer
    assert answer.alternative == ""  # nothing smaller exists
    assert Job.objects.count() == 8


@pytest.mark.django_db
def test_a_request_over_the_team_limit_waits_and_names_the_nearer_one_that_starts_now(bob, teams, node):
    from scheduling.choices import ActorKind, JobState
    from scheduling.inventory.models import Gpu

    # inference may hold 128 GiB and holds 70 GiB: a 60 GiB slice must wait for it, a 30 GiB one need not
    held = job_submit(
        submitter=bob, team=teams["inference"], spec=_spec(gpu_memory_mib=70 * 1024, compute_pct=10)
    )
    job_transition(job=held, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER)
    slice_allocate(job=held, gpu=Gpu.objects.get(node=node, index=6), memory_mib=70 * 1024, compute_pct=10)
    job_transition(job=held, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT)
    answer = whatif.job_whatif(
        user=bob, team=teams["inference"], spec=_spec(gpu_memory_mib=60 * 1024, compute_pct=10)
    )
    assert answer.verdict == "waits", answer
    assert answer.reason_code == "quota-limit"
    assert answer.alternative == "A 30 GiB slice starts now."


@pytest.mark.django_db
def test_a_request_beyond_the_team_limit_alone_can_never_run(bob, teams, node):
    # inference may hold 128 GiB: two 80 GiB cards are beyond it whatever else runs
    answer = whatif.job_whatif(user=bob, team=teams["inference"], spec=_spec(gpus=2, topology="nvlink"))
    assert answer.verdict == "never", answer
    assert "team ai-lab/inference may hold at most 128 GiB (its limit)" in answer.text


@pytest.mark.django_db(transaction=True)
def test_a_dear_snapshot_is_read_again_in_the_background(alice, teams, node, a100, monkeypatch):
    from scheduling.inventory.models import Gpu, Node

    monkeypatch.setattr(whatif, "CHEAP_SNAPSHOT_S", -1.0)  # every read counts as dear, as on a large cluster
    first = whatif._snapshot()
    assert [n.name for n in first.nodes] == ["a100-01"]
    added = Node.objects.create(name="a100-02", cpu_milli=64_000, memory_mib=512 * 1024)
    Gpu.objects.create(node=added, index=0, uuid="GPU-added-0", model=a100, memory_mib=81920)
    assert whatif._snapshot() is first  # within the TTL: the one held
    whatif._cached.read_at -= whatif.SNAPSHOT_TTL_S + 1
    let_read = threading.Event()
    read = whatif._read

    def slow_read():  # a read that takes its time: until the test lets it go
        let_read.wait(30)
        return read()

    monkeypatch.setattr(whatif, "_read", slow_read)
    try:
        assert whatif._snapshot() is first  # stale: still answered from it...
        refresher = next(t for t in threading.enumerate() if t.name == "whatif-snapshot")
        assert refresher.is_alive(), "...with no wait for the read in the background"
    finally:
        let_read.set()
    refresher.join(timeout=30)
    assert sorted(n.name for n in whatif._snapshot().nodes) == ["a100-01", "a100-02"]


@pytest.mark.django_db(transaction=True)
def test_opening_the_submit_form_reads_the_snapshot_in_the_background_and_the_first_answer_waits_for_it(
    alice, teams, node, client, monkeypatch
):
    let_read = threading.Event()
    read = whatif._read
    readers = []

    def slow_read():  # the first read of a large cluster: seconds, until the test lets it go
        readers.append(threading.current_thread().name)
        let_read.wait(30)
        return read()

    monkeypatch.setattr(whatif, "_read", slow_read)
    client.force_login(alice)
    try:
        assert client.get("/jobs/new/").status_code == 200  # answered at once, the read under way
        assert readers == ["whatif-snapshot"]

        def ask():
            try:
                readers.append(len(whatif._snapshot().nodes))
            finally:
                connection.close()  # this thread's own

        waiting = threading.Thread(target=ask)
        waiting.start()
        waiting.join(timeout=0.5)
        assert waiting.is_alive(), "the first answer waits for the read under way..."
    finally:
        let_read.set()
    waiting.join(timeout=30)
    assert readers == ["whatif-snapshot", 1]  # ...and takes it: no second read beside it
