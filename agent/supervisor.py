"""Per-job supervisor: the one process that starts, stops and fences a job, and outlives the agent.

The agent starts `python supervisor.py JOB_DIR` in a session of its own for each placement. The supervisor reads
JOB_DIR/run.json (the command, its environment, working directory and log files, the stop grace, the max runtime,
and the fence: the agent's lease file and how long it may go unrenewed), starts the job in a process group of its
own, and from then on answers to the job directory, not to the agent:

- **stop**: the agent writes JOB_DIR/stop.json (reason, grace_s) and sends SIGUSR1. The job's group gets one
  SIGTERM, as does each descendant that left the group (never one in it twice), and the whole grace; whatever is
  left then gets SIGKILL. SIGTERM, SIGINT or SIGHUP to the supervisor itself (a host shutting down) stop the job
  the same way with run.json's grace.
- **max runtime**: enforced here, so it holds while the agent is down.
- **fence**: the agent renews its lease while the portal hears from it; once the lease is older than
  `fence_after_s` (the agent died, or lost the portal), the job is stopped as above. The portal re-places a silent
  node's jobs only after that deadline plus the grace has surely passed, so a placement never runs twice.
- **end**: the job has ended only when its first process has exited and nothing of it is left: no process in its
  group and no descendant (the supervisor is a child subreaper, so processes that left the group are still
  found). Anything left after the first process exits is stopped with the grace. Then JOB_DIR/exit.json records
  the exit code, the time the job really ended, and how it was stopped; an agent restarted meanwhile reads it.

Standard library only, and run with `-I`: it must not depend on anything the agent's environment provides.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5
PR_SET_CHILD_SUBREAPER = 36
_WAKE = (signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_SELF_STOP = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _write_atomic(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        json.dump(payload, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _log(path: str):
    """A log of the job's, appended to; the agent's to read, not other jobs' (0600 whatever the umask)."""
    return open(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")


def _read(path: str) -> dict | None:
    try:
        with open(path) as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name: [state, ppid, pgrp, session, ...] (None: no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in the process group."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry))
    return out


def _outside_group(pgid: int) -> list[int]:
    """This process's live descendants that are not in the process group: those that left the job's group (a
    session or group of their own), whether their parent is alive or they were re-parented here."""
    me, kids, group = os.getpid(), {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and fields[0] != "Z":
                kids.setdefault(int(fields[1]), []).append(int(entry))
                group[int(entry)] = int(fields[2])
    out, todo = [], list(kids.get(me, ()))
    while todo:
        pid = todo.pop()
        if group[pid] != pgid:
            out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


def _children() -> list[int]:
    """This process's live children (descendants that left the job's group are re-parented here)."""
    me, out = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and fields[0] != "Z" and int(fields[1]) == me:
                out.append(int(entry))
    return out


def _subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: processes that leave the group are not followed


def _lease_age_s(path: str | None) -> float | None:
    """Seconds since the agent last renewed its lease (monotonic clock, shared by the host's processes)."""
    if not path:
        return None
    lease = _read(path)
    if lease is None or not isinstance(lease.get("renewed_mono"), int | float):
        try:
            # No readable lease: count from the file's last change, else from now (a fresh agent dir).
            return max(0.0, time.time() - os.stat(path).st_mtime)
        except OSError:
            return None
    return max(0.0, time.monotonic() - float(lease["renewed_mono"]))


class Supervisor:
    def __init__(self, job_dir: str, run: dict) -> None:
        self.dir = job_dir
        self.run = run
        self.grace_s = float(run.get("grace_s") or 0.0)
        self.max_runtime_s = run.get("max_runtime_s")
        self.fence_after_s = run.get("fence_after_s")
        self.lease = run.get("lease")
        self.job: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.stop_reason: str | None = None
        self.stop_detail = ""
        self.stop_grace_s: float | None = None
        self.stopped_at: float | None = None  # monotonic
        self.killed = False
        self.started_mono = time.monotonic()
        self.oom_event: int | None = None  # an eventfd told when the job's cgroup runs out of memory (v1)

    # -- start --------------------------------------------------------------------------------------------------
    def start(self) -> bool:
        run = self.run
        env = {str(k): str(v) for k, v in (run.get("env") or {}).items()}
        if not self._image_ready():
            return False
        self.oom_event = _oom_listen((run.get("cgroup") or {}).get("oom_event"))
        try:
            with _log(run["stdout"]) as out, _log(run["stderr"]) as err:
                self.job = subprocess.Popen(
                    run["argv"],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=env,
                    cwd=run.get("cwd") or self.dir,
                    process_group=0,  # the job's own group: signalled as a whole, never the supervisor
                    close_fds=True,
                    preexec_fn=functools.partial(
                        _child_setup, run.get("user") or None, (run.get("cgroup") or {}).get("procs") or []
                    ),
                )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            message = f"tessera: cannot start {run['argv'][0]!r}: {exc}\n"
            try:
                with open(run["stderr"], "a") as err:
                    err.write(message)
            except OSError:
                pass
            self._finish(exit_code=127, error=str(exc))
            return False
        fields = _stat_fields(self.job.pid)
        _write_atomic(
            os.path.join(self.dir, "job.json"),
            {"pid": self.job.pid, "pgid": self.job.pid, "start_ticks": int(fields[19]) if fields else None},
        )
        return True

    def _image_ready(self) -> bool:
        """A job in an image: the image present first, as the pull policy says (pull.json records how long it
        took). A pull that fails ends the job `image_pull_failed` with the runtime's words; a stop meanwhile ends
        the pull and the job."""
        plan = (self.run.get("container") or {}).get("pull")
        if not plan:
            return True
        image, policy = str(plan.get("image")), str(plan.get("policy"))
        t0, record = time.monotonic(), {"image": image, "policy": policy, "started_at": time.time()}
        present = False
        if plan.get("exists") and policy != "always":
            present = _quiet(plan["exists"], timeout_s=120) == 0
        error = ""
        if not present and policy == "never":
            error = f"image {image} is not on this node, and the node's pull policy is never"
        elif not present:
            with open(os.path.join(self.dir, "pull.log"), "wb") as log:
                pull = subprocess.Popen(
                    plan["pull"], stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True
                )
                while pull.poll() is None:
                    got = signal.sigtimedwait(_WAKE, POLL_S)
                    if got is not None and got.si_signo in _SELF_STOP:
                        self.stop("supervisor_signalled", 0.0, f"the supervisor got signal {got.si_signo}")
                    elif self.stop_reason is None:
                        self._check_requests()
                    if self.stop_reason is not None:
                        pull.kill()
                        pull.wait()
                        self._finish(exit_code=None, error=f"stopped while pulling image {image}")
                        return False
            if pull.returncode != 0:
                words = _tail(os.path.join(self.dir, "pull.log")) or f"the pull exited with {pull.returncode}"
                error = f"cannot pull image {image}: {words}"
        record.update(
            present=present,
            pulled=not present and not error,
            pull_s=round(time.monotonic() - t0, 3),
            ok=not error,
        )
        if error:
            record["message"] = error
        _write_atomic(os.path.join(self.dir, "pull.json"), record)
        if not error:
            return True
        try:
            with open(self.run["stderr"], "a") as err:
                err.write(f"tessera: {error}\n")
        except OSError:
            pass
        self.stop_reason = "image_pull_failed"  # agent.protocol.IMAGE_PULL_FAILED
        self._finish(exit_code=None, error=error)
        return False

    # -- stop ---------------------------------------------------------------------------------------------------
    def stop(self, reason: str, grace_s: float, detail: str = "") -> None:
        if self.stop_reason is not None:
            return
        self.stop_reason, self.stop_detail = reason, detail
        self.stop_grace_s = max(0.0, grace_s)
        self.stopped_at = time.monotonic()
        self._signal_all(signal.SIGKILL if self.stop_grace_s <= 0 else signal.SIGTERM)
        self.killed = self.stop_grace_s <= 0

    def _signal_all(self, sig: int) -> None:
        """One signal to each process of the job: its group as a whole, and each descendant that left the group
        on its own (never one in the group: it has it already, and a second SIGTERM starts a checkpoint twice)."""
        if self.job is None:
            return
        outside = _outside_group(self.job.pid)  # found first: one that leaves meanwhile gets SIGKILL, not two
        try:
            os.killpg(self.job.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in outside:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _alive(self) -> bool:
        return bool(self.job is not None and _group_members(self.job.pid)) or bool(_children())

    # -- the loop -----------------------------------------------------------------------------------------------
    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.job is not None and pid == self.job.pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
                self.job.returncode = self.exit_code

    def _check_requests(self) -> None:
        request = _read(os.path.join(self.dir, "stop.json"))
        if request is not None:
            grace = request.get("grace_s")
            self.stop(
                str(request.get("reason") or "stop"),
                float(grace) if isinstance(grace, int | float) else self.grace_s,
            )
            return
        now = time.monotonic()
        if self.max_runtime_s is not None and now - self.started_mono >= float(self.max_runtime_s):
            self.stop("max_runtime", self.grace_s)
            return
        if self.fence_after_s is not None:
            age = _lease_age_s(self.lease)
            if age is not None and age > float(self.fence_after_s):
                self.stop(
                    "fenced",
                    self.grace_s,
                    f"no word from the agent or the portal for {age:.0f} s (the fence is {self.fence_after_s} s)",
                )

    def loop(self) -> None:
        while True:
            self._reap()
            if self.exit_code is not None and not self._alive():
                break
            if self.stop_reason is None:
                self._check_requests()
            if self.stop_reason is None and self.exit_code is not None:
                # The first process ended and left others behind: they go, with the grace.
                self.stop(
                    "leftover", self.grace_s, "processes left behind when the job's first process ended"
                )
            if (
                self.stop_reason is not None
                and not self.killed
                and time.monotonic() - (self.stopped_at or 0.0) >= (self.stop_grace_s or 0.0)
            ):
                self._signal_all(signal.SIGKILL)
                self.killed = True
            got = signal.sigtimedwait(_WAKE, POLL_S)
            if got is not None and got.si_signo in _SELF_STOP:
                self.stop("supervisor_signalled", self.grace_s, f"the supervisor got signal {got.si_signo}")
        self._finish(exit_code=self.exit_code)

    def _oom_killed(self) -> bool:
        """Whether the kernel killed a process of the job at its cgroup's memory limit (v2 memory.events, v1
        memory.oom_control: both count `oom_kill`; a container's, in a cgroup of its own under the job's, is heard
        by the job's cgroup going out of memory)."""
        if self.oom_event is not None:
            try:
                if os.eventfd_read(self.oom_event) > 0:
                    return True
            except OSError:  # nothing to read: no OOM
                pass
        path = (self.run.get("cgroup") or {}).get("oom")
        if not path:
            return False
        try:
            with open(path) as fh:
                for line in fh:
                    name, _, value = line.partition(" ")
                    if name == "oom_kill" and value.strip().isdigit():
                        return int(value) > 0
        except OSError:
            pass
        return False

    def _remove_container(self) -> None:
        """Nothing of a container job's container is left, whatever ended it (its client killed after the grace
        leaves the runtime's record of it)."""
        argv = (self.run.get("container") or {}).get("remove")
        if argv:
            _quiet(argv, timeout_s=60)

    def _remove_cgroups(self) -> None:
        """The job's cgroups, empty now, with any its runtime made under them (deepest first). A process killed a
        moment ago may still be leaving one (EBUSY): each is tried again for a short while."""
        deadline = time.monotonic() + 2.0
        dirs = []
        for top in (self.run.get("cgroup") or {}).get("dirs") or []:
            for below, subdirs, _files in os.walk(top, topdown=False):
                dirs += [os.path.join(below, s) for s in subdirs]
            dirs.append(top)
        for d in dirs:
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.02)

    def _finish(self, *, exit_code: int | None, error: str = "") -> None:
        grace_used = time.monotonic() - self.stopped_at if self.stopped_at is not None else None
        oom_killed = self._oom_killed()
        self._remove_container()
        self._remove_cgroups()
        _write_atomic(
            os.path.join(self.dir, "exit.json"),
            {
                "exit_code": exit_code,
                "finished_at": time.time(),
                "child_pid": self.job.pid if self.job is not None else None,
                "stop_reason": self.stop_reason,
                "stop_detail": self.stop_detail,
                "grace_s": self.stop_grace_s,
                "stopped_for_s": round(grace_used, 3) if grace_used is not None else None,
                "killed_after_grace": self.killed and self.stop_reason is not None,
                "oom_killed": oom_killed,
                "error": error,
            },
        )


def _quiet(argv: list[str], *, timeout_s: float) -> int | None:
    """Run a runtime command to its end, its output dropped: its exit code (None: it could not run, or ran
    past the timeout)."""
    try:
        return subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout_s,
            check=False,
            close_fds=True,
        ).returncode
    except (OSError, subprocess.SubprocessError):
        return None


def _tail(path: str, chars: int = 500) -> str:
    """A runtime's last word in its output: its last `Error:` line (Podman logs its retries before it), else its
    last line, at most `chars` long."""
    try:
        with open(path, "rb") as fh:
            text = fh.read()[-64 * 1024 :].decode(errors="replace")
    except OSError:
        return ""
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("Error", "FATAL", "ERROR"))]
    said = errors[-1] if errors else (lines[-1] if lines else "")
    return said.removeprefix("Error: ")[:chars]


def _oom_listen(paths: list[str] | None) -> int | None:
    """cgroup v1: an eventfd the kernel signals when the cgroup at `paths` (its cgroup.event_control and
    memory.oom_control) runs out of memory, its children included."""
    if not paths:
        return None
    try:
        efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        control = os.open(paths[1], os.O_RDONLY | os.O_CLOEXEC)  # kept open: the registration holds it
        with open(paths[0], "w") as fh:
            fh.write(f"{efd} {control}")
    except OSError:
        return None
    return efd


def _child_setup(user: dict | None, cgroup_procs: list[str]) -> None:
    """In the job's process, before exec: the signals the supervisor waits on unblocked again; into the job's
    cgroups (so everything it starts is limited and counted); then its own user, for good (no way back to
    root: real, effective and saved ids all change, and no supplementary group is kept)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for procs in cgroup_procs:
        with open(procs, "w") as fh:
            fh.write("0")
    if user:
        os.setgroups([])
        os.setgid(int(user["gid"]))
        os.setuid(int(user["uid"]))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: supervisor.py JOB_DIR", file=sys.stderr)
        return 2
    job_dir = argv[0]
    run = _read(os.path.join(job_dir, "run.json"))
    if run is None or not isinstance(run.get("argv"), list) or not run["argv"]:
        print(f"supervisor: no valid run.json in {job_dir}", file=sys.stderr)
        return 2
    signal.pthread_sigmask(signal.SIG_BLOCK, _WAKE)
    _subreaper()
    supervisor = Supervisor(job_dir, run)
    if supervisor.start():
        supervisor.loop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
