"""Jobs in container images: one small interface over the host's container runtime.

A placement whose spec names an `image` runs its command in that image. The supervisor stays what it is for a bare
process (agent/supervisor.py): its job's first process is the runtime's client (`podman run`, `apptainer exec`) in
the foreground, in the job's cgroups, so the grace, the max runtime, the fence, the logs and the exit code are the
same code either way. What the runtime adds:

- **the image**, made present first by the supervisor (`pull`: `if-not-present`, `always` or `never`, the agent's
  `TESSERA_AGENT_PULL_POLICY`); a pull that fails ends the job `image_pull_failed` with the runtime's words;
- **the job's user**, given to the runtime (`--user UID:GID`) rather than taken by the supervisor: a rootful
  runtime must start as root;
- **its cgroups**: Podman's container goes under the job's own cgroup (`--cgroup-parent`), so the job's memory
  and CPU limits and its devices fence hold inside the container exactly as outside;
- **its GPUs** by CDI name (`nvidia.com/gpu=0`), where the host has a CDI spec for them: only the assigned cards
  exist in the container;
- **its files**: its home and TMPDIR (the per-job scratch, removed at its end), its gang's hostfile, and the mounts
  its team was given and it asked for by name; nothing else of the host;
- **its network**: `none` (a network namespace of its own with only loopback), or the host's (`cluster`, `open`:
  a gang's members and the portal's session proxy reach it as they reach a bare process).

Podman (rootful, as the agent) and Apptainer run jobs; Enroot is detected and reported, not run.
`tessera-agent check` says which are present and which one the agent uses (docs/agent.md, "Images").
"""

from __future__ import annotations

import hashlib
import re
import resource
import shutil
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PULL_POLICIES = ("if-not-present", "always", "never")
# What a job in an image may reach, strictest first: quotas.choices.Network's values (the portal decides which).
NETWORKS = ("none", "cluster", "open")
RUNTIME_NAMES = ("podman", "apptainer", "enroot")
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
CDI_GPU_KIND = "nvidia.com/gpu"
# A container's name is the placement's: one per placement, so a second start finds the first.
_NAME_SAFE = re.compile(r"[^a-zA-Z0-9_.-]")
# Devices runc allows every container besides the ordinary ones (tun and the console); a child cgroup may not
# allow what its parent does not, so a container job's devices fence allows them too (agent/isolation.py).
RUNTIME_DEVICES = ("c 10:200 rwm", "c 5:1 rwm")
# conmon refuses an nproc limit above this; Podman copies the agent's own limits otherwise, which fail there.
MAX_NPROC = 32768


class ContainerError(Exception):
    """The job cannot run in its image on this node (reported as a launch failure)."""


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    read_only: bool = True


@dataclass(frozen=True)
class ContainerRun:
    """One placement's container, as the runtime is asked for it."""

    name: str
    image: str
    argv: tuple[str, ...]  # the job's command, run in the image
    # Variables handed in from the client's own environment (never on the command line).
    env_names: tuple[str, ...]
    workdir: str
    mounts: tuple[Mount, ...] = ()
    user: tuple[int, int] | None = None  # uid, gid inside; None: the image's
    network: str = "open"
    cdi_devices: tuple[str, ...] = ()
    ipc_host: bool = False  # MPS clients talk to the host's daemon through shared memory
    cgroup_parent: str | None = None  # the job's own cgroup, relative to each hierarchy's root
    env_values: Mapping[str, str] = field(default_factory=dict)  # variables given by value (not secret: PATH)


def container_name(placement_key: str, placement_dir: Path) -> str:
    """The placement's container: its key, and its directory's hash (two agents on one host, as the demo runs
    them, may hold the same placement key)."""
    where = hashlib.sha1(str(placement_dir).encode()).hexdigest()[:8]
    return f"tessera-{_NAME_SAFE.sub('_', placement_key)}-{where}"


_CDI_NAME = re.compile(r"""["']?name["']?\s*:\s*["']?([A-Za-z0-9:_.-]+)""")


def cdi_gpu_devices(cdi_dirs: Sequence[Path] | None = None) -> set[str] | None:
    """The device names this host's CDI specs give `nvidia.com/gpu` ("0", "1", "GPU-<uuid>", "all"), or None where
    no spec names NVIDIA GPUs (`nvidia-ctk cdi generate` writes one): cards then cannot be passed into containers."""
    found: set[str] | None = None
    for d in CDI_DIRS if cdi_dirs is None else cdi_dirs:
        try:
            specs = sorted(p for p in d.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
        except OSError:
            continue
        for spec in specs:
            try:
                text = spec.read_text(errors="replace")
            except OSError:
                continue
            if re.search(r"""kind["']?\s*:\s*["']?nvidia\.com/gpu\b""", text):
                found = (found or set()) | set(_CDI_NAME.findall(text))
    return found


def cdi_gpu_names(indexes: Sequence[int], cdi_dirs: Sequence[Path] | None = None) -> tuple[str, ...] | None:
    """The CDI names of a placement's cards (`nvidia.com/gpu=0`), None where this host has no CDI spec for its GPUs.
    Raises ContainerError for a card the spec does not name."""
    devices = cdi_gpu_devices(cdi_dirs)
    if devices is None:
        return None
    wanted = [str(i) for i in sorted(set(indexes))]
    missing = [i for i in wanted if i not in devices]
    if missing:
        raise ContainerError(
            f"this node's CDI spec names no {', '.join(f'{CDI_GPU_KIND}={i}' for i in missing)} "
            "(regenerate it: nvidia-ctk cdi generate)"
        )
    return tuple(f"{CDI_GPU_KIND}={i}" for i in wanted)


def _version(binary: str) -> str:
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.strip().splitlines()[0] if out.strip() else ""


class Runtime(ABC):
    """What the supervisor runs for a container job: the pull, the job's client, and the removal afterwards."""

    name = ""
    # Whether the runtime takes the job's user itself (`--user`), starting as root; else the supervisor drops to
    # the job's user before starting it, as for a bare process.
    sets_user = False

    def __init__(self, binary: str) -> None:
        self.binary = binary

    def image_exists_argv(self, image: str) -> list[str] | None:
        return None

    def client_env(self, env: Mapping[str, str], names: Sequence[str]) -> dict[str, str]:
        """The runtime client's own environment, carrying the job's variables `names` into the container."""
        return dict(env)

    @abstractmethod
    def pull_argv(self, image: str) -> list[str]: ...

    @abstractmethod
    def run_argv(self, run: ContainerRun) -> list[str]: ...

    def remove_argv(self, name: str) -> list[str] | None:
        return None

    def pull_plan(self, image: str, policy: str) -> dict:
        """What the supervisor does before the job (run.json's `pull`): `exists` tells whether the image is here,
        `pull` fetches it; `policy` says which of them run."""
        if policy not in PULL_POLICIES:
            raise ContainerError(f"pull policy must be one of {', '.join(PULL_POLICIES)} (got {policy!r})")
        return {
            "image": image,
            "policy": policy,
            "exists": self.image_exists_argv(image),
            "pull": self.pull_argv(image),
        }


class Podman(Runtime):
    """Rootful Podman (the agent is root). `oci_runtime` picks its OCI runtime (`runc` where crun refuses the
    host's rlimits)."""

    name = "podman"
    sets_user = True

    def __init__(self, binary: str, *, oci_runtime: str | None = None) -> None:
        super().__init__(binary)
        self.oci_runtime = oci_runtime

    def _base(self) -> list[str]:
        return [self.binary, *(["--runtime", self.oci_runtime] if self.oci_runtime else [])]

    def image_exists_argv(self, image: str) -> list[str]:
        return [*self._base(), "image", "exists", image]

    def pull_argv(self, image: str) -> list[str]:
        return [*self._base(), "pull", "--quiet", image]

    def remove_argv(self, name: str) -> list[str]:
        return [*self._base(), "rm", "--force", "--time", "0", "--ignore", name]

    def run_argv(self, run: ContainerRun) -> list[str]:
        argv = [
            *self._base(),
            "run",
            "--rm",
            "--name",
            run.name,
            "--pull",
            "never",  # the supervisor made it present, or the job already ended image_pull_failed
            "--init",  # a PID 1 that passes the grace's SIGTERM on and reaps
            "--security-opt",
            "no-new-privileges",
            "--cap-drop",
            "all",
            "--workdir",
            run.workdir,
            "--network",
            "none" if run.network == "none" else "host",
        ]
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
        nproc = resource.getrlimit(resource.RLIMIT_NPROC)
        argv += ["--ulimit", f"nofile={_limit(nofile[0])}:{_limit(nofile[1])}"]
        argv += ["--ulimit", f"nproc={min(_limit(nproc[0]), MAX_NPROC)}:{min(_limit(nproc[1]), MAX_NPROC)}"]
        if run.user is not None:
            argv += ["--user", f"{run.user[0]}:{run.user[1]}"]
        if run.ipc_host:
            argv += ["--ipc", "host"]
        if run.cgroup_parent:
            argv += ["--cgroup-parent", run.cgroup_parent]
        for device in run.cdi_devices:
            argv += ["--device", device]
        for m in run.mounts:
            argv += ["--volume", f"{m.host_path}:{m.container_path}:{'ro' if m.read_only else 'rw'}"]
        for name in run.env_names:
            argv += ["--env", name]  # its value from the client's environment: secrets stay off command lines
        for name, value in run.env_values.items():
            argv += ["--env", f"{name}={value}"]
        return [*argv, run.image, *run.argv]


def _limit(value: int) -> int:
    return 1 << 20 if value == resource.RLIM_INFINITY else int(value)


class Apptainer(Runtime):
    """Apptainer (Singularity): the job's user is the one the supervisor runs it as; `--containall` gives it a
    clean /home, /tmp and environment, and only the binds named here."""

    name = "apptainer"

    def pull_argv(self, image: str) -> list[str]:
        # Apptainer keeps images in its cache: a build into the cache is its pull.
        return [self.binary, "pull", "--force", "/dev/null", _apptainer_ref(image)]

    def run_argv(self, run: ContainerRun) -> list[str]:
        argv = [self.binary, "exec", "--containall", "--cleanenv", "--no-home", "--pwd", run.workdir]
        if run.cdi_devices:
            argv += ["--nv"]  # Apptainer binds the driver and the cards CUDA_VISIBLE_DEVICES names
        if run.network == "none":
            argv += ["--net", "--network", "none"]
        for m in run.mounts:
            argv += ["--bind", f"{m.host_path}:{m.container_path}:{'ro' if m.read_only else 'rw'}"]
        for name, value in run.env_values.items():
            argv += ["--env", f"{name}={value}"]
        return [*argv, _apptainer_ref(run.image), *run.argv]

    def client_env(self, env: Mapping[str, str], names: Sequence[str]) -> dict[str, str]:
        # --cleanenv drops the client's environment; APPTAINERENV_<NAME> is how a variable gets in.
        out = {k: v for k, v in env.items() if k not in names}
        out.update({f"APPTAINERENV_{k}": env[k] for k in names if k in env})
        return out


def _apptainer_ref(image: str) -> str:
    return image if "://" in image or image.startswith("/") else f"docker://{image}"


_KINDS: dict[str, type[Runtime]] = {"podman": Podman, "apptainer": Apptainer}  # enroot: detected, not run


def detect(path: str | None = None) -> dict[str, str]:
    """The container runtimes on this host's PATH: name -> binary."""
    found = {}
    for name in RUNTIME_NAMES:
        binary = shutil.which(name, path=path)
        if binary:
            found[name] = binary
    return found


def runtime_for(
    choice: str | None, *, oci_runtime: str | None = None, path: str | None = None
) -> Runtime | None:
    """The runtime the agent runs images with: `choice` (podman | apptainer | none), or the first of Podman and
    Apptainer present (auto, the default). None: this node runs no images."""
    choice = (choice or "auto").strip().lower()
    if choice == "none":
        return None
    if choice not in ("auto", *RUNTIME_NAMES):
        raise ContainerError(
            f"TESSERA_AGENT_CONTAINER_RUNTIME must be auto, none, {', '.join(RUNTIME_NAMES)} (got {choice!r})"
        )
    found = detect(path)
    if choice == "enroot":
        raise ContainerError("enroot is detected and reported, but the agent does not run jobs with it")
    for name in ("podman", "apptainer") if choice == "auto" else (choice,):
        if name in found:
            return (
                Podman(found[name], oci_runtime=oci_runtime) if name == "podman" else Apptainer(found[name])
            )
    if choice != "auto":
        raise ContainerError(
            f"TESSERA_AGENT_CONTAINER_RUNTIME={choice}, and no {choice} is on this node's PATH"
        )
    return None


def report(runtime: Runtime | None, *, path: str | None = None) -> list[tuple[str, bool, str]]:
    """`tessera-agent check`'s lines: each runtime found, the one used, and whether cards can be passed by CDI."""
    found = detect(path)
    lines: list[tuple[str, bool, str]] = []
    for name in RUNTIME_NAMES:
        if name in found:
            used = runtime is not None and runtime.name == name
            note = (
                "used for jobs with an image"
                if used
                else "present; not used (another runtime is)"
                if name in _KINDS
                else "present; the agent does not run jobs with it"
            )
            lines.append(
                (f"container runtime {name}", used, f"{_version(found[name]) or found[name]}: {note}")
            )
    if runtime is None:
        lines.append(
            (
                "jobs in images",
                False,
                "no container runtime used (install Podman or Apptainer): jobs with an image fail to launch here",
            )
        )
    cdi = cdi_gpu_devices()
    lines.append(
        (
            "GPUs in containers (CDI)",
            cdi is not None,
            f"a CDI spec names nvidia.com/gpu ({', '.join(sorted(cdi or ()))}): a container gets only its own cards"
            if cdi is not None
            else "no CDI spec for nvidia.com/gpu under /etc/cdi or /var/run/cdi (nvidia-ctk cdi generate): "
            "containers get no GPU",
        )
    )
    return lines
