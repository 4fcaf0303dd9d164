"""CPU cost of the node agent sampling N GPUs each second: NVML backend on the fake (recorded H200), the
simulated backend, real NVML when a driver is present, and one whole agent tick. Prints JSON.

    python -m bench.agent_sampling --gpus 8 --seconds 5 --json

With the fake, the fake module's own Python work is included in the figures (it stands in for the driver,
whose per-call cost nvml_latency.json recorded on the H200: microseconds per call).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agent.testing import fake_pynvml  # noqa: E402

# NVML calls whose latency nvml_latency.json recorded, by the name it uses.
_LATENCY_KEYS = ("utilization", "memory", "processes", "power", "temperature")


def _measure(sample, *, seconds: int, burst: int) -> dict[str, Any]:
    """Sample once a second for `seconds` (the agent's cadence), then `burst` times back to back."""
    per_sample_cpu_us: list[float] = []
    wall0, cpu0 = time.perf_counter(), time.process_time()
    next_at = wall0
    for _ in range(seconds):
        c = time.process_time()
        sample()
        per_sample_cpu_us.append((time.process_time() - c) * 1e6)
        next_at += 1.0
        time.sleep(max(0.0, next_at - time.perf_counter()))
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    burst_wall_us: list[float] = []
    b_cpu0 = time.process_time()
    for _ in range(burst):
        t = time.perf_counter()
        sample()
        burst_wall_us.append((time.perf_counter() - t) * 1e6)
    burst_cpu_us = (time.process_time() - b_cpu0) * 1e6 / max(burst, 1)
    ordered = sorted(burst_wall_us)
    return {
        "paced": {
            "samples": seconds,
            "wall_s": round(wall, 3),
            "process_cpu_s": round(cpu, 4),
            "cpu_s_per_wall_s": round(cpu / wall, 5),
            "cpu_pct_of_one_core": round(100 * cpu / wall, 3),
            "cpu_us_per_sample_median": round(statistics.median(per_sample_cpu_us), 1),
        },
        "burst": {
            "samples": burst,
            "cpu_us_per_sample": round(burst_cpu_us, 1),
            "wall_us_per_sample_p50": round(ordered[len(ordered) // 2], 1),
            "wall_us_per_sample_p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
        },
    }


def bench_fake_nvml(gpus: int, seconds: int, burst: int, fixture: Path) -> dict[str, Any]:
    mod = fake_pynvml.install(fixture, gpu_count=gpus)
    try:
        from agent.backends.nvml import NvmlBackend

        backend = NvmlBackend()
        backend.sample()
        calls0 = mod.control.calls
        backend.sample()
        calls_per_sample = mod.control.calls - calls0
        result = _measure(backend.sample, seconds=seconds, burst=burst)
        backend.close()
    finally:
        fake_pynvml.uninstall()
    latency = json.loads((fixture / "nvml_latency.json").read_text())
    driver_us = gpus * sum(latency[k]["median_us"] for k in _LATENCY_KEYS)
    result["nvml_calls_per_sample"] = calls_per_sample
    result["recorded_driver_us_per_sample_for_measured_calls"] = round(driver_us, 1)
    result["note"] = (
        "includes the fake module's own Python cost; the real driver's cost for the calls nvml_latency.json "
        "measured (utilization, memory, processes, power, temperature) is given separately"
    )
    return result


def bench_sim(gpus: int, seconds: int, burst: int) -> dict[str, Any]:
    from agent.backends.base import JobUsageHint
    from agent.backends.sim import SimBackend

    backend = SimBackend({"gpus": [{"model": "Sim H200", "count": gpus, "memory_mib": 143771}]})
    uuids = [g.uuid for g in backend.inventory().gpus]
    backend.note_jobs(
        [
            JobUsageHint(pid=10_000 + i, gpu_uuids=(u,), util_pct=60.0, memory_mib={u: 20_000})
            for i, u in enumerate(uuids)
        ]
    )
    return _measure(backend.sample, seconds=seconds, burst=burst)


def bench_real_nvml(gpus: int, seconds: int, burst: int) -> dict[str, Any]:
    fake_pynvml.uninstall()
    try:
        from agent.backends.nvml import NvmlBackend

        backend = NvmlBackend()
    except Exception as exc:  # noqa: BLE001 - no driver here: say so instead of measuring
        return {"skipped": f"{type(exc).__name__}: {exc}"}
    result = _measure(backend.sample, seconds=seconds, burst=burst)
    result["gpus_present"] = len(backend.inventory().gpus)
    backend.close()
    return result


def bench_tick(gpus: int, seconds: int, burst: int) -> dict[str, Any]:
    """A whole agent tick with no jobs: sample, poll, watchdog, reconcile, metrics, heartbeat."""
    from agent.backends.sim import SimBackend
    from agent.executor import Executor
    from agent.runtime import Agent

    with tempfile.TemporaryDirectory() as wd:
        agent = Agent(
            node_name="bench",
            backend=SimBackend({"gpus": [{"model": "Sim H200", "count": gpus, "memory_mib": 143771}]}),
            executor=Executor(wd),
        )
        agent.apply_desired({"version": 1, "jobs": []})
        return _measure(agent.tick, seconds=seconds, burst=burst)


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def bench_agent_process(gpus: int, seconds: int, fixture: Path) -> dict[str, Any]:
    """A whole `tessera-agent run` process (fake NVML, 8 GPUs) connected to a local websocket portal: its own
    CPU time over `seconds` once it is up (sampling, metrics and heartbeats sent, asyncio and websockets)."""
    import asyncio

    from websockets.asyncio.server import serve

    from agent import protocol

    async def run() -> dict[str, Any]:
        received = {"metrics": 0, "heartbeat": 0}
        up = asyncio.Event()

        async def handler(ws):
            async for text in ws:
                msg = protocol.decode(text)
                received[msg["type"]] = received.get(msg["type"], 0) + 1
                if msg["type"] in protocol.RELIABLE:
                    await ws.send(protocol.encode(protocol.ack(msg["id"])))
                if msg["type"] == "hello":
                    await ws.send(
                        protocol.encode(protocol.message("desired_state", {"version": 1, "jobs": []}))
                    )
                if msg["type"] == "metrics":
                    up.set()

        with tempfile.TemporaryDirectory() as wd:
            token = Path(wd) / "token"
            token.write_text("bench")
            async with serve(handler, "127.0.0.1", 0) as server:
                port = server.sockets[0].getsockname()[1]
                env = {**os.environ, "TESSERA_FAKE_NVML": str(fixture), "TESSERA_FAKE_NVML_GPUS": str(gpus)}
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "agent.cli", "run", "--portal", f"http://127.0.0.1:{port}",
                    "--token-file", str(token), "--node", "bench", "--backend", "nvml", "--work-dir", wd,
                    cwd=str(REPO), env=env, stderr=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                try:
                    await asyncio.wait_for(up.wait(), 60)
                    before = dict(received)
                    cpu0, t0 = _proc_cpu_s(proc.pid), time.perf_counter()
                    await asyncio.sleep(seconds)
                    cpu, wall = _proc_cpu_s(proc.pid) - cpu0, time.perf_counter() - t0
                finally:
                    proc.terminate()
                    await proc.wait()
        return {
            "wall_s": round(wall, 2),
            "process_cpu_s": round(cpu, 3),
            "cpu_s_per_wall_s": round(cpu / wall, 5),
            "cpu_pct_of_one_core": round(100 * cpu / wall, 3),
            "metrics_messages": received["metrics"] - before["metrics"],
            "heartbeats": received["heartbeat"] - before["heartbeat"],
            "note": "CPU ticks from /proc (10 ms resolution); fake NVML cost included",
        }

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=5, help="paced samples, one a second")
    parser.add_argument("--burst", type=int, default=500, help="back-to-back samples for per-sample cost")
    parser.add_argument(
        "--fixture", type=Path, default=None, help="NVML fixture dir (../shared/fixtures/nvml-h200)"
    )
    parser.add_argument("--no-process", action="store_true", help="skip the whole-agent-process measurement")
    parser.add_argument("--json", action="store_true", help="JSON only (the default output is JSON too)")
    args = parser.parse_args(argv)
    fixture = args.fixture or fake_pynvml.default_fixture_dir()
    results: dict[str, Any] = {}
    if (fixture / "nvml_snapshot.json").exists():
        results["nvml_fake"] = bench_fake_nvml(args.gpus, args.seconds, args.burst, fixture)
    else:
        results["nvml_fake"] = {"skipped": f"no NVML fixture at {fixture}"}
    results["sim"] = bench_sim(args.gpus, args.seconds, args.burst)
    results["agent_tick_sim"] = bench_tick(args.gpus, args.seconds, args.burst)
    results["nvml_real"] = bench_real_nvml(args.gpus, args.seconds, args.burst)
    if (fixture / "nvml_snapshot.json").exists() and not args.no_process:
        results["agent_process_fake_nvml"] = bench_agent_process(args.gpus, max(args.seconds, 10), fixture)
    out = {
        "bench": "agent_sampling",
        "gpus": args.gpus,
        "seconds": args.seconds,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "results": results,
    }
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
