"""How a placement ends: the stop the agent asks of its supervisor, the signals for a supervisor that does not
answer, whether the supervisor has ended, and what its exit record says of how the job ended."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from agent import procfs
from agent.placement import STOPPING, JobHandle, read_json, write_private_json
from agent.protocol import IMAGE_PULL_FAILED

# The agent stops a stop's supervisor itself only if, this long past the grace, the job has still not ended.
SUPERVISOR_SLACK_S = 30.0
ENFORCED_STOPS = ("max_runtime", "memory_slice_exceeded", "host_memory_exceeded")


def stop_request(handle: JobHandle, *, reason: str, grace_s: float, now: float) -> None:
    """Write the stop (stop.json) and wake the supervisor: SIGTERM to the job's processes, the grace, then
    SIGKILL to what is left. `now` is on the agent's monotonic clock."""
    handle.state = STOPPING
    handle.stop_reason = reason
    handle.stop_deadline = now + max(0.0, grace_s)
    handle.kill_sent = grace_s <= 0
    write_private_json(
        handle.dir / "stop.json", {"reason": reason, "grace_s": max(0.0, grace_s), "at": time.time()}
    )
    signal_supervisor(handle, signal.SIGUSR1)


def overdue(handle: JobHandle, *, now: float) -> bool:
    """Whether a stop's supervisor should have ended the job by now and has not been killed for it."""
    return (
        handle.state == STOPPING
        and now >= (handle.stop_deadline or now) + SUPERVISOR_SLACK_S
        and not handle.kill_sent
    )


def kill(handle: JobHandle) -> None:
    """End an overdue stop here: the job's group, then its supervisor."""
    signal_group(handle, signal.SIGKILL)
    signal_supervisor(handle, signal.SIGKILL)
    handle.kill_sent = True


def signal_supervisor(handle: JobHandle, sig: int) -> None:
    if handle.pid is None or not procfs.is_same_process(handle.pid, handle.start_ticks):
        return
    try:
        os.kill(handle.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def signal_group(handle: JobHandle, sig: int) -> None:
    if handle.pgid is None:
        return
    try:
        os.killpg(handle.pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def supervisor_exited(handle: JobHandle) -> bool:
    if handle.popen is not None:
        # WNOWAIT keeps the zombie, so its pid cannot be reused before it is collected.
        try:
            return os.waitid(os.P_PID, handle.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True
    return handle.pid is None or not procfs.is_same_process(handle.pid, handle.start_ticks)


@dataclass(frozen=True)
class Ending:
    outcome: str  # exited | stopped | killed | lost
    exit_code: int | None
    detail: str
    finished_at: float | None  # unix seconds, as the supervisor recorded it
    grace_given_s: float | None


def ending_of(handle: JobHandle) -> Ending:
    """The supervisor ended: the job with it, as its exit record says. Notes on the handle why it was stopped
    and whether it was killed after its grace."""
    if handle.popen is not None:
        handle.popen.wait()
    record = read_json(handle.dir / "exit.json")
    if record is None and handle.pgid is not None and procfs.group_members(handle.pgid):
        # The supervisor itself was killed: nothing may outlive it unwatched.
        signal_group(handle, signal.SIGKILL)
    exit_code = record.get("exit_code") if record is not None else None
    stop_reason = handle.stop_reason or (record.get("stop_reason") if record is not None else None)
    if stop_reason == "leftover":
        stop_reason = None  # it ended on its own; what it left behind was stopped
    if stop_reason == IMAGE_PULL_FAILED and record is not None:
        # Its image never came: it did not start, as a launch that failed (the runtime's words in the detail).
        handle.stop_reason = None
        return Ending(
            outcome="launch_failed",
            exit_code=None,
            detail=f"{IMAGE_PULL_FAILED}: {record.get('error') or 'the image could not be pulled'}",
            finished_at=record.get("finished_at")
            if isinstance(record.get("finished_at"), int | float)
            else None,
            grace_given_s=None,
        )
    if stop_reason is None and record is not None and record.get("oom_killed"):
        stop_reason = "host_memory_exceeded"  # the kernel killed it at its cgroup's memory limit
    handle.stop_reason = stop_reason
    if record is not None and record.get("killed_after_grace"):
        handle.kill_sent = True
    if record is None:
        outcome, detail = "lost", "its supervisor ended without an exit record"
    elif stop_reason is None:
        outcome, detail = ("exited" if exit_code is not None else "lost"), record.get("error") or ""
    elif stop_reason in ENFORCED_STOPS:
        # Enforcement ends a job against its will ("killed"); the portal's or agent's decisions "stop" it.
        outcome, detail = "killed", stop_reason
    else:
        outcome, detail = "stopped", record.get("stop_detail") or stop_reason
    finished_at = record.get("finished_at") if record is not None else None
    return Ending(
        outcome=outcome,
        exit_code=exit_code,
        detail=detail,
        finished_at=finished_at if isinstance(finished_at, int | float) else None,
        grace_given_s=record.get("stopped_for_s") if record is not None else None,
    )
