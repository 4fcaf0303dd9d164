"""Idle GPUs given back on the real stack: jobs whose simulated GPUs sit idle (TESSERA_SIM_UTIL_PCT=0: their agent
reports 0% on their cards) are warned, then a session is stopped and a batch job requeued at the timeout, and the
job that waited starts on the freed cards."""

from __future__ import annotations

import pytest

from quotas.models import PriorityClass
from scheduling.choices import JobState
from scheduling.cycle.idle import idle_check
from scheduling.jobs.models import JobEvent, Slice
from tests.pipeline.harness import submit, wait_for, wait_state

TIMEOUT_S = 10  # the shortest a class may set


@pytest.mark.timeout(150, func_only=True)  # about 30 s
def test_idle_jobs_are_warned_then_a_session_stopped_and_a_batch_job_requeued_for_the_one_that_waits(
    pipe, settings
):
    settings.TESSERA_IDLE_REQUEUE_HOLD_S = 60
    PriorityClass.objects.filter(name="pipe-low").update(
        idle_timeout_s=TIMEOUT_S, interactive_idle_timeout_s=TIMEOUT_S
    )
    try:
        idle = {"TESSERA_SIM_UTIL_PCT": "0"}
        # Both A100s of each node: the batch job on one node, a busy job on the other; the session on an L4.
        batch = submit(pipe, name="idle-batch", gpus=2, command="sleep 300", env=idle)
        busy = submit(pipe, name="busy", gpus=2, command="sleep 300")
        session = submit(
            pipe,
            name="idle-notebook",
            gpus=1,
            gpu_models=("L4",),
            kind="interactive",
            command="sleep 300",
            env=idle,
        )
        for job in (batch, busy, session):
            wait_state(job, JobState.RUNNING, timeout_s=30)
        node = Slice.objects.filter(job=batch).values_list("gpu__node__name", flat=True).first()
        waiting = submit(pipe, name="waits", gpus=2, command="sleep 300")
        wait_for(
            "the next job to wait for the A100s", lambda: waiting.refresh_from_db() or waiting.pending_reason
        )

        seen: dict[str, list[int]] = {"warned": [], "stopped": [], "requeued": []}

        def acted() -> bool:
            for what, ids in idle_check().items():
                seen.setdefault(what, []).extend(ids)
            return batch.pk in seen["requeued"] and session.pk in seen["stopped"]

        wait_for("the idle jobs' GPUs to be given back", acted, timeout_s=60)
        assert {batch.pk, session.pk} <= set(seen["warned"]) and busy.pk not in seen["warned"]
        warning = JobEvent.objects.get(job=session, code="idle_warning").message
        assert warning.startswith("Idle for ") and "every GPU under 5% since" in warning

        wait_state(session, JobState.CANCELLED)
        assert JobEvent.objects.get(job=session, code="idle_stopped").message.endswith("for other work.")
        wait_state(waiting, JobState.RUNNING, timeout_s=60)
        assert set(Slice.objects.filter(job=waiting).values_list("gpu__node__name", flat=True)) == {node}
        batch.refresh_from_db()
        assert (
            batch.state == JobState.PENDING and batch.pending_reason
        )  # held back, behind the one that waited
        assert busy.refresh_from_db() or busy.state == JobState.RUNNING
    finally:
        PriorityClass.objects.filter(name="pipe-low").update(
            idle_timeout_s=None, interactive_idle_timeout_s=None
        )
