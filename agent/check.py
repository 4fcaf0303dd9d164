"""`tessera-agent check`: what the agent sees (GPUs, memory, topology, MIG/MPS capability), and an MPS smoke
test that starts one MPS-limited job through the real executor and reports the limits the job observed."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from agent.backends.base import GpuBackend, Inventory
from agent.executor import Executor
from agent.jobspec import GpuSlice, JobSpec
from agent.mps import MpsController

PROBE = Path(__file__).resolve().parent / "mps_probe.py"


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
        lines.append(f"isolation: {row['what']}: {'yes' if row['enforced'] else 'NO'}: {row['detail']}")
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
