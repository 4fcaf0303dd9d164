"""`tessera-agent check`: what the agent sees (GPUs, memory, topology, MIG/MPS capability), what a job's uid can
do on this host (its own tree, the GPUs' device nodes, the network), tried as that uid, and an MPS smoke test that
starts one MPS-limited job through the real executor and reports the limits the job observed."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent.backends.base import GpuBackend, Inventory
from agent.executor import LEASE_FILE, Executor
from agent.gang import write_hostfile
from agent.isolation import Identity, Isolation, JobTree
from agent.jobspec import Gang, GangMember, GpuSlice, JobSpec
from agent.mps import MpsController
from agent.placement import write_private_json

PROBE = Path(__file__).resolve().parent / "mps_probe.py"
CONNECT_TIMEOUT_S = 2.0
# Loopback ports a job is tried against by default: the portal's usual services on a host that also runs them.
SERVICE_PORTS = {5432: "PostgreSQL", 6379: "Redis"}
SERVICE_SCHEMES = {
    "postgres": ("PostgreSQL", 5432),
    "postgresql": ("PostgreSQL", 5432),
    "redis": ("Redis", 6379),
}
_GPU_NODE = re.compile(r"nvidia[0-9]+")


def gather(backend: GpuBackend, *, mps_control: str | None, work_dir: Path) -> dict[str, Any]:
    inventory = backend.inventory()
    sample = backend.sample()
    mps = MpsController(work_dir, control_path=mps_control)
    fake = sys.modules.get("pynvml")
    return {
        "backend": backend.name,
        "fake_nvml": str(getattr(fake, "fixture_dir", "")) if getattr(fake, "TESSERA_FAKE", False) else None,
        "inventory": inventory.to_dict(),
        "sample": sample.to_dict(),
        "mps": {"control": mps.binary, "daemon_running": mps.is_running(), "pipe_dir": str(mps.pipe_dir)},
        "mig": {
            g.uuid: {
                "capable": bool(g.mig_profiles) or g.mig_mode_current is not None,
                "enabled": g.mig_mode_current,
                "profiles": len(g.mig_profiles),
            }
            for g in inventory.gpus
        },
    }


def mps_smoke(
    inventory: Inventory,
    *,
    work_dir: Path,
    mps_control: str | None,
    gpu_index: int = 0,
    memory_mib: int = 4096,
    compute_pct: int = 25,
    timeout_s: float = 180.0,
) -> dict[str, Any]:
    """Start one MPS client limited to compute_pct % and memory_mib on one GPU; report what it saw."""
    gpu = next((g for g in inventory.gpus if g.index == gpu_index), None)
    if gpu is None:
        return {"ok": False, "error": f"no GPU with index {gpu_index}"}
    mps = MpsController(work_dir, control_path=mps_control)
    was_running = mps.is_running()
    executor = Executor(work_dir)
    spec = JobSpec(
        job_id=f"mps-smoke-{os.getpid()}-{int(time.time())}",
        attempt=1,
        command=(sys.executable, str(PROBE), "--limit-mib", str(memory_mib)),
        gpus=(
            GpuSlice(
                uuid=gpu.uuid, index=gpu.index, memory_mib=memory_mib, compute_pct=compute_pct, sharing="mps"
            ),
        ),
        max_runtime_s=timeout_s,
        grace_s=5,
    )
    executor.mps = mps
    handle = executor.start(spec)
    done = executor.wait(handle.key, timeout_s + 10)
    observed: dict[str, Any] | None = None
    for line in reversed(executor.tail_log(handle.key, "stdout", lines=20)):
        try:
            observed = json.loads(line)
            break
        except ValueError:
            continue
    if mps.binary and not was_running and mps.is_running():
        mps.quit()  # leave the host as we found it
    expected = {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(compute_pct),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory_mib}M",
        "CUDA_VISIBLE_DEVICES": gpu.uuid,
    }
    env = (observed or {}).get("env", {})
    result: dict[str, Any] = {
        "gpu": {"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name},
        "daemon": handle.mps,
        "daemon_available": mps.binary is not None,
        "expected": expected,
        "observed": observed,
        "limits_received": all(env.get(k) == v for k, v in expected.items()),
        "exit_code": done.exit_code if done else None,
        "outcome": done.outcome if done else "timeout",
        "stderr_tail": executor.tail_log(handle.key, "stderr", lines=5),
        "work_dir": str(handle.dir),
    }
    below = (observed or {}).get("alloc_below_limit", {}).get("result")
    above = (observed or {}).get("alloc_above_limit", {}).get("result")
    if below is not None and above is not None:
        result["memory_limit_enforced"] = below == "ok" and above.startswith("refused")
    result["ok"] = bool(result["limits_received"] and result["exit_code"] == 0)
    return result


def format_report(report: dict[str, Any]) -> str:
    inv = report["inventory"]
    lines = []
    source = f" (fake NVML from {report['fake_nvml']})" if report.get("fake_nvml") else ""
    lines.append(
        f"backend {report['backend']}{source}: driver {inv.get('driver_version')}, "
        f"CUDA {inv.get('cuda_driver_version')}, NVML {inv.get('nvml_version')}, {len(inv['gpus'])} GPU(s)"
    )
    samples = {g["uuid"]: g for g in report["sample"]["gpus"]}
    for g in inv["gpus"]:
        lines.append(
            f"GPU {g['index']}  {g['name']}  {g['uuid']}  {g['memory_total_mib']} MiB  CC {g['compute_capability']}"
            f"  NUMA {g['numa_node'] if g['numa_node'] is not None else '-'}  CPUs {g['cpu_affinity'] or '-'}"
            f"  sharing {g['sharing_mode']}"
        )
        mig = (
            "enabled"
            if g["mig_mode_current"]
            else "disabled"
            if g["mig_mode_current"] is False
            else "unknown"
        )
        profiles = ", ".join(
            f"{p['name'].removeprefix('MIG ')} x{p['instance_count']}" for p in g["mig_profiles"]
        )
        lines.append(f"      MIG {mig}; profiles: {profiles or 'none'}")
        if g["unsupported"]:
            lines.append(f"      not supported here: {', '.join(sorted(g['unsupported']))}")
        s = samples.get(g["uuid"], {})
        lines.append(
            f"      now: util {s.get('util_pct')} %, memory {s.get('memory_used_mib')}/{s.get('memory_total_mib')} MiB,"
            f" {s.get('power_w')} W, {s.get('temperature_c')} C, {len(s.get('processes', []))} process(es),"
            f" health {s.get('health')}"
        )
    if inv["links"]:
        lines.append("topology:")
        for link in inv["links"]:
            p2p = {True: "yes", False: "no", None: "?"}[link["p2p_supported"]]
            lines.append(
                f"      {link['gpu_a']} <-> {link['gpu_b']}: {link['path'] or 'unknown'} (P2P {p2p})"
            )
    else:
        lines.append(
            "topology: no GPU pairs" if len(inv["gpus"]) < 2 else "topology: the driver reported no paths"
        )
    for row in report.get("isolation", []):
        verdict = {True: "yes", False: "NO", None: "-"}[row["enforced"]]
        lines.append(f"isolation: {row['what']}: {verdict}: {row['detail']}")
    mps = report["mps"]
    lines.append(
        f"MPS: control {mps['control'] or 'not found'}; daemon {'running' if mps['daemon_running'] else 'not running'}"
    )
    smoke = report.get("mps_smoke")
    if smoke:
        lines.append(f"MPS smoke on GPU {smoke.get('gpu', {}).get('index')}: daemon: {smoke.get('daemon')}")
        env = (smoke.get("observed") or {}).get("env", {})
        for k, v in smoke.get("expected", {}).items():
            lines.append(f"      {k}: expected {v}, job saw {env.get(k)}")
        obs = smoke.get("observed") or {}
        if "alloc_below_limit" in obs:
            lines.append(
                f"      alloc {obs['alloc_below_limit']['mib']} MiB: {obs['alloc_below_limit']['result']}"
            )
            lines.append(
                f"      alloc {obs['alloc_above_limit']['mib']} MiB: {obs['alloc_above_limit']['result']}"
            )
        elif obs.get("torch"):
            lines.append(f"      torch: {obs['torch']}")
        verdict = "limits received" if smoke.get("limits_received") else "limits NOT received"
        if not smoke.get("daemon_available"):
            verdict += "; not enforced here: no MPS control daemon"
        elif "memory_limit_enforced" in smoke:
            verdict += "; memory limit " + ("enforced" if smoke["memory_limit_enforced"] else "NOT enforced")
        lines.append(
            f"      job {smoke.get('outcome')} with exit code {smoke.get('exit_code')}: "
            f"{'OK' if smoke.get('ok') else 'FAILED'} ({verdict})"
        )
    return "\n".join(lines)


# -- what a job's uid can do on this host ---------------------------------------------------------------------------
def as_user(identity: Identity | None, probe: Callable[[], Any], *, timeout_s: float = 10.0) -> Any:
    """probe() run as a job runs: in a child process with the identity's uid and gid and no supplementary groups
    (None: in this process, as the agent's own user). Its JSON answer; {"error": ...} if it fails or outlasts
    timeout_s."""
    if identity is None:
        return probe()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(identity.gid)
            os.setuid(identity.uid)
            answer = probe()
        except BaseException as exc:  # whatever it was, the parent reports it
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            with os.fdopen(write_fd, "wb") as fh:
                fh.write(json.dumps(answer).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    data, deadline = b"", time.monotonic() + timeout_s
    with os.fdopen(read_fd, "rb", buffering=0) as fh:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fh], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"error": f"no answer within {timeout_s:g} s"}
            chunk = fh.read(1 << 16)
            if not chunk:
                break
            data += chunk
    os.waitpid(pid, 0)
    try:
        return json.loads(data)
    except ValueError:
        return {"error": "the probe ended without an answer"}


def _row(what: str, enforced: bool | None, detail: str) -> dict[str, Any]:
    return {"what": what, "enforced": enforced, "detail": detail}


def _probe_uid(isolation: Isolation) -> Identity | None:
    """The uid the checks run as: the pool's last (the least likely to be running a job); None where jobs run as
    the agent's user."""
    if not (isolation.root and isolation.isolates):
        return None
    uid = isolation.uid_pool[1]
    return Identity(uid, uid, f"tessera-{uid}")


def _errno_text(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _tree_probe(tree: JobTree, hostfile: Path, private: list[Path], other_home: Path | None) -> dict:
    blocked = None
    for d in [*reversed(tree.home.parents), tree.home]:
        try:
            os.chdir(d)
        except OSError as exc:
            blocked = f"{d} ({_errno_text(exc)})"
            break
    failed = []
    for what, act in (
        ("write its home", lambda: (tree.home / "probe").write_text("x")),
        ("write its TMPDIR", lambda: (tree.tmp / "probe").write_text("x")),
        ("read its hostfile", hostfile.read_text),
        ("enter its working directory", lambda: os.chdir(tree.home)),
    ):
        try:
            act()
        except OSError as exc:
            failed.append(f"{what} ({_errno_text(exc)})")
    leaks = []
    for what, path in [
        *((f"read the agent's {p.name}", p) for p in private),
        ("read another job's home", other_home),
    ]:
        if path is None:
            continue
        try:
            path.read_bytes()
            leaks.append(what)
        except OSError:
            pass
    return {"blocked": blocked, "failed": failed, "leaks": leaks}


def job_tree_row(isolation: Isolation, *, work_dir: Path) -> dict[str, Any]:
    """Build a throwaway job tree in the agent's jobs/ as the agent would, use it as a pool uid, remove it."""
    what = "a job's home, TMPDIR and hostfile"
    me = _probe_uid(isolation)
    if me is None:
        return _row(
            what, False, "not tried: jobs run as the agent's user (they need root to get uids of their own)"
        )
    low, high = isolation.uid_pool
    other = Identity(high - 1, high - 1, f"tessera-{high - 1}") if high > low else None
    jobs_dir = work_dir / "jobs"
    jobs_dir.mkdir(parents=True, exist_ok=True)
    isolation.open_work_dir(work_dir, jobs_dir)
    base = jobs_dir / f".check-{os.getpid()}"
    try:
        mine = base / "1"
        mine.mkdir(parents=True)
        tree = isolation.job_tree(mine, me)
        hostfile = write_hostfile(
            Gang(rank=0, master_port=1, members=(GangMember("check", "127.0.0.1", 1),)), mine
        )
        write_private_json(mine / "run.json", {"env": {}})
        private = [mine / "run.json", *((work_dir / LEASE_FILE,) if (work_dir / LEASE_FILE).exists() else ())]
        other_home = None
        if other is not None:
            theirs = base / "2"
            theirs.mkdir()
            other_home = isolation.job_tree(theirs, other).home / "private"
            other_home.write_text("another job's")
            os.chown(other_home, other.uid, other.gid)
        seen = as_user(me, lambda: _tree_probe(tree, hostfile, private, other_home))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if "error" in seen:
        return _row(what, False, f"the try as uid {me.uid} failed: {seen['error']}")
    if seen["failed"]:
        detail = f"uid {me.uid} could not {', '.join(seen['failed'])} under {jobs_dir}"
        if seen["blocked"]:
            detail += (
                f": it cannot pass {seen['blocked']}; every directory above the jobs must be passable by the jobs'"
                " uids (chmod o+x; the agent makes its work dir and jobs/ 711)"
            )
        return _row(what, False, detail)
    if seen["leaks"]:
        return _row(
            what,
            False,
            f"uid {me.uid} could {', '.join(seen['leaks'])}: the agent's records must be mode 600 and each"
            " placement's directory open to its own job's group alone (710)",
        )
    return _row(
        what,
        True,
        f"uid {me.uid} wrote its home and TMPDIR, read its hostfile and entered its working directory under"
        f" {jobs_dir}; it could not read the agent's records or another job's home",
    )


def gpu_fence_row(isolation: Isolation, *, dev_dir: Path = Path("/dev")) -> dict[str, Any]:
    """Whether anything but CUDA_VISIBLE_DEVICES keeps a job off the host's other GPUs: each job's devices cgroup
    where the agent sets one (agent/isolation.py), else only the device nodes' permissions, tried as a job's uid."""
    what = "GPU fence"
    nodes = sorted(
        (p for p in dev_dir.glob("nvidia*") if _GPU_NODE.fullmatch(p.name)), key=lambda p: int(p.name[6:])
    )
    if isolation.devices is not None and isolation.isolates:
        here = f"{len(nodes)} card(s) here" if nodes else f"no {dev_dir}/nvidia[0-9]* on this host yet"
        return _row(what, True, f"each job's devices cgroup allows only its own /dev/nvidiaN ({here})")
    selects = "CUDA_VISIBLE_DEVICES selects a job's GPUs, it does not fence them, and the agent sets no devices cgroup"
    if not nodes:
        return _row(what, False, f"no {dev_dir}/nvidia[0-9]* on this host; where there are GPUs, {selects}")
    me = _probe_uid(isolation)
    who = f"uid {me.uid}" if me is not None else "the agent's user (jobs run as it)"
    opened = as_user(me, lambda: [str(p) for p in nodes if os.access(p, os.R_OK | os.W_OK)])
    if isinstance(opened, dict):
        return _row(what, False, f"{selects}; the try as {who} failed: {opened['error']}")
    if opened:
        return _row(
            what,
            False,
            f"not fenced: {selects}; {who} can open {', '.join(opened)} ({len(opened)} of {len(nodes)}): a job"
            " can open any /dev/nvidia* and use every GPU it can open. Fence them per job with a devices cgroup"
            " (as Slurm's ConstrainDevices does) or run jobs in containers given only their GPUs",
        )
    return _row(
        what,
        False,
        f"{who} can open none of {', '.join(map(str, nodes))}: device permissions keep jobs off every GPU, their"
        " own too (the agent grants none per job); make the nodes usable and fence them with a devices cgroup",
    )


def reach_targets(
    reach: Iterable[tuple[str, int]] = (), environ: Mapping[str, str] = os.environ
) -> list[tuple[str, int, str, bool]]:
    """Where a job is tried against: (host, port, service, asked for). The portal's usual services on loopback,
    the database and Redis the environment names, and what the operator passes (--reach); nothing else."""
    out: dict[tuple[str, int], tuple[str, int, str, bool]] = {}
    for port, name in SERVICE_PORTS.items():
        out[("127.0.0.1", port)] = ("127.0.0.1", port, name, False)
    for var in ("DATABASE_URL", "REDIS_URL"):
        url = urlsplit(environ.get(var) or "")
        known = SERVICE_SCHEMES.get(url.scheme.split("+")[0])
        if known is not None and url.hostname:
            try:
                port = url.port or known[1]
            except ValueError:
                continue
            out[(url.hostname, port)] = (url.hostname, port, known[0], True)
    for host, port in reach:
        name = out.get((host, port), (host, port, SERVICE_PORTS.get(port, "a service")))[2]
        out[(host, port)] = (host, port, name, True)
    return list(out.values())


def _where(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _connect(host: str, port: int) -> str | None:
    """None when a TCP connection opened, else why not."""
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
        return None
    except OSError as exc:
        return _errno_text(exc)


def reach_rows(isolation: Isolation, targets: list[tuple[str, int, str, bool]]) -> list[dict[str, Any]]:
    """Whether a job's uid can open TCP connections to the targets that answer the agent (root). Loopback
    services nobody asked for are left out when nothing listens there."""
    me = _probe_uid(isolation)
    who = f"a job's uid, {me.uid}" if me is not None else "the agent's user, which jobs run as"
    agent_sees = [_connect(host, port) for host, port, _, _ in targets]
    answering = [
        (host, port) for (host, port, _, _), why in zip(targets, agent_sees, strict=True) if why is None
    ]
    job_sees = (
        as_user(
            me,
            lambda: {_where(host, port): _connect(host, port) for host, port in answering},
            timeout_s=CONNECT_TIMEOUT_S * len(answering) + 5,
        )
        if answering
        else {}
    )
    uids = f"{isolation.uid_pool[0]}-{isolation.uid_pool[1]}" if isolation.mode == "pool" else "UID"
    rows = []
    for (host, port, name, asked), why in zip(targets, agent_sees, strict=True):
        where = _where(host, port)
        if why is not None:
            if asked:
                rows.append(_row(f"network {where}", None, f"nothing answers there ({why}): not tried"))
        elif "error" in job_sees:
            rows.append(_row(f"network {where}", False, f"the try as {who} failed: {job_sees['error']}"))
        elif job_sees[where] is None:
            rows.append(
                _row(
                    f"network {where}",
                    False,
                    f"jobs can reach {where} ({name} answered {who}): put jobs in a network namespace or"
                    f" firewall the portal's services from the job pool's uids (iptables -A OUTPUT -m owner"
                    f" --uid-owner {uids} -d {host} -p tcp --dport {port} -j REJECT)",
                )
            )
        else:
            rows.append(
                _row(
                    f"network {where}", True, f"{who} cannot reach {where} ({job_sees[where]}); the agent can"
                )
            )
    return rows


def job_host_report(
    isolation: Isolation,
    *,
    work_dir: Path,
    reach: Iterable[tuple[str, int]] = (),
    environ: Mapping[str, str] = os.environ,
    dev_dir: Path = Path("/dev"),
) -> list[dict[str, Any]]:
    """What a job's uid can do here, each row with what to do about it: its own tree, the GPUs, the network."""
    return [
        job_tree_row(isolation, work_dir=work_dir),
        gpu_fence_row(isolation, dev_dir=dev_dir),
        *reach_rows(isolation, reach_targets(reach, environ)),
    ]
