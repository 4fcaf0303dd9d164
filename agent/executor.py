"""Runs jobs, each under its own supervisor (agent/supervisor.py), with their GPU environment; stops, logs, and
re-adopts them.

Each placement (job id + attempt) gets a directory under <work_dir>/jobs/ holding its spec, what its supervisor
runs (run.json), the supervisor's launch record (pid, start time, command line), the job's own pid and group
(job.json), the stop request the agent writes (stop.json), the exit record the supervisor writes (exit.json), the
agent's outcome, and the job's stdout/stderr. That directory is the agent's persisted state: a restarted agent
re-adopts a placement whose supervisor is still the one it launched (same pid, start time and command line) and
never launches it twice. The supervisor outlives the agent: it enforces the grace, the max runtime and the fence
(it stops the job once the agent's lease, renewed while the portal hears from the agent, is older than the
placement's fence) whether or not an agent is running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent import procfs
from agent.backends.base import JobUsageHint
from agent.gang import gang_env
from agent.isolation import Isolation, IsolationError
from agent.jobspec import JobSpec, safe_name
from agent.mps import MpsController

SUPERVISOR = Path(__file__).resolve().parent / "supervisor.py"
LEASE_FILE = "lease.json"
# The agent stops a stop's supervisor itself only if, this long past the grace, the job has still not ended.
SUPERVISOR_SLACK_S = 30.0
# Variables of the agent that a job must never inherit.
_SECRET_PREFIXES = ("TESSERA_AGENT_TOKEN",)
_AGENT_SET = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_")

RUNNING, STOPPING, FINISHED = "running", "stopping", "finished"
ENFORCED_STOPS = ("max_runtime", "memory_slice_exceeded", "host_memory_exceeded")


class LaunchError(Exception):
    pass


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


def _write_json(path: Path, payload: dict) -> None:
    """Readable by this user only, whatever the umask: the agent's records are no job's business."""
    _write_private_json(path, payload)


def _check_launchable(run: dict) -> None:
    """What would make the supervisor's start fail, refused here so the agent reports it at once."""
    words = [*run["argv"], *run["env"].keys(), *run["env"].values(), run["cwd"]]
    if any("\0" in w for w in words):
        raise LaunchError("embedded null byte in the command, its environment or its working directory")
    if not os.path.isdir(run["cwd"]):
        raise LaunchError(f"the working directory {run['cwd']} does not exist on this node")


def _write_private_json(path: Path, payload: dict) -> None:
    """Readable by this user only (a job's environment is in it)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(payload))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Executor:
    def __init__(
        self,
        work_dir: str | Path,
        *,
        mps: MpsController | None = None,
        python: str = sys.executable,
        clock: Callable[[], float] = time.monotonic,
        base_env: dict[str, str] | None = None,
        fence_after_s: float | None = None,
        isolation: Isolation | None = None,
    ) -> None:
        self.work_dir = Path(work_dir)
        # Users, private directories and cgroup limits for jobs (None: jobs run as the agent's user, unlimited).
        self.isolation = isolation
        self.jobs_dir = self.work_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.mps = mps
        self.python = python
        self.clock = clock
        self.base_env = dict(os.environ if base_env is None else base_env)
        self._jobs: dict[str, JobHandle] = {}
        self._transitions: list[Transition] = []
        self.launches = 0  # processes started by this instance (tests and reconcile count on it)
        # The fence for placements that do not bring their own (None: supervisors never fence).
        self.fence_after_s = fence_after_s
        self.lease_path = self.work_dir / LEASE_FILE
        if not self.lease_path.exists():
            self.renew_lease()
        self._load()

    # -- queries --------------------------------------------------------------------------------------------
    def handle(self, key: str) -> JobHandle | None:
        return self._jobs.get(key)

    def handles(self) -> list[JobHandle]:
        return list(self._jobs.values())

    def active(self) -> list[JobHandle]:
        return [h for h in self._jobs.values() if h.active]

    def drain_transitions(self) -> list[Transition]:
        out, self._transitions = self._transitions, []
        return out

    def job_dir(self, spec: JobSpec) -> Path:
        return self.jobs_dir / safe_name(spec.job_id) / str(spec.attempt)

    # -- start ----------------------------------------------------------------------------------------------
    def _record(self, spec: JobSpec) -> tuple[JobHandle, bool]:
        """The placement's handle, and whether it is new: a placement known in memory or on disk (launched before
        and since forgotten from memory) keeps its record, never a second launch; a new one is written down."""
        existing = self._jobs.get(spec.key)
        if existing is not None:
            return existing, False
        d = self.job_dir(spec)
        if (d / "spec.json").exists():
            known = self._load_dir(d)
            if known is not None:
                return known, False
        d.mkdir(parents=True, exist_ok=True)
        _write_json(d / "spec.json", spec.to_dict())
        handle = JobHandle(spec=spec, dir=d)
        self._jobs[spec.key] = handle
        return handle, True

    def start(self, spec: JobSpec) -> JobHandle:
        """Launch a placement once, under its supervisor. Calling it again for the same job id and attempt returns
        the same handle."""
        handle, new = self._record(spec)
        if not new:
            return handle
        d = handle.dir
        try:
            env = self._job_env(spec, handle)
            env.update(gang_env(spec, d))  # a gang member's rendezvous variables and hostfile
            command = (
                list(spec.command) if isinstance(spec.command, tuple) else ["/bin/sh", "-c", spec.command]
            )
            fence = spec.fence_after_s if spec.fence_after_s is not None else self.fence_after_s
            cwd, user, cgroup = spec.cwd or str(d), None, {}
            if self.isolation is not None and self.isolation.isolates:
                identity = self.isolation.identity(
                    user=spec.user, in_use={h.uid for h in self.active() if h.uid is not None}
                )
                work = self.isolation.private_dir(d, identity)
                cwd = spec.cwd or str(work)
                cgroup = self.isolation.cgroup_for(
                    name=safe_name(spec.key), memory_mib=spec.memory_mib, cpu_milli=spec.cpu_milli
                )
                if identity is not None:
                    user = {"uid": identity.uid, "gid": identity.gid}
                    handle.uid = identity.uid
                    env.update(
                        {"HOME": identity.home or str(work), "USER": identity.name, "LOGNAME": identity.name}
                    )
            run = {
                "argv": command,
                "env": env,
                "cwd": cwd,
                "user": user,
                "cgroup": cgroup,
                "stdout": str(d / "stdout.log"),
                "stderr": str(d / "stderr.log"),
                "grace_s": spec.grace_s,
                "max_runtime_s": spec.max_runtime_s,
                "fence_after_s": fence,
                "lease": str(self.lease_path) if fence is not None else None,
            }
            _check_launchable(run)
            _write_private_json(d / "run.json", run)
            argv = [self.python, "-I", str(SUPERVISOR), str(d)]
            with open(d / "supervisor.log", "ab") as log_file:
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=log_file,
                    # Only what finds it again after an agent crash (`_recover_launch`).
                    env={"TESSERA_PLACEMENT": spec.key, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                    cwd=str(d),
                    start_new_session=True,  # its own session: the agent's end (or its terminal's) is not its
                    close_fds=True,
                )
        except (OSError, LaunchError, IsolationError, ValueError, TypeError) as exc:  # ValueError: a NUL byte
            self._finish(handle, outcome="launch_failed", exit_code=None, detail=str(exc))
            return handle
        self.launches += 1
        handle.popen = popen
        handle.pid = popen.pid
        stat = procfs.read_stat(popen.pid)
        handle.start_ticks = stat.start_ticks if stat else None
        handle.started_at = time.time()
        _write_json(
            d / "launch.json",
            {
                "pid": handle.pid,
                "start_ticks": handle.start_ticks,
                "cmdline": argv,
                "started_at": handle.started_at,
                "mps": handle.mps,
                "uid": handle.uid,
            },
        )
        self._read_job_record(handle, wait_s=2.0)
        self._transitions.append(Transition("started", handle))
        return handle

    def _read_job_record(self, handle: JobHandle, *, wait_s: float = 0.0) -> None:
        """The job's own pid and group, once its supervisor has started it (job.json)."""
        deadline = time.monotonic() + wait_s
        while handle.job_pid is None:
            record = _read_json(handle.dir / "job.json")
            if record is not None and isinstance(record.get("pid"), int):
                handle.job_pid = record["pid"]
                handle.pgid = int(record.get("pgid") or record["pid"])
                return
            if time.monotonic() >= deadline or (handle.dir / "exit.json").exists():
                return
            time.sleep(0.01)

    def renew_lease(self) -> None:
        """The portal hears from this agent: the supervisors' fence starts counting again from now."""
        _write_json(self.lease_path, {"renewed_mono": time.monotonic(), "renewed_at": time.time()})

    def reject(self, spec: JobSpec, reason: str) -> JobHandle:
        """Record a placement this node cannot run (as launch_failed) so it is reported once, never retried."""
        handle, new = self._record(spec)
        if not new:
            return handle
        self._finish(handle, outcome="launch_failed", exit_code=None, detail=reason)
        return handle

    def _job_env(self, spec: JobSpec, handle: JobHandle) -> dict[str, str]:
        env = {
            k: v
            for k, v in self.base_env.items()
            if not k.startswith(_SECRET_PREFIXES) and not k.startswith(_AGENT_SET)
        }
        env.update({k: v for k, v in spec.env.items() if not k.startswith(_AGENT_SET)})
        env["TESSERA_JOB_ID"] = spec.job_id
        env["TESSERA_ATTEMPT"] = str(spec.attempt)
        env["TESSERA_PLACEMENT"] = spec.key
        # Selects (does not fence) the job's GPUs; UUIDs so a renumbered host cannot shift a job.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in spec.gpus)
        if any(g.sharing == "mps" for g in spec.gpus):
            status = self.mps.ensure_running() if self.mps is not None else None
            handle.mps = status.message if status is not None else "no MPS controller configured"
            pcts = [g.compute_pct for g in spec.gpus if g.sharing == "mps" and g.compute_pct is not None]
            limits = [g.memory_mib if g.sharing == "mps" else None for g in spec.gpus]
            client = (
                self.mps.client_env(active_thread_pct=min(pcts) if pcts else None, memory_limits_mib=limits)
                if self.mps is not None
                else {}
            )
            env.update(client)
        return env

    # -- stop -----------------------------------------------------------------------------------------------
    def stop(self, key: str, *, reason: str, grace_s: float | None = None) -> JobHandle | None:
        """Ask the job's supervisor to stop it: SIGTERM to the job's processes, the grace, then SIGKILL to what
        is left. The placement ends once none of its processes is left (see poll())."""
        handle = self._jobs.get(key)
        if handle is None or handle.state != RUNNING:
            return handle
        grace = handle.spec.grace_s if grace_s is None else grace_s
        handle.state = STOPPING
        handle.stop_reason = reason
        handle.stop_deadline = self.clock() + max(0.0, grace)
        handle.kill_sent = grace <= 0
        _write_json(
            handle.dir / "stop.json", {"reason": reason, "grace_s": max(0.0, grace), "at": time.time()}
        )
        self._signal_supervisor(handle, signal.SIGUSR1)
        return handle

    def _signal_supervisor(self, handle: JobHandle, sig: int) -> None:
        if handle.pid is None or not procfs.is_same_process(handle.pid, handle.start_ticks):
            return
        try:
            os.kill(handle.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _signal_group(self, handle: JobHandle, sig: int) -> None:
        if handle.pgid is None:
            return
        try:
            os.killpg(handle.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    # -- progress ---------------------------------------------------------------------------------------------
    def poll(self) -> list[Transition]:
        """Notice ended placements (their supervisors exit once nothing of the job is left). Returns new
        transitions. Grace, max runtime and fence are the supervisors' to enforce."""
        before = len(self._transitions)
        now = self.clock()
        for handle in self.active():
            if handle.job_pid is None:
                self._read_job_record(handle)
            if self._exited(handle):
                self._collect(handle)
            elif (
                handle.state == STOPPING
                and now >= (handle.stop_deadline or now) + SUPERVISOR_SLACK_S
                and not handle.kill_sent
            ):
                # The supervisor should have ended the job by now: end it here (its group, then the supervisor).
                self._signal_group(handle, signal.SIGKILL)
                self._signal_supervisor(handle, signal.SIGKILL)
                handle.kill_sent = True
        return self._transitions[before:]

    def _exited(self, handle: JobHandle) -> bool:
        if handle.popen is not None:
            # WNOWAIT keeps the zombie, so its pid cannot be reused before it is collected.
            try:
                return os.waitid(os.P_PID, handle.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
            except ChildProcessError:
                return True
        return handle.pid is None or not procfs.is_same_process(handle.pid, handle.start_ticks)

    def _collect(self, handle: JobHandle) -> None:
        """The supervisor ended: the job with it, as its exit record says."""
        if handle.popen is not None:
            handle.popen.wait()
        record = _read_json(handle.dir / "exit.json")
        if record is None and handle.pgid is not None and procfs.group_members(handle.pgid):
            # The supervisor itself was killed: nothing may outlive it unwatched.
            self._signal_group(handle, signal.SIGKILL)
        exit_code = record.get("exit_code") if record is not None else None
        stop_reason = handle.stop_reason or (record.get("stop_reason") if record is not None else None)
        if stop_reason == "leftover":
            stop_reason = None  # it ended on its own; what it left behind was stopped
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
        self._finish(
            handle,
            outcome=outcome,
            exit_code=exit_code,
            detail=detail,
            finished_at=finished_at if isinstance(finished_at, int | float) else None,
            grace_given_s=record.get("stopped_for_s") if record is not None else None,
        )

    def _finish(
        self,
        handle: JobHandle,
        *,
        outcome: str,
        exit_code: int | None,
        detail: str,
        finished_at: float | None = None,
        grace_given_s: float | None = None,
    ) -> None:
        handle.state = FINISHED
        handle.outcome = outcome
        handle.exit_code = exit_code
        handle.detail = detail
        handle.finished_at = finished_at if finished_at is not None else time.time()
        handle.grace_given_s = grace_given_s
        handle.popen = None
        _write_json(handle.dir / "outcome.json", self._outcome_record(handle))
        self._transitions.append(Transition("finished", handle))

    def _outcome_record(self, handle: JobHandle) -> dict:
        return {
            "outcome": handle.outcome,
            "exit_code": handle.exit_code,
            "detail": handle.detail,
            "stop_reason": handle.stop_reason,
            "finished_at": handle.finished_at,
            "started_at": handle.started_at,
            "pid": handle.pid,
            "grace_given_s": handle.grace_given_s,
            "reported": handle.reported,
        }

    def mark_reported(self, key: str) -> None:
        """The portal acknowledged the job's final status: it need not be sent again after a restart."""
        handle = self._jobs.get(key)
        if handle is not None and handle.state == FINISHED and not handle.reported:
            handle.reported = True
            _write_json(handle.dir / "outcome.json", self._outcome_record(handle))

    def forget(self, key: str) -> None:
        """Drop a reported, finished placement from memory (its directory and logs stay on disk)."""
        handle = self._jobs.get(key)
        if handle is not None and handle.state == FINISHED and handle.reported:
            del self._jobs[key]

    def prune(self, *, older_than_s: float, keep: set[str] = frozenset()) -> list[str]:
        """Delete directories (logs included) of reported placements that finished more than older_than_s ago."""
        import shutil

        removed = []
        now = time.time()
        for handle in [
            h for h in self._jobs.values() if h.state == FINISHED and h.reported and h.key not in keep
        ]:
            if handle.finished_at is not None and now - handle.finished_at >= older_than_s:
                shutil.rmtree(handle.dir, ignore_errors=True)
                del self._jobs[handle.key]
                removed.append(handle.key)
        return removed

    def wait(self, key: str, timeout_s: float, *, interval_s: float = 0.05) -> JobHandle | None:
        """Poll until the placement finished or timeout_s passed (for the CLI and tests)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.poll()
            handle = self._jobs.get(key)
            if handle is None or handle.state == FINISHED:
                return handle
            time.sleep(interval_s)
        return self._jobs.get(key)

    # -- restart adoption ---------------------------------------------------------------------------------------
    def _load(self) -> None:
        for spec_file in sorted(self.jobs_dir.glob("*/*/spec.json")):
            self._load_dir(spec_file.parent)

    def _load_dir(self, d: Path) -> JobHandle | None:
        """Rebuild a placement's handle from its directory: finished, adopted (still running), or collected."""
        spec_file = d / "spec.json"
        data = _read_json(spec_file)
        if data is None:
            return None
        try:
            spec = JobSpec.from_dict(data)
        except (KeyError, TypeError, ValueError):
            return None
        handle = JobHandle(spec=spec, dir=d)
        outcome = _read_json(d / "outcome.json")
        launch = _read_json(d / "launch.json")
        if outcome is not None:
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
            self._jobs[spec.key] = handle
            return handle
        if launch is None:
            launch = self._recover_launch(spec, d)
            if launch is None:
                if not (d / "exit.json").exists():
                    # Written down but never launched (the agent stopped in between): launch it afresh.
                    spec_file.unlink()
                    return None
                launch = {}
        handle.pid = launch.get("pid")
        handle.start_ticks = launch.get("start_ticks")
        handle.started_at = launch.get("started_at")
        handle.mps = launch.get("mps")
        handle.uid = launch.get("uid")
        handle.adopted = True
        self._read_job_record(handle)
        self._jobs[spec.key] = handle
        alive = handle.pid is not None and procfs.is_same_process(handle.pid, handle.start_ticks)
        if alive and launch.get("cmdline") not in (None, procfs.read_cmdline(handle.pid)):
            alive = False  # the pid was reused by something else
        if alive:
            self._transitions.append(Transition("adopted", handle))
        else:
            self._collect(handle)
        return handle

    def _recover_launch(self, spec: JobSpec, d: Path) -> dict | None:
        """The launch record is missing: find the supervisor by the placement marker in its environment."""
        for pid in procfs.find_by_env(f"TESSERA_PLACEMENT={spec.key}"):
            st = procfs.read_stat(pid)
            cmdline = procfs.read_cmdline(pid) or []
            # Ours, for this very directory: another agent's work dir could hold the same placement.
            if st is not None and st.pid == st.session and str(d) in cmdline:
                launch = {
                    "pid": pid,
                    "start_ticks": st.start_ticks,
                    "cmdline": cmdline,
                    "started_at": time.time(),
                }
                _write_json(d / "launch.json", launch)
                return launch
        return None

    # -- logs -------------------------------------------------------------------------------------------------
    def log_path(self, key: str, stream: str) -> Path:
        if stream not in ("stdout", "stderr"):
            raise ValueError("stream must be stdout or stderr")
        handle = self._jobs.get(key)
        if handle is None:
            job_id, _, attempt = key.rpartition(":")
            return self.jobs_dir / safe_name(job_id) / attempt / f"{stream}.log"
        return handle.dir / f"{stream}.log"

    def read_log(
        self, key: str, stream: str, *, offset: int = 0, limit_bytes: int = 1 << 20
    ) -> tuple[bytes, int]:
        """Bytes of a log from offset (at most limit_bytes) and the file's size, for paging through it."""
        path = self.log_path(key, stream)
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(max(0, offset))
                return fh.read(max(0, limit_bytes)), size
        except FileNotFoundError:
            return b"", 0

    def tail_log(self, key: str, stream: str, *, lines: int = 50, max_bytes: int = 256 * 1024) -> list[str]:
        """The last `lines` lines of a log (reading at most max_bytes from its end)."""
        path = self.log_path(key, stream)
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(max(0, size - max_bytes))
                data = fh.read()
        except FileNotFoundError:
            return []
        text = data.decode(errors="replace").splitlines()
        return text[-lines:] if lines > 0 else []

    # -- for the simulated backend -------------------------------------------------------------------------------
    def usage_hints(self) -> list[JobUsageHint]:
        hints = []
        for h in self.active():
            pid = h.job_pid or h.pid
            if pid is None:
                continue
            util = h.spec.env.get("TESSERA_SIM_UTIL_PCT")
            mem = h.spec.env.get("TESSERA_SIM_MEMORY_MIB")
            shares = [g.compute_pct for g in h.spec.gpus if g.compute_pct is not None]
            hints.append(
                JobUsageHint(
                    pid=pid,
                    gpu_uuids=tuple(g.uuid for g in h.spec.gpus),
                    util_pct=float(util) if util is not None else float(min(shares) if shares else 100),
                    memory_mib={
                        g.uuid: int(mem)
                        if mem is not None
                        else (g.memory_mib if g.memory_mib is not None else -1)
                        for g in h.spec.gpus
                    },
                )
            )
        return hints
