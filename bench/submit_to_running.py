"""Submit-to-running latency with free capacity: daphne, a Celery worker and beat, two simulated agents. JSON out.

Each job is submitted alone (the previous one already running, capacity free) and timed from its submit commit
to the portal recording it running (the agent's start report processed): `started_at - submitted_at`, both
database timestamps. Target: p99 <= 2 s (the Kubernetes pod-startup SLO is 5 s).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tessera REDIS_URL=redis://127.0.0.1:6379/14 \\
        .venv/bin/python bench/submit_to_running.py --jobs 50

It creates and drops its own database (<name>_bench next to DATABASE_URL's) and uses REDIS_URL's database.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.support import percentile

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _bench_database(url: str) -> tuple[str, str, str]:
    parts = urlsplit(url)
    name = parts.path.lstrip("/") or "tessera"
    bench = f"{name}_bench"
    admin = urlunsplit((parts.scheme, parts.netloc, "/postgres", "", ""))
    return urlunsplit((parts.scheme, parts.netloc, f"/{bench}", "", "")), admin, bench


def _recreate(admin_url: str, name: str, *, drop_only: bool = False) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{name}"')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--job-seconds", type=float, default=0.3, help="how long each job runs")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        print("set DATABASE_URL (PostgreSQL) and REDIS_URL", file=sys.stderr)
        return 2
    bench_url, admin_url, bench_name = _bench_database(os.environ["DATABASE_URL"])
    _recreate(admin_url, bench_name)
    os.environ["DATABASE_URL"] = bench_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from scheduling.choices import JobState
    from scheduling.coordination import redis_client
    from scheduling.cycle.models import NodeSync
    from scheduling.cycle.requests import KEYS
    from scheduling.jobs.fields import JobSpec
    from scheduling.jobs.models import Job
    from scheduling.jobs.submit import job_submit
    from tests.pipeline.harness import Cluster, seed, wait_for

    call_command("migrate", verbosity=0)
    redis_client().delete(*KEYS)
    root = Path(tempfile.mkdtemp(prefix="tessera-bench-"))
    # The agents tick at the production default (1 s); a new desired state wakes them at once anyway.
    # The cycle debounce is the production default too.
    cluster = Cluster(root, agent_sample_s=1.0, extra_env={"TESSERA_CYCLE_DEBOUNCE_S": "0.05"})
    people = seed(cluster)
    latencies: list[float] = []
    try:
        cluster.start_web()
        cluster.start_worker()
        cluster.start_beat()
        for node in cluster.nodes:
            cluster.start_agent(node)
        wait_for(
            "two agents",
            lambda: NodeSync.objects.filter(connected_at__isnull=False).count() == 2,
            timeout_s=60,
        )
        time.sleep(1.0)
        for i in range(args.jobs + 3):  # the first three warm the worker and the agents up
            job = job_submit(
                submitter=people["alice"],
                team=people["team"],
                spec=JobSpec(name=f"bench-{i}", command=f"sleep {args.job_seconds}", gpus=1),
            )
            wait_for(
                f"job {job.pk} running",
                lambda job=job: Job.objects.filter(pk=job.pk, started_at__isnull=False).exists(),
                timeout_s=30,
                interval_s=0.02,
            )
            job.refresh_from_db()
            if i >= 3:
                latencies.append((job.started_at - job.submitted_at).total_seconds())
            wait_for(
                "it to finish (capacity free again)",
                lambda job=job: Job.objects.filter(
                    pk=job.pk, state__in=[JobState.SUCCEEDED, JobState.FAILED]
                ).exists(),
                timeout_s=30,
                interval_s=0.05,
            )
    except BaseException:
        print(cluster.logs(), file=sys.stderr)
        raise
    finally:
        cluster.stop_all()
        cluster.kill_job_processes()
        from django.db import connections

        connections.close_all()
        _recreate(admin_url, bench_name, drop_only=True)
    result = {
        "benchmark": "submit_to_running",
        "jobs": len(latencies),
        "agents": 2,
        "p50_s": round(percentile(latencies, 50), 3),
        "p90_s": round(percentile(latencies, 90), 3),
        "p99_s": round(percentile(latencies, 99), 3),
        "max_s": round(max(latencies), 3),
        "mean_s": round(statistics.fmean(latencies), 3),
        "target_p99_s": 2.0,
        "meets_target": percentile(latencies, 99) <= 2.0,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "settings": {
            "agent_sample_s": cluster.agent_sample_s,
            "cycle_debounce_s": float(cluster.env["TESSERA_CYCLE_DEBOUNCE_S"]),
        },
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
