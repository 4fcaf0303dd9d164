"""Starting a placement: the job's environment, what its supervisor runs (run.json), the supervisor's process and
its launch record, and finding that process again when the launch record is missing."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Collection, Mapping
from pathlib import Path

from agent import procfs
from agent.containers import ContainerError, ContainerRun, Mount, Runtime, cdi_gpu_names, container_name
from agent.gang import gang_env
from agent.isolation import HOME_DIR, TMP_DIR, Isolation
from agent.jobspec import JobSpec, safe_name
from agent.mps import MpsController
from agent.placement import JobHandle, write_private_json
from agent.protocol import port_env_name

SUPERVISOR = Path(__file__).resolve().parent / "supervisor.py"
DRIVER_DEVICE = Path("/dev/nvidiactl")  # a host whose NVIDIA driver is loaded
# Variables of the agent that a job must never inherit.
_SECRET_PREFIXES = ("TESSERA_AGENT_TOKEN",)
_AGENT_SET = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_")


class LaunchError(Exception):
    pass


def job_env(
    spec: JobSpec, handle: JobHandle, *, base_env: Mapping[str, str], mps: MpsController | None
) -> dict[str, str]:
    """The job's environment: the agent's (minus its token and GPU selection), the job's, the placement's, its
    GPUs' and MPS's, and a gang member's rendezvous variables (its hostfile written into the placement's
    directory). Notes on the handle what MPS said."""
    env = {
        k: v
        for k, v in base_env.items()
        if not k.startswith(_SECRET_PREFIXES) and not k.startswith(_AGENT_SET)
    }
    env.update({k: v for k, v in spec.env.items() if not k.startswith(_AGENT_SET)})
    env["TESSERA_JOB_ID"] = spec.job_id
    env["TESSERA_ATTEMPT"] = str(spec.attempt)
    env["TESSERA_PLACEMENT"] = spec.key
    # Selects (does not fence) the job's GPUs; UUIDs so a renumbered host cannot shift a job.
    env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in spec.gpus)
    if any(g.sharing == "mps" for g in spec.gpus):
        status = mps.ensure_running() if mps is not None else None
        handle.mps = status.message if status is not None else "no MPS controller configured"
        pcts = [g.compute_pct for g in spec.gpus if g.sharing == "mps" and g.compute_pct is not None]
        limits = [g.memory_mib if g.sharing == "mps" else None for g in spec.gpus]
        client = (
            mps.client_env(active_thread_pct=min(pcts) if pcts else None, memory_limits_mib=limits)
            if mps is not None
            else {}
        )
        env.update(client)
    env.update(gang_env(spec, handle.dir))
    for name, port in handle.ports.items():
        env[f"TESSERA_PORT_{port_env_name(name)}"] = str(port)
    return env


def _port_free(port: int) -> bool:
    """Nothing on this host listens on the port (a server's bind on every address would succeed: as servers do, with
    SO_REUSEADDR, so a port an ended job left in TIME_WAIT counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _any_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def ports_choose(spec: JobSpec, *, taken: Collection[int]) -> dict[str, int]:
    """Each web port the job asked for, or another free one where this host's is taken (by another placement of
    this agent, or anything else listening): name -> port."""
    chosen: dict[str, int] = {}
    for name, port in spec.ports:
        if port in taken or port in chosen.values() or not _port_free(port):
            port = _any_free_port()
            while port in taken or port in chosen.values():
                port = _any_free_port()
        chosen[name] = port
    return chosen


def supervisor_run(
    spec: JobSpec,
    handle: JobHandle,
    *,
    env: dict[str, str],
    fence_after_s: float | None,
    lease_path: Path,
    isolation: Isolation | None,
    uids_in_use: Collection[int],
    containers: Runtime | None = None,
    pull_policy: str = "if-not-present",
) -> dict:
    """What the placement's supervisor runs (run.json): the command, its environment, working directory, user
    and cgroup, where its output goes, its grace, max runtime and fence. Notes on the handle the job's user. A job
    with an image runs it with the node's container runtime (`in_image`)."""
    d = handle.dir
    command = list(spec.command) if isinstance(spec.command, tuple) else ["/bin/sh", "-c", spec.command]
    fence = spec.fence_after_s if spec.fence_after_s is not None else fence_after_s
    cwd, user, cgroup = spec.cwd or str(d), None, {}
    if isolation is not None and isolation.isolates:
        identity = isolation.identity(user=spec.user, in_use=set(uids_in_use))
        if identity is not None:
            handle.uid = identity.uid
            tree = isolation.job_tree(d, identity)
            cwd = spec.cwd or str(tree.home)
            user = {"uid": identity.uid, "gid": identity.gid}
            env.update(
                {"HOME": identity.home or str(tree.home), "USER": identity.name, "LOGNAME": identity.name}
            )
            if "TMPDIR" not in spec.env:  # a job that names its own scratch keeps it
                env["TMPDIR"] = str(tree.tmp)
        cgroup = isolation.cgroup_for(
            name=safe_name(spec.key),
            memory_mib=spec.memory_mib,
            cpu_milli=spec.cpu_milli,
            gpu_indexes=[g.index for g in spec.gpus],
            container=bool(spec.image),
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
        "lease": str(lease_path) if fence is not None else None,
    }
    if spec.image:
        return in_image(spec, handle, run, runtime=containers, pull_policy=pull_policy)
    return run


def in_image(
    spec: JobSpec, handle: JobHandle, run: dict, *, runtime: Runtime | None, pull_policy: str
) -> dict:
    """The bare run.json of a job with an image, turned into its runtime's client run in the foreground: the same
    supervisor, grace, fence, logs and cgroups. In the container the job finds its home, its TMPDIR and its
    placement's directory (a gang's hostfile; read-only) at the paths its variables name, the mounts its team gave
    it, its own cards by CDI name, and nothing else of the host."""
    if runtime is None:
        raise LaunchError(
            f"the job runs in image {spec.image}, and this node has no container runtime for it "
            "(Podman or Apptainer: tessera-agent check)"
        )
    d = handle.dir
    env: dict[str, str] = run["env"]
    isolated = run["user"] is not None
    mounts = [Mount(str(d), str(d), read_only=isolated)]
    if isolated:
        mounts += [
            Mount(str(d / HOME_DIR), str(d / HOME_DIR), False),
            Mount(str(d / TMP_DIR), str(d / TMP_DIR), False),
        ]
    mps = any(g.sharing == "mps" for g in spec.gpus)
    for name in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        if mps and env.get(name, "").startswith("/"):
            mounts.append(Mount(env[name], env[name], False))
    mounts += list(spec.mounts)
    cdi: tuple[str, ...] = ()
    if spec.gpus:
        try:
            named = cdi_gpu_names([g.index for g in spec.gpus])
        except ContainerError as exc:
            raise LaunchError(str(exc)) from exc
        if named is None and DRIVER_DEVICE.exists():
            raise LaunchError(
                "this node has no CDI spec for its GPUs (nvidia-ctk cdi generate): a container cannot get its cards"
            )
        cdi = named or ()  # no driver here (a simulated node): its cards are only names
    host_path = os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    names = tuple(sorted(k for k in env if k != "PATH"))
    user = run["user"]
    container = ContainerRun(
        name=container_name(spec.key, d),
        image=spec.image,
        argv=tuple(run["argv"]),
        env_names=names,
        env_values={"PATH": env["PATH"]} if "PATH" in env else {},
        workdir=spec.cwd or run["cwd"],
        mounts=tuple(mounts),
        user=(user["uid"], user["gid"]) if user and runtime.sets_user else None,
        network=spec.network,
        cdi_devices=cdi,
        ipc_host=mps,
        cgroup_parent=run["cgroup"].get("parent"),
    )
    try:
        pull = runtime.pull_plan(spec.image, pull_policy)
    except ContainerError as exc:
        raise LaunchError(str(exc)) from exc
    return {
        **run,
        "argv": runtime.run_argv(container),
        "env": {**runtime.client_env(env, names), "PATH": host_path},
        "cwd": str(d),  # the client's, on the host; the job's own is its workdir in the image
        "user": None if runtime.sets_user else user,
        "container": {"name": container.name, "pull": pull, "remove": runtime.remove_argv(container.name)},
    }


def check_launchable(run: dict) -> None:
    """What would make the supervisor's start fail, refused here so the agent reports it at once."""
    words = [*run["argv"], *run["env"].keys(), *run["env"].values(), run["cwd"]]
    if any("\0" in w for w in words):
        raise LaunchError("embedded null byte in the command, its environment or its working directory")
    if not os.path.isdir(run["cwd"]):
        raise LaunchError(f"the working directory {run['cwd']} does not exist on this node")


def supervisor_start(handle: JobHandle, run: dict, *, python: str) -> tuple[subprocess.Popen, list[str]]:
    """Write run.json and start the placement's supervisor in a session of its own; its process and command
    line."""
    d = handle.dir
    check_launchable(run)
    write_private_json(d / "run.json", run)
    argv = [python, "-I", str(SUPERVISOR), str(d)]
    with open(os.open(d / "supervisor.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as log_file:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            # Only what finds it again after an agent crash (`recover_launch`).
            env={"TESSERA_PLACEMENT": handle.key, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            cwd=str(d),
            start_new_session=True,  # its own session: the agent's end (or its terminal's) is not its
            close_fds=True,
        )
    return popen, argv


def record_launch(handle: JobHandle, popen: subprocess.Popen, argv: list[str]) -> None:
    """The supervisor's identity on the handle and in launch.json: what a restarted agent re-adopts it by."""
    handle.popen = popen
    handle.pid = popen.pid
    stat = procfs.read_stat(popen.pid)
    handle.start_ticks = stat.start_ticks if stat else None
    handle.started_at = time.time()
    write_private_json(
        handle.dir / "launch.json",
        {
            "pid": handle.pid,
            "start_ticks": handle.start_ticks,
            "cmdline": argv,
            "started_at": handle.started_at,
            "mps": handle.mps,
            "uid": handle.uid,
            "ports": handle.ports,
        },
    )


def recover_launch(spec: JobSpec, d: Path) -> dict | None:
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
            write_private_json(d / "launch.json", launch)
            return launch
    return None
