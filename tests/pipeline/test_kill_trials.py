"""How often a placement ran twice after its agent was killed: repeated trials of kill -9 on a job's agent, each
measuring the overlap between the old attempt's end (its supervisor's exit record) and the new attempt's start
(its supervisor's launch record on the other node). Opt-in, as it takes about half a minute a trial:

    TESSERA_KILL_TRIALS=20 make test PYTEST_ARGS="-s tests/pipeline/test_kill_trials.py"
"""

from __future__ import annotations

import json
import os
import time

import pytest

from scheduling.choices import JobState, NodeState
from scheduling.inventory.models import Node
from scheduling.jobs.transitions import job_cancel
from tests.pipeline.harness import FENCE_AFTER_S, submit, wait_for, wait_state

TRIALS = int(os.environ.get("TESSERA_KILL_TRIALS", "0"))


def _record(path):
    return json.loads(path.read_text()) if path.exists() else None


def _trial(pipe, number: int) -> tuple[float, float]:
    """One kill: (seconds both attempts ran at once, seconds from the kill to the old attempt's end)."""
    job = submit(pipe, gpus=2, command="sleep 600", name=f"kill-trial-{number}")
    wait_state(job, JobState.RUNNING)
    node = job.events.filter(to_state=JobState.PLACED).latest("at", "id").data["nodes"][0]
    old = pipe.work_dir(node) / "jobs" / str(job.pk) / "1"
    pipe.procs[f"agent-{node}"].kill9()
    killed_at = time.time()
    ended = wait_for("the fence", lambda: _record(old / "exit.json"), timeout_s=FENCE_AFTER_S * 3)
    wait_for("the job placed again", lambda: job.refresh_from_db() or job.attempt == 2, timeout_s=60)
    wait_state(job, JobState.RUNNING)
    other = job.events.filter(to_state=JobState.PLACED).latest("at", "id").data["nodes"][0]
    new = _record(pipe.work_dir(other) / "jobs" / str(job.pk) / "2" / "launch.json")
    pipe.start_agent(node)
    wait_for("the node back", lambda: Node.objects.get(name=node).state == NodeState.READY, timeout_s=60)
    job_cancel(job=job, actor=None)
    wait_state(job, JobState.CANCELLED)
    return max(0.0, ended["finished_at"] - new["started_at"]), ended["finished_at"] - killed_at


@pytest.mark.skipif(TRIALS <= 0, reason="opt-in measurement: set TESSERA_KILL_TRIALS (about 30 s a trial)")
def test_no_placement_runs_twice_over_repeated_agent_kills(pipe):
    results = [_trial(pipe, number) for number in range(TRIALS)]
    overlaps = [overlap for overlap, _ in results]
    print(
        json.dumps(
            {
                "trials": TRIALS,
                "fence_after_s": FENCE_AFTER_S,
                "ran_twice_s_max": round(max(overlaps), 3),
                "ran_twice_trials": sum(1 for o in overlaps if o > 0),
                "stopped_after_kill_s": [round(after, 1) for _, after in results],
            }
        )
    )
    assert max(overlaps) == 0.0
