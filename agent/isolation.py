"""Isolation of jobs on their host: each job its own Unix user, a private working directory, and cgroup limits on
CPU and host memory. Only an agent running as root can do this; `tessera-agent check` says what this host can.

- **Users** (`TESSERA_AGENT_JOB_USERS`): `pool` (the default as root) gives each running job a uid of its own from
  `TESSERA_AGENT_UID_POOL` (`60000-60999`; the gid is the same number, no /etc/passwd entry is needed);
  `account` runs each job as the Unix account named like its submitter, as Slurm does (the site maps portal
  users to accounts); `agent` runs jobs as the agent's own user (no isolation, the only choice without root).
- **The job's tree**: the placement's directory is the agent's (its records, mode 600) and only the job's group may
  pass through it (710, root and the job's gid); in it the job owns `work` (its `HOME` and default `cwd`) and `tmp`
  (its `TMPDIR`), mode 700, and reads its gang's `hostfile`. The agent's work dir, `jobs/` and `jobs/<id>/` are
  711: passable, not listable. Once the job has ended its `tmp` is removed and its directory closed (700): the
  pool hands its uid to later jobs.
- **cgroups**: a job's host memory (`memory_mib`) and CPU (`cpu_milli`) requests become limits: cgroup v2
  (`memory.max`, `memory.swap.max`, `cpu.max`) where the unified hierarchy has the memory and cpu controllers,
  else cgroup v1 (`memory.limit_in_bytes`, `cpu.cfs_quota_us`). A job past its memory is killed by the kernel and
  reported `host_memory_exceeded`.
- **GPU devices** (cgroup v1's devices controller): a job may open only its own cards' `/dev/nvidiaN`, the driver's
  control devices (`nvidiactl`, `nvidia-modeset`, `nvidia-uvm*`, `nvidia-caps`) and the ordinary ones (`null`,
  `zero`, `random`, `urandom`, `tty`, `ptmx`, `pts`): `CUDA_VISIBLE_DEVICES` only selects, this fences. On a
  cgroup-v2-only host the fence would be a BPF program (as runc attaches); it is not done there.

The agent prepares all of it (it is root); the supervisor moves the job into its cgroups and drops to its user
just before the command starts.
"""

from __future__ import annotations

import os
import pwd
import shutil
from dataclasses import dataclass
from pathlib import Path

from agent.containers import RUNTIME_DEVICES

CGROUP_ROOT = Path("/sys/fs/cgroup")
DEFAULT_UID_POOL = (60000, 60999)
MODES = ("pool", "account", "agent")
CPU_PERIOD_US = 100_000
# The devices fence (cgroup v1): what every job may open, besides its own cards and the driver's control devices.
NVIDIA_MAJOR = 195  # /dev/nvidiaN is 195:N; nvidiactl 195:255, nvidia-modeset 195:254
DEVICES_ALWAYS = (
    "c *:* m",  # mknod, as runc allows (opening is what is fenced)
    "b *:* m",
    "c 1:3 rwm",  # null
    "c 1:5 rwm",  # zero
    "c 1:7 rwm",  # full
    "c 1:8 rwm",  # random
    "c 1:9 rwm",  # urandom
    "c 5:0 rwm",  # tty
    "c 5:2 rwm",  # ptmx
    "c 136:* rwm",  # pts
    f"c {NVIDIA_MAJOR}:255 rwm",  # nvidiactl
    f"c {NVIDIA_MAJOR}:254 rwm",  # nvidia-modeset
)
# Character devices of the driver, by their name in /proc/devices (majors are given at load): every minor.
NVIDIA_CONTROL_DEVICES = (
    "nvidia-uvm",
    "nvidia-caps",
    "nvidia-nvswitch",
    "nvidia-nvlink",
    "nvidia-caps-imex-channels",
)
HOME_DIR, TMP_DIR = "work", "tmp"  # in a placement's directory: the job's own
TESSERA_CGROUP = "tessera"  # each hierarchy's directory of job cgroups


class IsolationError(Exception):
    """This job cannot be isolated as configured (the agent reports it as a launch failure)."""


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    name: str
    home: str | None = None  # an account's home; a pool user's is its working directory


@dataclass(frozen=True)
class JobTree:
    """What an isolated job owns in its placement's directory."""

    home: Path  # its HOME (a pool user's; an account keeps its own) and its default working directory
    tmp: Path  # its TMPDIR


def close_job_tree(job_dir: Path) -> None:
    """The job has ended: its TMPDIR goes and its directory is closed to its uid, which a later job may get."""
    try:
        os.chmod(job_dir, 0o700)
    except FileNotFoundError:
        return
    shutil.rmtree(job_dir / TMP_DIR, ignore_errors=True)


@dataclass(frozen=True)
class Cgroups:
    """Where this host's cgroup limits go: `version` 2 (one directory) or 1 (a memory and a cpu hierarchy)."""

    version: int
    memory: Path | None  # the parent under which each job gets a directory
    cpu: Path | None

    @property
    def limits(self) -> str:
        return f"cgroup v{self.version}: " + ", ".join(
            part for part, where in (("memory", self.memory), ("cpu", self.cpu)) if where is not None
        )


def _v2_root(root: Path) -> Path | None:
    for candidate in (root, root / "unified"):
        if (candidate / "cgroup.controllers").exists():
            return candidate
    return None


def detect_cgroups(root: Path = CGROUP_ROOT) -> Cgroups | None:
    """The cgroup hierarchy this host lets a root agent limit jobs with (None: none usable)."""
    v2 = _v2_root(root)
    if v2 is not None:
        try:
            controllers = set((v2 / "cgroup.controllers").read_text().split())
        except OSError:
            controllers = set()
        if {"memory", "cpu"} <= controllers:
            return Cgroups(2, v2 / TESSERA_CGROUP, v2 / TESSERA_CGROUP)
    memory, cpu = root / "memory", root / "cpu"
    if (memory / "memory.limit_in_bytes").exists():
        return Cgroups(
            1, memory / TESSERA_CGROUP, cpu / TESSERA_CGROUP if (cpu / "cpu.cfs_quota_us").exists() else None
        )
    return None


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def devices_root(root: Path = CGROUP_ROOT) -> Path | None:
    """Where each job's devices fence goes (cgroup v1's devices hierarchy), None where this host has none."""
    hierarchy = root / "devices"
    return hierarchy / TESSERA_CGROUP if (hierarchy / "devices.allow").exists() else None


def device_rules(
    gpu_indexes: list[int], proc_devices: Path = Path("/proc/devices"), *, runtime: bool = False
) -> list[str]:
    """The devices a job may open: the ordinary ones, the driver's control devices, and its own cards; for a job in
    a container, also those its runtime allows every container (a child cgroup cannot allow more than this)."""
    rules = list(DEVICES_ALWAYS) + (list(RUNTIME_DEVICES) if runtime else [])
    try:
        lines = proc_devices.read_text().splitlines()
    except OSError:
        lines = []
    char = False
    for line in lines:
        if line.strip().endswith("devices:"):
            char = line.startswith("Character")
            continue
        major, _, name = line.strip().partition(" ")
        if char and name.strip() in NVIDIA_CONTROL_DEVICES and major.isdigit():
            rules.append(f"c {major}:* rwm")
    rules += [f"c {NVIDIA_MAJOR}:{i} rwm" for i in sorted(set(gpu_indexes))]
    return rules


class Isolation:
    def __init__(
        self,
        *,
        mode: str | None = None,
        uid_pool: tuple[int, int] = DEFAULT_UID_POOL,
        cgroup_root: Path = CGROUP_ROOT,
        euid: int | None = None,
    ) -> None:
        self.root = (os.geteuid() if euid is None else euid) == 0
        chosen = mode or ("pool" if self.root else "agent")
        if chosen not in MODES:
            raise IsolationError(
                f"TESSERA_AGENT_JOB_USERS must be one of {', '.join(MODES)} (got {chosen!r})"
            )
        if chosen != "agent" and not self.root:
            raise IsolationError(f"TESSERA_AGENT_JOB_USERS={chosen} needs the agent to run as root")
        low, high = uid_pool
        if not 0 < low <= high:
            raise IsolationError(
                f"TESSERA_AGENT_UID_POOL must be FIRST-LAST with 0 < FIRST <= LAST (got {low}-{high})"
            )
        self.mode = chosen
        self.uid_pool = uid_pool
        self.cgroup_root = cgroup_root
        self.cgroups = detect_cgroups(cgroup_root) if self.root else None
        self.devices = devices_root(cgroup_root) if self.root else None

    @property
    def isolates(self) -> bool:
        return self.mode != "agent"

    # -- users -------------------------------------------------------------------------------------------------
    def identity(self, *, user: str | None, in_use: set[int]) -> Identity | None:
        """The Unix identity a job runs as (None: the agent's own)."""
        if self.mode == "agent":
            return None
        if self.mode == "account":
            if not user:
                raise IsolationError("jobs run as their submitter's account, and this placement names none")
            try:
                entry = pwd.getpwnam(user)
            except KeyError:
                raise IsolationError(
                    f"no Unix account {user!r} on this node for the job's submitter"
                ) from None
            if entry.pw_uid == 0:
                raise IsolationError(f"account {user!r} is root: jobs never run as root")
            return Identity(entry.pw_uid, entry.pw_gid, user, entry.pw_dir)
        low, high = self.uid_pool
        for uid in range(low, high + 1):
            if uid not in in_use:
                return Identity(uid, uid, f"tessera-{uid}")
        raise IsolationError(f"every uid of the pool {low}-{high} is in use by a running job")

    def open_work_dir(self, work_dir: Path, jobs_dir: Path) -> None:
        """The agent's work dir and its jobs/: a job may pass through them to its own placement, not list them."""
        if self.isolates:
            for d in (work_dir, jobs_dir):
                os.chmod(d, 0o711)

    def job_tree(self, job_dir: Path, identity: Identity) -> JobTree:
        """Open the placement's directory to its job: passable by the job's group alone, with a home and a TMPDIR
        of the job's own in it. Modes are set, not left to the umask (the agent's is 077)."""
        os.chmod(job_dir.parent, 0o711)  # jobs/<id>/: each attempt's job passes through to its own
        os.chown(job_dir, -1, identity.gid)
        os.chmod(job_dir, 0o710)
        tree = JobTree(home=job_dir / HOME_DIR, tmp=job_dir / TMP_DIR)
        for d in (tree.home, tree.tmp):
            d.mkdir(mode=0o700, exist_ok=True)
            os.chown(d, identity.uid, identity.gid)
            os.chmod(d, 0o700)
        return tree

    # -- cgroups -----------------------------------------------------------------------------------------------
    def cgroup_for(
        self,
        *,
        name: str,
        memory_mib: int | None,
        cpu_milli: int | None,
        gpu_indexes: list[int] | None = None,
        container: bool = False,
    ) -> dict:
        """Create the job's cgroups with its limits and its devices fence; what the supervisor needs to join and
        watch them. A container job's runtime puts the container in a cgroup of its own under these (`parent`), so
        the limits and the fence hold there too; it makes the same directory in every other hierarchy, removed
        with the job's."""
        if not self.isolates:
            return {}
        limits = self._limits_for(name=name, memory_mib=memory_mib, cpu_milli=cpu_milli)
        if self.devices is not None and gpu_indexes is not None:
            fence = self.devices / name
            fence.mkdir(parents=True, exist_ok=True)
            _write(fence / "devices.deny", "a")
            for rule in device_rules(gpu_indexes, runtime=container):
                _write(fence / "devices.allow", rule)
            limits = {
                **limits,
                "dirs": [*limits.get("dirs", []), str(fence)],
                "procs": [*limits.get("procs", []), str(fence / "cgroup.procs")],
            }
        if not container or self.cgroups is None:
            return limits
        out = {**limits, "parent": f"/{TESSERA_CGROUP}/{name}"}
        if self.cgroups.version == 1:
            try:
                hierarchies = sorted(p for p in self.cgroup_root.iterdir() if p.is_dir())
            except OSError:
                hierarchies = []
            dirs = list(out.get("dirs", []))
            out["dirs"] = dirs + [d for h in hierarchies if (d := str(h / TESSERA_CGROUP / name)) not in dirs]
            if self.cgroups.memory is not None:
                # v1 counts an OOM kill in the container's own cgroup, gone with it: the supervisor listens for the
                # job's cgroup going out of memory instead (v2's memory.events counts its children's).
                memory = self.cgroups.memory / name
                out["oom_event"] = [str(memory / "cgroup.event_control"), str(memory / "memory.oom_control")]
        return out

    def _limits_for(self, *, name: str, memory_mib: int | None, cpu_milli: int | None) -> dict:
        cg = self.cgroups
        if cg is None:
            return {}
        dirs: list[Path] = []
        if cg.version == 2:
            base = cg.memory
            assert base is not None
            self._enable_v2(base)
            d = base / name
            d.mkdir(exist_ok=True)
            dirs.append(d)
            if memory_mib:
                _write(d / "memory.max", str(memory_mib * 1024 * 1024))
                if (d / "memory.swap.max").exists():
                    _write(d / "memory.swap.max", "0")
            if cpu_milli:
                _write(d / "cpu.max", f"{cpu_milli * CPU_PERIOD_US // 1000} {CPU_PERIOD_US}")
            return {"dirs": [str(d)], "procs": [str(d / "cgroup.procs")], "oom": str(d / "memory.events")}
        oom = None
        if cg.memory is not None:
            d = cg.memory / name
            d.mkdir(parents=True, exist_ok=True)
            dirs.append(d)
            if memory_mib:
                _write(d / "memory.limit_in_bytes", str(memory_mib * 1024 * 1024))
                swap = d / "memory.memsw.limit_in_bytes"
                if swap.exists():
                    _write(swap, str(memory_mib * 1024 * 1024))
            oom = str(d / "memory.oom_control")
        if cg.cpu is not None and cpu_milli:
            d = cg.cpu / name
            d.mkdir(parents=True, exist_ok=True)
            dirs.append(d)
            _write(d / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(d / "cpu.cfs_quota_us", str(cpu_milli * CPU_PERIOD_US // 1000))
        return {"dirs": [str(d) for d in dirs], "procs": [str(d / "cgroup.procs") for d in dirs], "oom": oom}

    @staticmethod
    def _enable_v2(base: Path) -> None:
        base.mkdir(exist_ok=True)
        for parent in (base.parent, base):
            control = parent / "cgroup.subtree_control"
            try:
                if not {"memory", "cpu"} <= set(control.read_text().split()):
                    _write(control, "+memory +cpu")
            except OSError as exc:
                raise IsolationError(
                    f"cannot enable the memory and cpu controllers in {parent}: {exc}"
                ) from exc

    # -- what check says ------------------------------------------------------------------------------------------
    def report(self) -> list[tuple[str, bool, str]]:
        return [
            (
                "job users",
                self.isolates,
                {
                    "pool": f"each job its own uid from {self.uid_pool[0]}-{self.uid_pool[1]}",
                    "account": "each job as its submitter's Unix account",
                    "agent": "jobs run as the agent's user: they can read each other's files and the agent's state"
                    + ("" if self.root else " (the agent is not root)"),
                }[self.mode],
            ),
            (
                "host memory and CPU limits",
                self.cgroups is not None and self.isolates,
                self.cgroups.limits
                if self.cgroups is not None and self.isolates
                else "not limited (needs root and a cgroup v2 hierarchy with memory and cpu, or cgroup v1)",
            ),
            (
                "GPU devices fence",
                self.devices is not None and self.isolates,
                "cgroup v1 devices: a job opens only its own /dev/nvidiaN and the driver's control devices"
                if self.devices is not None and self.isolates
                else "not fenced: CUDA_VISIBLE_DEVICES only selects cards (needs root and cgroup v1's devices "
                "controller; cgroup v2's BPF device program is not done)",
            ),
        ]
