"""The agents' socket alone: one daphne and N simulated nodes (bench/cluster_scale.py's, the real protocol: hello,
a heartbeat every 5 s, a sample every second), no scheduler. Prints JSON: daphne's CPU per second of wall time.

    python -m bench.agent_traffic --nodes 200 [--jobs-per-node 8] [--window-s 20] [--profile FILE]

`--jobs-per-node` places that many one-GPU jobs on each node first (running, as the agents report them), so
samples carry jobs to route; `--profile FILE` runs daphne under cProfile and writes its stats (pstats) there.
Uses `<DATABASE_URL name>_bench` and REDIS_URL's database as bench/cluster_scale.py does, and stops everything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.cluster_scale import (
    BIN,
    Procs,
    _port_open,
    bench_database,
    proc_cpu_s,
    queue_jobs,
    seed,
    soft_wait,
)
from tests.support import free_port, wait_for


def place_everywhere(jobs_per_node: int) -> int:
    """One-GPU jobs on each node's first cards, placed through the cycle's own apply (no worker runs here)."""
    from scheduling.cycle import apply, lease
    from scheduling.engine import types as eng
    from scheduling.inventory.models import Node
    from scheduling.jobs.models import Job

    names = list(Node.objects.order_by("name").values_list("name", flat=True))
    pending = list(Job.objects.filter(state="pending").order_by("id").values_list("pk", "gpu_memory_mib"))
    placements = []
    k = 0
    for name in names:
        for g in range(jobs_per_node):
            if k >= len(pending):
                break
            placements.append(eng.Placement(str(pending[k][0]), (eng.Assignment(name, g, 0, 1000),)))
            k += 1
    # The whole card: its memory as the ledger holds it.
    from scheduling.inventory.models import Gpu

    memory = dict(Gpu.objects.values_list("node__name", "memory_mib").distinct())
    placements = [
        eng.Placement(
            p.job_id, tuple(eng.Assignment(a.node, a.gpu_index, memory[a.node], 1000) for a in p.assignments)
        )
        for p in placements
    ]
    result = apply.apply_decisions(
        decisions=eng.Decisions(placements=tuple(placements)), epoch=lease.epoch_issue()
    )
    from scheduling.cycle.desired_state import desired_state_sync

    desired_state_sync()
    return len(result.placed)


def read_status(path: Path) -> dict:
    """A simulated agents' process's counters (it rewrites the file each second: a read may catch it empty)."""
    for _ in range(20):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.1)
    return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--jobs-per-node", type=int, default=0)
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--agent-procs", type=int, default=2)
    parser.add_argument("--settle-s", type=float, default=8.0, help="wait after the hellos before measuring")
    parser.add_argument("--profile", type=Path, help="write daphne's cProfile stats here")
    args = parser.parse_args()

    import psycopg

    admin_url, _, bench_name = bench_database()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    root = Path(tempfile.mkdtemp(prefix="tessera-agents-"))
    seeded = seed(nodes=args.nodes, root=root)
    placed = 0
    if args.jobs_per_node:
        queue_jobs(
            people=seeded["people"], count=args.nodes * args.jobs_per_node, command="sleep 100000", models=()
        )
        placed = place_everywhere(args.jobs_per_node)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "INFO",
        "TESSERA_LOG_DIR": str(root / "portal-logs"),
        "DATABASE_CONN_MAX_AGE": "600",
    }
    procs = Procs(root, env)
    port = free_port()
    result: dict = {"benchmark": "agent_traffic", "nodes": args.nodes, "jobs_placed": placed}
    try:
        serve = ["-b", "127.0.0.1", "-p", str(port), "portal.asgi:application"]
        if (
            args.profile
        ):  # the event loop's thread under cProfile, written on SIGUSR1 (Procs.stop_all sends it)
            code = (
                "import cProfile, signal, sys; from daphne.cli import CommandLineInterface; "
                "import time; pr = cProfile.Profile(time.thread_time); "
                f"signal.signal(signal.SIGUSR1, lambda *_: (pr.disable(), pr.dump_stats({str(args.profile.resolve())!r}))); "
                "sys.argv = ['daphne', *sys.argv[1:]]; pr.enable(); CommandLineInterface.entrypoint()"
            )
            argv = [sys.executable, "-c", code, *serve]
        else:
            argv = [str(BIN / "daphne"), *serve]
        web = procs.start("daphne", argv)
        wait_for("daphne", lambda: _port_open(port), timeout_s=60, scale=False)
        specs = seeded["specs"]
        per = -(-len(specs) // args.agent_procs)
        sims = []
        for k in range(args.agent_procs):
            part = root / f"nodes-{k}.json"
            part.write_text(json.dumps(specs[k * per : (k + 1) * per]))
            argv = [sys.executable, "-m", "bench.cluster_scale", "--sim-agents", str(part)]
            argv += ["--url", f"ws://127.0.0.1:{port}/ws/agent/", "--status", str(root / f"agents{k}.status")]
            sims.append(procs.start(f"agents{k}", argv))
        from scheduling.cycle.models import NodeSync

        missed: list[str] = []
        t0 = time.perf_counter()
        soft_wait(
            "hellos",
            lambda: NodeSync.objects.filter(connected_at__isnull=False).count() >= args.nodes,
            timeout_s=240,
            interval_s=1.0,
            missed=missed,
        )
        result["connect_s"] = round(time.perf_counter() - t0, 1)
        time.sleep(args.settle_s)  # the nodes' first desired states and log pulls have gone by
        status0 = [read_status(root / f"agents{k}.status") for k in range(args.agent_procs)]
        c0, s0, w0 = proc_cpu_s(web.pid), sum(proc_cpu_s(p.pid) for p in sims), time.perf_counter()
        time.sleep(args.window_s)
        wall = time.perf_counter() - w0
        c1, s1 = proc_cpu_s(web.pid), sum(proc_cpu_s(p.pid) for p in sims)
        status1 = [read_status(root / f"agents{k}.status") for k in range(args.agent_procs)]

        def per_s(counter: str) -> float:
            return round(
                sum(b.get(counter, 0) - a.get(counter, 0) for a, b in zip(status0, status1, strict=True))
                / wall,
                1,
            )

        result["messages_per_s"] = {
            c: per_s(c) for c in ("sent", "metrics", "heartbeats", "heartbeat_acks", "log_requests")
        }
        status = status1
        result.update(
            {
                "window_s": round(wall, 1),
                "daphne_cpu_pct": round(100 * (c1 - c0) / wall, 1),
                "daphne_cpu_pct_per_node": round(100 * (c1 - c0) / wall / args.nodes, 3),
                "sim_agents_cpu_pct": round(100 * (s1 - s0) / wall, 1),
                "heartbeats_acked": sum(s.get("heartbeat_acks", 0) for s in status),
                "heartbeats_sent": sum(s.get("heartbeats", 0) for s in status),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "timeouts": missed,
            }
        )
    finally:
        procs.stop_all()
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{bench_name}" WITH (FORCE)')
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
