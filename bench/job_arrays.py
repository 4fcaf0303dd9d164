"""Job arrays on a large idle cluster: one request for a 10,000-task array, the scheduling cycles until its first
8,000 tasks are placed, a `%50` array's most tasks placed at once, and a chain of 1,000 jobs (one, an array
fanning out after it, one fanning in after the array). Prints JSON.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tessera REDIS_URL=redis://127.0.0.1:6379/6 \\
        .venv/bin/python -m bench.job_arrays [--nodes 1000 --tasks 10000 --first 8000]

It creates and drops its own database (<name>_bench next to DATABASE_URL's) and empties REDIS_URL's database.
The cluster is `--nodes` nodes of 8 whole-GPU cards (half A100, half H100), bulk-inserted, with one team whose
quota holds all of it. What it runs is the portal's own code in this process: the API's submit view (DRF's test
client: the view, the serializer, the validation and one transaction, without an HTTP server) and
`cycle_run_once` (snapshot, engine, apply) back to back, as the Celery cycle task runs them. Tasks count as
started when placed: no agents run here (`bench/cluster_scale.py` runs agents, without arrays). For comparison,
the same run times `--singles` single submits through the same view, and scales them to the array's size: what a
sweep cost as one request per task. In the chain, each job ends the moment it is placed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from decimal import Decimal

GPUS_PER_NODE = 8
TARGETS = {"array_accept_s": 1.0, "array_first_8000_running_s": 20.0}
# (No target is set for dependency_chain_s: it is measured, with the cycles it took.)


def seed(*, nodes: int) -> tuple:
    """An idle cluster and one team (with a quota of all of it) and its member, as bulk rows."""
    from django.contrib.auth import get_user_model

    from quotas.models import Quota
    from quotas.services import membership_set, priority_classes_ensure_defaults, quota_save, team_create
    from scheduling.choices import SharingMode
    from scheduling.inventory.models import Gpu, GpuModel, Node

    classes = {pc.name: pc for pc in priority_classes_ensure_defaults()}
    models = [
        GpuModel.objects.create(
            name=name, memory_mib=81920, compute_capability=Decimal(cc), sharing_modes=["exclusive"]
        )
        for name, cc in (("A100-80GB", "8.0"), ("H100-80GB", "9.0"))
    ]
    Node.objects.bulk_create(
        Node(name=f"gpu-{i:04d}", cpu_milli=256_000, memory_mib=2048 * 1024) for i in range(nodes)
    )
    Gpu.objects.bulk_create(
        Gpu(
            node=node,
            index=g,
            uuid=f"GPU-{node.name}-{g}",
            model=models[k % 2],
            memory_mib=81920,
            numa_node=g // 4,
            sharing_mode=SharingMode.EXCLUSIVE,
        )
        for k, node in enumerate(Node.objects.order_by("name"))
        for g in range(GPUS_PER_NODE)
    )
    team = team_create(slug="sweeps", display_name="Sweeps")
    gpus = nodes * GPUS_PER_NODE
    quota_save(
        quota=Quota(
            team=team,
            guaranteed_gpus=Decimal(gpus),
            limit_gpus=Decimal(gpus),
            guaranteed_gpu_memory_mib=gpus * 81920,
            limit_gpu_memory_mib=gpus * 81920,
            default_priority_class=classes["training"],
        ),
        actor=None,
    )
    user = get_user_model().objects.create_user(username="sweeper", password="x" * 20)
    membership_set(user=user, team=team)
    return team, user


def client_for(user):
    from rest_framework.test import APIClient

    from quotas.tokens import api_token_create

    _, token = api_token_create(user=user, name="bench")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def submit(client, body: dict) -> tuple[dict, float]:
    t0 = time.perf_counter()
    response = client.post("/api/v1/jobs/", body, format="json")
    took = time.perf_counter() - t0
    if response.status_code != 201:
        raise SystemExit(f"submit refused: {response.status_code} {response.content[:500]!r}")
    return response.json(), took


def placed_tasks(array_id: int) -> int:
    from scheduling.jobs.models import Job
    from scheduling.jobs.states import ACTIVE_STATES

    return Job.objects.filter(
        array_job_id=array_id, array_task_id__isnull=False, state__in=ACTIVE_STATES
    ).count()


def cycles_until(array_id: int, wanted: int, *, max_cycles: int) -> dict:
    """Run cycles back to back until `wanted` of the array's tasks are placed; their phases and the wall time."""
    from scheduling.cycle.runner import cycle_run_once

    reports = []
    t0 = time.perf_counter()
    while placed_tasks(array_id) < wanted and len(reports) < max_cycles:
        reports.append(cycle_run_once().as_dict())
    wall = time.perf_counter() - t0
    return {
        "s": round(wall, 2),
        "placed": placed_tasks(array_id),
        "cycles": len(reports),
        "per_cycle": [
            {k: r[k] for k in ("pending", "placed", "snapshot_s", "engine_s", "apply_s")} for r in reports
        ],
    }


def idle_again() -> None:
    """Every job gone and every card free (the bench has no agents to confirm stops), the tables vacuumed."""
    from django.db import connection

    from scheduling.inventory.models import Gpu
    from scheduling.jobs.models import Job

    Job.objects.all().delete()
    Gpu.objects.update(allocated_memory_mib=0, allocated_compute_pct=0)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def all_end_at_once() -> None:
    """Every placed job succeeds now and gives its cards back, as agents would report (in three statements)."""
    from django.utils import timezone

    from scheduling.inventory.models import Gpu
    from scheduling.jobs.models import Job, Slice
    from scheduling.jobs.states import ACTIVE_STATES

    Slice.objects.all().delete()
    Gpu.objects.update(allocated_memory_mib=0, allocated_compute_pct=0)
    now = timezone.now()
    Job.objects.filter(state__in=ACTIVE_STATES).update(state="succeeded", started_at=now, finished_at=now)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--first", type=int, default=8_000)
    parser.add_argument("--singles", type=int, default=200, help="single submits timed for comparison")
    parser.add_argument("--throttle", type=int, default=50, help="the %%N of the throttled array")
    parser.add_argument(
        "--chain", type=int, default=1000, help="jobs in the dependency chain (fan-out, fan-in)"
    )
    args = parser.parse_args()

    import psycopg

    from bench.cluster_scale import bench_database

    admin_url, _, bench_name = bench_database()  # <DATABASE_URL name>_bench afresh, REDIS_URL's emptied
    os.environ.update(
        TESSERA_API_SUBMIT_RATE="1000000/min", TESSERA_MAX_ARRAY_TASKS=str(max(args.tasks, 10_000))
    )
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections

    from scheduling.cycle.runner import cycle_run_once
    from scheduling.jobs.array_tasks import array_cancel
    from scheduling.jobs.models import Job

    result: dict = {"benchmark": "job_arrays", "nodes": args.nodes, "gpus": args.nodes * GPUS_PER_NODE}
    try:
        call_command("migrate", verbosity=0)
        _, user = seed(nodes=args.nodes)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        client = client_for(user)
        body = {"name": "sweep", "command": "python sweep.py", "gpus": 1}

        client.get("/api/v1/jobs/")  # warm: the first request loads what every later one uses
        # One request, then cycles until the first tasks are placed on the idle cluster.
        array, accept_s = submit(client, {**body, "array": f"0-{args.tasks - 1}"})
        result["array_tasks"] = args.tasks
        result["array_accept_s"] = round(accept_s, 3)
        result["array_rows_after_accept"] = Job.objects.count()
        first = cycles_until(array["id"], min(args.first, args.tasks), max_cycles=50)
        result["array_first_placed"] = first["placed"]
        result["array_first_8000_running_s"] = first["s"]
        result["array_first_cycles"] = first
        result["array_rows_after_first"] = Job.objects.count()
        idle_again()

        # A %N array over several cycles: never more than N placed at once.
        throttled, _ = submit(client, {**body, "array": f"0-999%{args.throttle}"})
        most = 0
        for _ in range(4):
            cycles_until(throttled["id"], 10**9, max_cycles=1)
            most = max(most, placed_tasks(throttled["id"]))
        result["array_throttle"] = args.throttle
        result["array_throttle_max_running"] = most
        array_cancel(job=Job.objects.get(pk=throttled["id"]), actor=None)
        idle_again()

        # A chain of --chain jobs: one, then an array of the rest but one fanning out after it (afterok), then
        # one fanning in after the whole array. Each job ends the moment it is placed (no agents here).
        root, _ = submit(client, {**body, "name": "prepare"})
        fan_out, _ = submit(
            client,
            {**body, "name": "train", "array": f"0-{args.chain - 3}", "depends_on": f"afterok:{root['id']}"},
        )
        fan_in, _ = submit(client, {**body, "name": "evaluate", "depends_on": f"afterok:{fan_out['id']}"})
        t0 = time.perf_counter()
        cycles = 0
        while Job.objects.get(pk=fan_in["id"]).state == "pending" and cycles < 100:
            cycle_run_once()
            cycles += 1
            all_end_at_once()
        result["dependency_chain_jobs"] = args.chain
        result["dependency_chain_s"] = round(time.perf_counter() - t0, 2)
        result["dependency_chain_cycles"] = cycles
        result["dependency_chain_end"] = Job.objects.get(pk=fan_in["id"]).state
        idle_again()

        # Singles through the same view, for comparison: a sweep as one request per task.
        single_s = [submit(client, {**body, "name": f"single-{i}"})[1] for i in range(args.singles)]
        result["single_submit_p50_ms"] = round(statistics.median(single_s) * 1000, 1)
        result["singles_for_array_est_s"] = round(statistics.mean(single_s) * args.tasks, 1)
        result["load_average"] = [round(x, 2) for x in os.getloadavg()]
        result["targets"] = TARGETS
        result["met"] = {
            "array_accept_s": result["array_accept_s"] <= TARGETS["array_accept_s"],
            "array_first_8000_running_s": first["placed"] >= min(args.first, args.tasks)
            and first["s"] <= TARGETS["array_first_8000_running_s"],
            "array_throttle_max_running": most <= args.throttle,
        }
    finally:
        connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{bench_name}" WITH (FORCE)')
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
