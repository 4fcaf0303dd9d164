"""A job whose node goes silent says so at once (Slurm's NODE_FAIL), in the API, long before anything is done
about it; one cancelled meanwhile keeps its cards as "releasing" until its agent, back, confirms the stop."""

from __future__ import annotations

import json
import time

import pytest
import requests

from agent import procfs
from quotas.tokens import api_token_create
from scheduling.choices import JobState
from scheduling.inventory.models import Gpu
from scheduling.jobs.transitions import job_cancel
from tests.pipeline.harness import NODE_LOST_AFTER_S, submit, wait_for, wait_state

WATCHDOG_AND_CYCLE_S = 0.5 + 1.0  # the harness's TESSERA_WATCHDOG_INTERVAL_S and TESSERA_CYCLE_INTERVAL_S


def _api_job(pipe, token: str, job_id: int) -> dict:
    response = requests.get(
        f"http://127.0.0.1:{pipe.port}/api/v1/jobs/{job_id}/",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    response.raise_for_status()
    return response.json()


def _alive(pid: int) -> bool:
    st = procfs.read_stat(pid)
    return st is not None and st.state not in ("Z", "X")


@pytest.mark.timeout(150, func_only=True)  # the node-lost timeout (10 s) and an agent restart: about 30 s
def test_a_silent_nodes_job_says_so_and_one_cancelled_meanwhile_keeps_its_cards_until_the_agent_confirms(
    pipe,
):
    _, token = api_token_create(user=pipe.people["alice"], name="node-silence")
    job = submit(pipe, gpus=1, command="sleep 600", name="on-a-node-that-goes-silent")
    wait_state(job, JobState.RUNNING)
    node = job.events.filter(to_state=JobState.PLACED).latest("at", "id").data["nodes"][0]
    record = pipe.work_dir(node) / "jobs" / str(job.pk) / "1" / "job.json"
    pid = json.loads(wait_for("the job's record", lambda: record.exists() and record.read_text()))["pid"]
    assert _api_job(pipe, token, job.pk)["node_condition"] is None

    pipe.procs[f"agent-{node}"].kill9()
    killed_at = time.time()
    condition = wait_for(
        "the API to say the job's node is not responding",
        lambda: _api_job(pipe, token, job.pk)["node_condition"],
        timeout_s=NODE_LOST_AFTER_S * 3,
    )
    shown_after_s = time.time() - killed_at
    # Counted from the node's last heartbeat (at most one 1 s interval before the kill): within the node-lost
    # timeout and a watchdog round and a cycle, not at the requeue after the fence.
    assert shown_after_s <= NODE_LOST_AFTER_S + WATCHDOG_AND_CYCLE_S + 2.0, shown_after_s
    assert condition["code"] == "node_not_responding" and condition["node"] == node
    assert f"ode {node} has not responded since" in condition["message"]
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and _alive(pid)

    # Cancelled while its node is silent: it may still run there, so its card stays taken.
    job_cancel(job=job, actor=pipe.people["alice"])
    body = _api_job(pipe, token, job.pk)
    assert body["state"] == JobState.CANCELLED and body["node_condition"]["code"] == "releasing"
    held = Gpu.objects.filter(node__name=node, allocated_memory_mib__gt=0)
    assert held.count() == 1 and _alive(pid), "the card was shown free while the job still ran"

    # The agent comes back: the job is not in its desired state, it stops it and says so; the card is free.
    restarted_at = time.time()
    pipe.start_agent(node)
    wait_for("the card to be free again", lambda: not held.exists(), timeout_s=45)
    freed_after_s = time.time() - restarted_at
    assert not _alive(pid)
    released = job.events.get(code="gpus_released")
    assert "agent confirmed" in released.message
    assert _api_job(pipe, token, job.pk)["node_condition"] is None
    print(
        f"node {node} silent: shown on its job {shown_after_s:.1f} s after its agent was killed; the cancelled "
        f"job's card free {freed_after_s:.1f} s after its agent was started again"
    )
