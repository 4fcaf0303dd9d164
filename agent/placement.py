"""A placement's record: its handle in the agent's memory and the files of its directory, the agent's state.

Each placement (job id + attempt) gets a directory under <work_dir>/jobs/ holding its spec, what its supervisor
runs (run.json), the supervisor's launch record (pid, start time, command line), the job's own pid and group
(job.json), the stop request the agent writes (stop.json), the exit record the supervisor writes (exit.json), the
agent's outcome (outcome.json), and the job's stdout/stderr; for an isolated job also its own home and TMPDIR
(agent/isolation.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.jobspec import JobSpec, safe_name

RUNNING, STOPPING, FINISHED = "running", "stopping", "finished"


@dataclass
class JobHandle:
    spec: JobSpec
    dir: Path
    state: str = RUNNING
    pid: int | None = None
    pgid: int | None = None
    start_ticks: int | None = None
    started_at: float | None = None  # unix seconds
    adopted: bool = False
    popen: subprocess.Popen | None = field(default=None, repr=False)
    stop_reason: str | None = None  # not_desired | max_runtime | memory_slice_exceeded
    stop_deadline: float | None = None  # monotonic
    kill_sent: bool = False
    job_pid: int | None = None  # the job's first process (pgid == job_pid), from job.json
    grace_given_s: float | None = None  # from the stop to the job's end, as its supervisor measured it
    uid: int | None = None  # the job's own Unix user, where the agent isolates jobs
    outcome: str | None = None  # exited | stopped | killed | launch_failed | lost
    exit_code: int | None = None
    finished_at: float | None = None
    detail: str = ""
    reported: bool = False
    mps: str | None = None
    ports: dict[str, int] = field(default_factory=dict)  # its web ports as given on this node (name -> port)
    ports_ready: set[str] = field(default_factory=set)  # those that have answered a connection
    ports_said: tuple | None = None  # (ports, ready) as last reported to the portal
    image_said: bool = False  # its image's pull (pull.json) reported to the portal
    ports_owned: dict[str, frozenset[int]] = field(
        default_factory=dict
    )  # name -> the job's listening socket(s)

    @property
    def key(self) -> str:
        return self.spec.key

    @property
    def active(self) -> bool:
        return self.state in (RUNNING, STOPPING)

    def summary(self) -> dict:
        return {
            "job_id": self.spec.job_id,
            "attempt": self.spec.attempt,
            "state": self.state,
            "pid": self.pid,
            "started_at": self.started_at,
            "adopted": self.adopted,
            "stop_reason": self.stop_reason,
            "gpus": [g.uuid for g in self.spec.gpus],
        }


@dataclass(frozen=True)
class Transition:
    kind: str  # started | adopted | finished
    handle: JobHandle


def placement_dir(jobs_dir: Path, job_id: str, attempt: int | str) -> Path:
    return jobs_dir / safe_name(job_id) / str(attempt)


def write_private_json(path: Path, payload: dict) -> None:
    """Readable by this user only, whatever the umask: the agent's records are no job's business (a job's
    environment is in them)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(payload))
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_job_record(handle: JobHandle, *, wait_s: float = 0.0) -> None:
    """The job's own pid and group, once its supervisor has started it (job.json)."""
    deadline = time.monotonic() + wait_s
    while handle.job_pid is None:
        record = read_json(handle.dir / "job.json")
        if record is not None and isinstance(record.get("pid"), int):
            handle.job_pid = record["pid"]
            handle.pgid = int(record.get("pgid") or record["pid"])
            return
        if time.monotonic() >= deadline or (handle.dir / "exit.json").exists():
            return
        time.sleep(0.01)


def write_outcome(handle: JobHandle) -> None:
    """The agent's verdict on a finished placement, and whether the portal acknowledged it (outcome.json)."""
    write_private_json(
        handle.dir / "outcome.json",
        {
            "outcome": handle.outcome,
            "exit_code": handle.exit_code,
            "detail": handle.detail,
            "stop_reason": handle.stop_reason,
            "finished_at": handle.finished_at,
            "started_at": handle.started_at,
            "pid": handle.pid,
            "grace_given_s": handle.grace_given_s,
            "reported": handle.reported,
        },
    )


def restore_outcome(handle: JobHandle, outcome: dict) -> None:
    """A finished placement's handle as its outcome.json left it."""
    handle.state = FINISHED
    handle.outcome = outcome.get("outcome")
    handle.exit_code = outcome.get("exit_code")
    handle.detail = outcome.get("detail", "")
    handle.stop_reason = outcome.get("stop_reason")
    handle.finished_at = outcome.get("finished_at")
    handle.started_at = outcome.get("started_at")
    handle.pid = outcome.get("pid")
    handle.grace_given_s = outcome.get("grace_given_s")
    handle.reported = bool(outcome.get("reported"))


def restore_launch(handle: JobHandle, launch: dict) -> None:
    """A launched placement's handle as its launch.json left it (the agent adopts it)."""
    handle.pid = launch.get("pid")
    handle.start_ticks = launch.get("start_ticks")
    handle.started_at = launch.get("started_at")
    handle.mps = launch.get("mps")
    handle.uid = launch.get("uid")
    handle.ports = {str(k): int(v) for k, v in (launch.get("ports") or {}).items()}
    handle.adopted = True
