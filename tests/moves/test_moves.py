"""A guaranteed 8-GPU job moves a preemptible single-card job off the only whole NVLink node: on the real stack
(daphne, the Celery worker running cycles, simulated agents running real processes), with the pages that say so."""

from __future__ import annotations

from scheduling.choices import JobState
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_cancel
from tests.moves.conftest import screenshot
from tests.pipeline.harness import path_of, wait_state

GRACE_S = 2.0  # pipe-low's preemption grace
CYCLE_S = 1.0  # TESSERA_CYCLE_INTERVAL_S in the harness


def _submit(cluster, team: str, **spec) -> Job:
    spec.setdefault("name", f"{team}-job")
    return job_submit(submitter=cluster.people["alice"], team=cluster.people[team], spec=JobSpec(**spec))


def _nodes(job: Job) -> list[str]:
    return job.events.filter(to_state=JobState.PLACED).latest("at", "id").data["nodes"]


def test_a_guaranteed_training_moves_a_single_card_job_off_the_only_whole_nvlink_node(cluster, page):
    # The L4 node is taken for a while, so vision's single card lands on the H100 node.
    blocker = _submit(cluster, "team", name="blocker", gpus=2, gpu_models=("L4",), command="sleep 600")
    wait_state(blocker, JobState.RUNNING)
    small = _submit(cluster, "vision", name="small", gpus=1, command="sleep 600")
    wait_state(small, JobState.RUNNING)
    assert _nodes(small) == ["move-h"]
    job_cancel(job=blocker, actor=cluster.people["alice"])
    wait_state(blocker, JobState.CANCELLED)

    train = _submit(
        cluster,
        "llm",
        name="train",
        gpus=8,
        topology="nvlink",
        min_gpu_memory_mib=75 * 1024,
        priority="pipe-high",
        command="sleep 600",
    )
    wait_state(train, JobState.RUNNING, timeout_s=30)
    assert _nodes(train) == ["move-h"]

    # The single card was moved, not reclaimed: its team keeps its guarantee, and it says where and why.
    moved = small.events.get(to_state=JobState.PREEMPTED)
    assert moved.code == "moved"
    assert moved.data["preemptor"] == str(train.pk) and moved.data["to_nodes"] == ["move-l"]
    assert moved.message.startswith(
        f"Moved to move-l to free an NVLink node for team llm's guaranteed 8-GPU job #{train.pk}"
    )
    wait_state(small, JobState.RUNNING, timeout_s=30)
    assert _nodes(small) == ["move-l"]
    assert path_of(small) == ["pending", "placed", "running", "preempted", "pending", "placed", "running"]
    requeued = small.events.filter(to_state=JobState.PENDING).latest("at", "id")
    assert requeued.code == "moved" and "to move" in requeued.message
    # It restarted elsewhere within its grace and two cycles of the move (the scheduler's part: placed again).
    placed_again = small.events.filter(to_state=JobState.PLACED).latest("at", "id").at
    assert (placed_again - moved.at).total_seconds() <= GRACE_S + 2 * CYCLE_S + 1.0, (moved.at, placed_again)
    small.refresh_from_db()
    assert small.moves == 1 and small.moving_until is None
    # The training waited for it to leave, and said so.
    placed = train.events.get(to_state=JobState.PLACED)
    assert "1 job moving elsewhere" in placed.message, placed.message
    started = train.events.get(to_state=JobState.RUNNING).at
    assert started >= moved.at

    if page is None:
        return  # no browser here: the events above are what the pages show
    page.goto(f"/jobs/{small.pk}/")
    page.wait_for_selector(
        f"text=Moved to move-l to free an NVLink node for team llm's guaranteed 8-GPU job #{train.pk}"
    )
    screenshot(page, "moved-job")
    page.goto(f"/jobs/{train.pk}/")
    page.wait_for_selector("text=1 job moving elsewhere")
    screenshot(page, "training")
    page.goto("/cluster/")
    moves = page.locator("#cluster-moves")
    moves.wait_for()
    text = moves.inner_text()
    assert f"job #{small.pk} small of team vision moved from move-h to move-l" in text, text
    assert f"to free an NVLink node for team llm's guaranteed 8-GPU job #{train.pk}" in text, text
    screenshot(page, "cluster")
