"""A two-node gang on two real agent processes: its members meet over loopback with the variables the agents
gave them, and the gang ends as one job (succeeded when both succeed; failed, naming the member, when one fails)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from django.conf import settings
from django.db.models import F

from scheduling.choices import JobState
from scheduling.jobs.models import GangMember
from tests.pipeline.harness import submit, wait_for, wait_state

RENDEZVOUS = Path(__file__).with_name("gang_rendezvous.py")


def members_started(job) -> dict[int, str]:
    """rank -> node, once both members' agents reported them started."""
    rows = list(
        GangMember.objects.filter(job=job, started_at__isnull=False).values_list("rank", "node__name")
    )
    return dict(rows) if len(rows) == 2 else {}


def transitions(job) -> list[str]:
    """The states the job went through (its other events, such as a member's end, change no state)."""
    events = job.events.exclude(from_state=F("to_state")).order_by("at", "id")
    return list(events.values_list("to_state", flat=True))


def stdout_on(pipe, node: str, job) -> str:
    return (pipe.work_dir(node) / "jobs" / str(job.pk) / "1" / "stdout.log").read_text()


def test_a_two_node_gang_meets_over_loopback_and_succeeds_once_both_members_exited_0(pipe):
    job = submit(pipe, gpus=1, nodes=2, name="rendezvous", command=f"{sys.executable} {RENDEZVOUS}")
    wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout_s=40)
    assert job.state == JobState.SUCCEEDED and job.exit_code == 0, job.events.last().message
    assert transitions(job) == ["pending", "placed", "running", "succeeded"]
    # The first exit to arrive did not end the job: it waited for the other member.
    assert job.events.filter(code="gang_member_exited").count() == 1
    assert job.events.get(to_state=JobState.SUCCEEDED).message == (
        "All 2 members exited with code 0 (pipe-a, pipe-b)."
    )
    seen = {node: json.loads(stdout_on(pipe, node, job)) for node in ("pipe-a", "pipe-b")}
    assert {node: (s["rank"], s["heard"]) for node, s in seen.items()} == {
        "pipe-a": (0, [1]),
        "pipe-b": (1, [0]),
    }
    port = int(seen["pipe-a"]["env"]["MASTER_PORT"])
    assert settings.TESSERA_GANG_PORT_FIRST <= port <= settings.TESSERA_GANG_PORT_LAST
    for node, s in seen.items():
        # MASTER_ADDR is the address rank 0's agent reported in its hello (--address), not its node name.
        assert s["env"] == {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": "2",
            "NODE_RANK": str(s["rank"]),
            "LOCAL_WORLD_SIZE": "1",
            "TESSERA_NUM_NODES": "2",
            "TESSERA_NODELIST": "pipe-a,pipe-b",
            "TESSERA_HOSTFILE": str(pipe.work_dir(node) / "jobs" / str(job.pk) / "1" / "hostfile"),
        }
        assert s["hostfile"] == ["127.0.0.1 slots=1", "127.0.0.1 slots=1"]
        assert pipe.placements_on(node, job.pk)[1]["outcome"]["outcome"] == "exited"


def test_a_member_exiting_3_fails_the_gang_naming_it_after_its_peer_was_stopped_with_the_job_grace(pipe):
    go = pipe.root / "starts"
    # Rank 0 ignores SIGTERM, so its stop takes the whole grace (2 s for pipe-low) and ends with SIGKILL; rank 1
    # fails once the test saw both members started.
    command = (
        'if [ "$NODE_RANK" = 0 ]; then trap "" TERM; sleep 120; '
        f"else while [ ! -e {go}/go-$TESSERA_JOB_ID ]; do sleep 0.1; done; exit 3; fi"
    )
    job = submit(pipe, gpus=1, nodes=2, name="gang-fails", command=command)
    ranks = wait_for("both members to start", lambda: members_started(job), timeout_s=30)
    (go / f"go-{job.pk}").touch()
    wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout_s=30)
    assert job.state == JobState.FAILED and job.exit_code == 3
    assert transitions(job) == ["pending", "placed", "running", "failed"]
    decided = job.events.get(code="gang_member_failed")
    assert decided.message == (
        f"rank 1 on {ranks[1]} exited with code 3: the gang fails. Stopping the other members "
        f"(rank 0 on {ranks[0]}) with 2 s grace."
    )
    failed = job.events.get(to_state=JobState.FAILED)
    assert failed.code == "gang_failed"
    assert failed.message.startswith(
        f"Failed: rank 1 on {ranks[1]} exited with code 3. All 2 members have ended"
    )
    assert (failed.data["failed_node"], failed.data["failed_rank"], failed.data["exit_code"]) == (
        ranks[1],
        1,
        3,
    )
    # The peer was stopped by its agent (not desired any more), SIGKILLed after the grace, and the job ended only
    # once it had.
    stopped = pipe.placements_on(ranks[0], job.pk)[1]["outcome"]
    assert (stopped["outcome"], stopped["stop_reason"], stopped["exit_code"]) == (
        "stopped",
        "not_desired",
        -9,
    )
    assert stopped["finished_at"] - decided.at.timestamp() >= 2 - 0.2
    assert failed.at.timestamp() >= stopped["finished_at"] - 0.5
    assert pipe.placements_on(ranks[1], job.pk)[1]["outcome"]["exit_code"] == 3
