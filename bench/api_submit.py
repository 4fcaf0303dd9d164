"""Benchmark the API against PostgreSQL: job submits per second with concurrent clients, and listing a queue of
10,000 pending jobs. Prints JSON.

It creates (or reuses) a benchmark database, loads the demo cluster, starts gunicorn on a free port with several
worker processes, drives it from load-generator processes over keep-alive HTTP connections, then fills the queue
with 10,000 pending jobs and times GET /api/v1/queue/ pages.

    .venv/bin/python bench/api_submit.py --workers 3 --threads 2 --clients 24 --duration 15

The default server is what docs/operations.md recommends for API-heavy sites: gthread, cores + 1 workers, 2
threads each.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from tests.support import free_port, percentile

ROOT = Path(__file__).resolve().parents[1]

SPECS = [
    # A mix as researchers send it: slices for notebooks and inference, whole GPUs for training.
    {
        "name": "notebook",
        "command": "jupyter lab",
        "gpu_memory": "10GiB",
        "compute_pct": 25,
        "team": "ai-lab/training",
    },
    {
        "name": "eval",
        "command": "python eval.py",
        "gpu_memory": "20GiB",
        "compute_pct": 50,
        "team": "ai-lab/training",
    },
    {
        "name": "train",
        "command": "torchrun train.py",
        "gpus": 2,
        "team": "ai-lab/training",
        "max_runtime": "2h",
    },
    {
        "name": "sweep",
        "command": "python sweep.py",
        "gpus": 1,
        "team": "ai-lab/training",
        "cpu": "8",
        "memory": "32GiB",
    },
]


def latency_summary(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "p50": round(percentile(ms, 50), 2),
        "p95": round(percentile(ms, 95), 2),
        "p99": round(percentile(ms, 99), 2),
        "mean": round(statistics.fmean(ms), 2) if ms else float("nan"),
        "max": round(max(ms), 2) if ms else float("nan"),
    }


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
            if ppid == pid:
                found.append(int(entry.name))
    return found


def _backend_pids(database_url: str) -> list[int]:
    import psycopg

    name = urlparse(database_url).path.lstrip("/")
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (name,)
        ).fetchall()
    return [r[0] for r in rows]


def cpu_snapshot(server_pid: int, database_url: str) -> dict[str, dict[int, float]]:
    """CPU seconds so far of the server's processes and of the database's backends."""
    server = [server_pid, *_children(server_pid)]
    return {
        "server": {pid: _proc_cpu_s(pid) for pid in server},
        "postgres": {pid: _proc_cpu_s(pid) for pid in _backend_pids(database_url)},
    }


def cpu_used(before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]) -> dict[str, float]:
    return {kind: sum(cpu - before[kind].get(pid, 0.0) for pid, cpu in after[kind].items()) for kind in after}


def ensure_database(url: str) -> None:
    import psycopg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    admin = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def setup_data(*, users: int) -> list[str]:
    """Migrate, load the demo cluster, clear jobs, make `users` members of ai-lab/training with tokens."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from demo.seed import load_demo
    from quotas.models import ApiToken, IdempotencyRecord, Team
    from quotas.services import membership_set
    from quotas.tokens import api_token_create
    from scheduling.jobs.models import Job, JobEvent, Slice

    call_command("migrate", verbosity=0)
    load_demo()
    Slice.objects.all().delete()
    JobEvent.objects.all().delete()
    Job.objects.all().delete()
    IdempotencyRecord.objects.all().delete()
    team = Team.objects.get(slug="ai-lab/training")
    tokens = []
    user_model = get_user_model()
    for i in range(users):
        user, _ = user_model.objects.get_or_create(username=f"bench-{i}")
        membership_set(user=user, team=team)
        ApiToken.objects.filter(user=user).delete()
        tokens.append(api_token_create(user=user, name="bench")[1])
    return tokens


def fill_queue(*, jobs: int) -> int:
    """Exactly `jobs` pending jobs across teams and priorities, positioned as a cycle would leave them."""
    from django.contrib.auth import get_user_model

    from quotas.models import PriorityClass, Team
    from scheduling.jobs.models import Job, JobEvent, Slice

    Slice.objects.all().delete()
    JobEvent.objects.all().delete()
    Job.objects.all().delete()
    teams = list(Team.objects.filter(parent__isnull=False))
    classes = list(PriorityClass.objects.all())
    users = list(get_user_model().objects.filter(memberships__isnull=False).distinct())
    rng = random.Random(7)
    rows = []
    for i in range(jobs):
        slice_job = rng.random() < 0.6
        rows.append(
            Job(
                team=rng.choice(teams),
                submitter=rng.choice(users),
                name=f"job-{i}",
                command="python train.py",
                gpus=0 if slice_job else rng.choice([1, 2, 4, 8]),
                gpu_memory_mib=rng.choice([10240, 20480, 40960]) if slice_job else 0,
                compute_pct=rng.choice([10, 25, 50]) if slice_job else 0,
                priority_class=rng.choice(classes),
                pending_reason_code="capacity",
                pending_reason="No node has the free GPUs right now.",
                queue_position=i + 1,
            )
        )
    Job.objects.bulk_create(rows, batch_size=2000)
    return Job.objects.filter(state="pending").count()


def _client_process(
    host: str, port: int, tokens: list[str], threads: int, start_at: float, stop_at: float, out: mp.Queue
) -> None:
    import threading

    results: list[tuple[float, float, int]] = []
    lock = threading.Lock()

    def worker(token: str, seed: int) -> None:
        rng = random.Random(seed)
        conn = http.client.HTTPConnection(host, port, timeout=30)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        local = []
        while time.time() < stop_at:
            body = json.dumps(rng.choice(SPECS))
            t0 = time.perf_counter()
            try:
                conn.request("POST", "/api/v1/jobs/", body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                status = response.status
                if response.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = http.client.HTTPConnection(host, port, timeout=30)
            except (OSError, http.client.HTTPException):
                status = 0
                conn.close()
                conn = http.client.HTTPConnection(host, port, timeout=30)
            local.append((time.time(), time.perf_counter() - t0, status))
        with lock:
            results.extend(local)

    while time.time() < start_at:
        time.sleep(0.01)
    pool = [threading.Thread(target=worker, args=(tok, i)) for i, tok in enumerate(tokens[:threads])]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    out.put((results, usage.ru_utime + usage.ru_stime))


def run_submits(
    *,
    port: int,
    tokens: list[str],
    processes: int,
    threads: int,
    warmup_s: float,
    duration_s: float,
    server_pid: int,
    database_url: str,
) -> dict:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    start_at = time.time() + 1.0
    stop_at = start_at + warmup_s + duration_s
    procs = []
    for p in range(processes):
        mine = tokens[p * threads : (p + 1) * threads]
        proc = ctx.Process(
            target=_client_process, args=("127.0.0.1", port, mine, threads, start_at, stop_at, out)
        )
        proc.start()
        procs.append(proc)
    cpu_before = cpu_snapshot(server_pid, database_url)
    results = []
    client_cpu_s = 0.0
    for _ in procs:
        rows, cpu_s = out.get(timeout=warmup_s + duration_s + 120)
        results.extend(rows)
        client_cpu_s += cpu_s
    cpu = cpu_used(cpu_before, cpu_snapshot(server_pid, database_url))
    for proc in procs:
        proc.join()
    all_ok = sum(1 for r in results if r[2] == 201)
    per_submit_ms = {
        "server": round(1000 * cpu["server"] / max(1, all_ok), 2),
        "postgres_backends": round(1000 * cpu["postgres"] / max(1, all_ok), 2),
        "load_generator": round(1000 * client_cpu_s / max(1, all_ok), 2),
    }
    server_side_ms = per_submit_ms["server"] + per_submit_ms["postgres_backends"]
    window_start = start_at + warmup_s
    measured = [r for r in results if r[0] >= window_start]
    ok = [r for r in measured if r[2] == 201]
    errors: dict[str, int] = {}
    for r in measured:
        if r[2] != 201:
            errors[str(r[2])] = errors.get(str(r[2]), 0) + 1
    return {
        "clients": processes * threads,
        "load_processes": processes,
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "submits": len(ok),
        "submits_per_s": round(len(ok) / duration_s, 1),
        "errors": errors,
        "latency_ms": latency_summary([r[1] for r in ok]),
        # CPU per accepted submit over the whole run (warm-up included), measured from /proc.
        "cpu_ms_per_submit": per_submit_ms,
        # What two cores doing nothing but serving (web workers + PostgreSQL) would sustain at that cost.
        "projected_submits_per_s_two_dedicated_cores": round(2000 / server_side_ms, 1)
        if server_side_ms
        else None,
    }


def run_queue_reads(*, port: int, token: str, requests: int, page_size: int, pending: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {token}"}
    pages = max(1, (pending + page_size - 1) // page_size)
    rng = random.Random(3)
    timings: dict[str, list[float]] = {"first_page": [], "random_page": [], "jobs_pending_first_page": []}
    count_seen = None
    for i in range(requests):
        kind = ("first_page", "random_page", "jobs_pending_first_page")[i % 3]
        if kind == "first_page":
            path = f"/api/v1/queue/?page_size={page_size}"
        elif kind == "random_page":
            path = f"/api/v1/queue/?page_size={page_size}&page={rng.randint(1, pages)}"
        else:
            path = f"/api/v1/jobs/?state=pending&page_size={page_size}"
        t0 = time.perf_counter()
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        body = response.read()
        elapsed = time.perf_counter() - t0
        if response.status != 200:
            raise RuntimeError(f"GET {path} -> {response.status}: {body[:200]!r}")
        if kind == "first_page":
            count_seen = json.loads(body)["count"]
        timings[kind].append(elapsed)
    everything = [t for values in timings.values() for t in values]
    return {
        "pending_jobs": count_seen,
        "page_size": page_size,
        "requests": requests,
        "latency_ms": latency_summary(everything),
        "by_request": {k: latency_summary(v) for k, v in timings.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tessera_bench"),
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12"),
        help="'' for none",
    )
    parser.add_argument(
        "--workers", type=int, default=(os.cpu_count() or 1) + 1, help="gunicorn worker processes (cores + 1)"
    )
    parser.add_argument("--threads", type=int, default=2, help="threads per gunicorn worker (gthread)")
    parser.add_argument("--worker-class", default="gthread", choices=["gthread", "sync"])
    parser.add_argument("--clients", type=int, default=24, help="concurrent client connections")
    parser.add_argument("--load-processes", type=int, default=2)
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds of submits")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--queue-jobs", type=int, default=10_000)
    parser.add_argument("--queue-requests", type=int, default=150)
    parser.add_argument("--page-size", type=int, default=50)
    args = parser.parse_args(argv)

    env = {
        **os.environ,
        "DATABASE_URL": args.database_url,
        "REDIS_URL": args.redis_url,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        # Throttle counters live per process; the benchmark measures capacity, not the per-user limit.
        "TESSERA_API_SUBMIT_RATE": "100000000/min",
        "DATABASE_CONN_MAX_AGE": "600",
        "LOG_LEVEL": "WARNING",
        "DEBUG": "false",
    }
    if not args.redis_url:
        env.pop("REDIS_URL")
    os.environ.update({k: v for k, v in env.items() if k != "REDIS_URL" or args.redis_url})
    ensure_database(args.database_url)
    threads_per_process = -(-args.clients // args.load_processes)
    tokens = setup_data(users=threads_per_process * args.load_processes)

    port = free_port()
    server_cmd = [
        str(Path(sys.executable).parent / "gunicorn"),
        "portal.wsgi:application",
        "--workers",
        str(args.workers),
        "--worker-class",
        args.worker_class,
        *(["--threads", str(args.threads)] if args.worker_class == "gthread" else []),
        "--bind",
        f"127.0.0.1:{port}",
        "--keep-alive",
        "30",
        "--log-level",
        "warning",
    ]
    server = subprocess.Popen(server_cmd, cwd=ROOT, env=env, start_new_session=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or server.poll() is not None:
                raise RuntimeError("the server did not start")
            time.sleep(0.2)

        submit = run_submits(
            port=port,
            tokens=tokens,
            processes=args.load_processes,
            threads=threads_per_process,
            warmup_s=args.warmup,
            duration_s=args.duration,
            server_pid=server.pid,
            database_url=args.database_url,
        )
        pending = fill_queue(jobs=args.queue_jobs)
        queue = run_queue_reads(
            port=port,
            token=tokens[0],
            requests=args.queue_requests,
            page_size=args.page_size,
            pending=pending,
        )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)

    result = {
        "benchmark": "api_submit",
        "server": {
            "command": "gunicorn portal.wsgi:application",
            "workers": args.workers,
            "worker_class": args.worker_class,
            "threads": args.threads if args.worker_class == "gthread" else 1,
            "database": "postgresql",
            "channel_layer": "redis" if args.redis_url else "in-memory",
        },
        "machine": {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2)},
        "submit": submit,
        "queue_listing": queue,
        "targets": {"submits_per_s": 300, "queue_listing_p95_ms": 200},
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
