"""Runs jobs, each under its own supervisor (agent/supervisor.py), with their GPU environment; stops, logs, and
re-adopts them: the agent's record of its placements.

Each placement has a directory of its own (agent/placement.py): the agent's persisted state. A restarted agent
re-adopts a placement whose supervisor is still the one it launched (same pid, start time and command line) and
never launches it twice. The supervisor outlives the agent: it enforces the grace, the max runtime and the fence
(it stops the job once the agent's lease, renewed while the portal hears from the agent, is older than the
placement's fence) whether or not an agent is running. Starting one is agent/launch.py; stopping one and reading
how it ended, agent/ending.py.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from agent import procfs
from agent.backends.base import JobUsageHint
from agent.containers import Runtime
from agent.ending import ending_of, kill, overdue, stop_request, supervisor_exited
from agent.isolation import Isolation, IsolationError, close_job_tree
from agent.jobspec import JobSpec
from agent.launch import (
    LaunchError,
    job_env,
    ports_choose,
    record_launch,
    recover_launch,
    supervisor_run,
    supervisor_start,
)
from agent.mps import MpsController
from agent.placement import (
    FINISHED,
    RUNNING,
    JobHandle,
    Transition,
    placement_dir,
    read_job_record,
    read_json,
    restore_launch,
    restore_outcome,
    write_outcome,
    write_private_json,
)

LEASE_FILE = "lease.json"


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
        containers: Runtime | None = None,
        pull_policy: str = "if-not-present",
    ) -> None:
        self.work_dir = Path(work_dir)
        # The container runtime for jobs with an image (None: this node runs none) and when it pulls one.
        self.containers = containers
        self.pull_policy = pull_policy
        # Users, private directories and cgroup limits for jobs (None: jobs run as the agent's user, unlimited).
        self.isolation = isolation
        self.jobs_dir = self.work_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        if isolation is not None:
            isolation.open_work_dir(self.work_dir, self.jobs_dir)
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

    @property
    def _isolates(self) -> bool:
        return self.isolation is not None and self.isolation.isolates

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
        return placement_dir(self.jobs_dir, spec.job_id, spec.attempt)

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
        write_private_json(d / "spec.json", spec.to_dict())
        handle = JobHandle(spec=spec, dir=d)
        self._jobs[spec.key] = handle
        return handle, True

    def start(self, spec: JobSpec) -> JobHandle:
        """Launch a placement once, under its supervisor. Calling it again for the same job id and attempt returns
        the same handle."""
        handle, new = self._record(spec)
        if not new:
            return handle
        try:
            handle.ports = ports_choose(spec, taken={p for h in self.active() for p in h.ports.values()})
            # A job in an image gets none of the host's environment: its image has its own.
            env = job_env(spec, handle, base_env={} if spec.image else self.base_env, mps=self.mps)
            run = supervisor_run(
                spec,
                handle,
                env=env,
                fence_after_s=self.fence_after_s,
                lease_path=self.lease_path,
                isolation=self.isolation,
                uids_in_use={h.uid for h in self.active() if h.uid is not None},
                containers=self.containers,
                pull_policy=self.pull_policy,
            )
            popen, argv = supervisor_start(handle, run, python=self.python)
        except (OSError, LaunchError, IsolationError, ValueError, TypeError) as exc:  # ValueError: a NUL byte
            self._finish(handle, outcome="launch_failed", exit_code=None, detail=str(exc))
            return handle
        self.launches += 1
        record_launch(handle, popen, argv)
        read_job_record(handle, wait_s=2.0)
        self._transitions.append(Transition("started", handle))
        return handle

    def renew_lease(self) -> None:
        """The portal hears from this agent: the supervisors' fence starts counting again from now."""
        write_private_json(self.lease_path, {"renewed_mono": time.monotonic(), "renewed_at": time.time()})

    def reject(self, spec: JobSpec, reason: str) -> JobHandle:
        """Record a placement this node cannot run (as launch_failed) so it is reported once, never retried."""
        handle, new = self._record(spec)
        if not new:
            return handle
        self._finish(handle, outcome="launch_failed", exit_code=None, detail=reason)
        return handle

    # -- stop -----------------------------------------------------------------------------------------------
    def stop(self, key: str, *, reason: str, grace_s: float | None = None) -> JobHandle | None:
        """Ask the job's supervisor to stop it: SIGTERM to the job's processes, the grace, then SIGKILL to what
        is left. The placement ends once none of its processes is left (see poll())."""
        handle = self._jobs.get(key)
        if handle is None or handle.state != RUNNING:
            return handle
        grace = handle.spec.grace_s if grace_s is None else grace_s
        stop_request(handle, reason=reason, grace_s=grace, now=self.clock())
        return handle

    # -- progress ---------------------------------------------------------------------------------------------
    def poll(self) -> list[Transition]:
        """Notice ended placements (their supervisors exit once nothing of the job is left). Returns new
        transitions. Grace, max runtime and fence are the supervisors' to enforce."""
        before = len(self._transitions)
        now = self.clock()
        for handle in self.active():
            if handle.job_pid is None:
                read_job_record(handle)
            if supervisor_exited(handle):
                self._collect(handle)
            elif overdue(handle, now=now):
                kill(handle)  # the supervisor should have ended the job by now
        return self._transitions[before:]

    def _collect(self, handle: JobHandle) -> None:
        """The supervisor ended: the job with it, as its exit record says."""
        ending = ending_of(handle)
        self._finish(
            handle,
            outcome=ending.outcome,
            exit_code=ending.exit_code,
            detail=ending.detail,
            finished_at=ending.finished_at,
            grace_given_s=ending.grace_given_s,
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
        if self._isolates:
            close_job_tree(handle.dir)  # before its uid is free for another job
        handle.state = FINISHED
        handle.outcome = outcome
        handle.exit_code = exit_code
        handle.detail = detail
        handle.finished_at = finished_at if finished_at is not None else time.time()
        handle.grace_given_s = grace_given_s
        handle.popen = None
        write_outcome(handle)
        self._transitions.append(Transition("finished", handle))

    def mark_reported(self, key: str) -> None:
        """The portal acknowledged the job's final status: it need not be sent again after a restart."""
        handle = self._jobs.get(key)
        if handle is not None and handle.state == FINISHED and not handle.reported:
            handle.reported = True
            write_outcome(handle)

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
        data = read_json(spec_file)
        if data is None:
            return None
        try:
            spec = JobSpec.from_dict(data)
        except (KeyError, TypeError, ValueError):
            return None
        handle = JobHandle(spec=spec, dir=d)
        outcome = read_json(d / "outcome.json")
        launch = read_json(d / "launch.json")
        if outcome is not None:
            if self._isolates:
                close_job_tree(d)  # ended under an agent that left it open
            restore_outcome(handle, outcome)
            self._jobs[spec.key] = handle
            return handle
        if launch is None:
            launch = recover_launch(spec, d)
            if launch is None:
                if not (d / "exit.json").exists():
                    # Written down but never launched (the agent stopped in between): launch it afresh.
                    spec_file.unlink()
                    return None
                launch = {}
        restore_launch(handle, launch)
        read_job_record(handle)
        self._jobs[spec.key] = handle
        alive = handle.pid is not None and procfs.is_same_process(handle.pid, handle.start_ticks)
        if alive and launch.get("cmdline") not in (None, procfs.read_cmdline(handle.pid)):
            alive = False  # the pid was reused by something else
        if alive:
            self._transitions.append(Transition("adopted", handle))
        else:
            self._collect(handle)
        return handle

    # -- logs -------------------------------------------------------------------------------------------------
    def log_path(self, key: str, stream: str) -> Path:
        if stream not in ("stdout", "stderr"):
            raise ValueError("stream must be stdout or stderr")
        handle = self._jobs.get(key)
        if handle is None:
            job_id, _, attempt = key.rpartition(":")
            return placement_dir(self.jobs_dir, job_id, attempt) / f"{stream}.log"
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
