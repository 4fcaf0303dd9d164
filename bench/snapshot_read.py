"""Time the scheduling cycle's two big database reads on a large cluster: `snapshot_from_db()` and
`desired_state_sync()`. Prints JSON.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tessera REDIS_URL=redis://127.0.0.1:6379/6 \\
        .venv/bin/python -m bench.snapshot_read [--nodes 1000 --pending 20000 --repeat 3]

It creates and drops its own database (<name>_bench next to DATABASE_URL's). The cluster (`seed`, bulk-inserted
rows) has 8 GPUs a node: A100s, H100s and L4s, some cards shared by MPS, MIG or time-slicing, NVLink within
each node, a few cordoned and draining nodes and failed cards; about 4.5 running jobs a node (whole GPUs, slices,
two-node gangs, some borrowed), and `--pending` queued jobs of varied shapes. `seed` is also the varied database
the snapshot and desired-state tests read at a small size.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from urllib.parse import urlsplit, urlunsplit

GPUS_PER_NODE = 8
TEAMS = ("training", "vision", "speech", "nlp")
GANG_PORT = 29500


def seed(*, nodes: int, pending: int, rng_seed: int = 5) -> dict:
    """A varied cluster and queue in bulk rows (the rows the services write, without their side effects)."""
    from django.contrib.auth import get_user_model

    from quotas.models import PriorityClass, Quota, TeamPriorityClass
    from quotas.services import membership_set, priority_classes_ensure_defaults, team_create
    from scheduling.choices import GangMemberOutcome, GpuHealth, JobState, LinkKind, NodeState, SharingMode
    from scheduling.inventory.models import Gpu, GpuLink, GpuModel, Node
    from scheduling.jobs.models import GangMember, Job, Slice

    rng = random.Random(rng_seed)
    classes = {pc.name: pc for pc in priority_classes_ensure_defaults()}
    classes["batch"] = PriorityClass.objects.create(name="batch", value=10, preemption_grace_s=5)
    a100 = GpuModel.objects.create(
        name="A100-80GB",
        memory_mib=81920,
        compute_capability=Decimal("8.0"),
        sharing_modes=["exclusive", "mps", "mig", "timeslice"],
        mig_profiles=[
            {"name": "1g.10gb", "memory_mib": 9856, "instances": 7},
            {"name": "3g.40gb", "memory_mib": 40192, "instances": 2},
        ],
    )
    h100 = GpuModel.objects.create(
        name="H100-80GB",
        memory_mib=81559,
        compute_capability=Decimal("9.0"),
        sharing_modes=["exclusive", "mps"],
    )
    l4 = GpuModel.objects.create(
        name="L4",
        memory_mib=23034,
        compute_capability=Decimal("8.9"),
        sharing_modes=["exclusive", "timeslice"],
    )
    models = (a100, h100, l4)

    org = team_create(slug="lab", display_name="Lab")
    teams = [team_create(slug=f"lab/{n}", parent=org) for n in TEAMS]
    total = nodes * GPUS_PER_NODE
    for k, t in enumerate(teams):
        if k == 3:
            continue  # nlp has per-model rows only
        Quota.objects.create(
            team=t,
            guaranteed_gpus=Decimal(total // 8) + Decimal("0.5") * k,
            limit_gpus=None if k == 2 else Decimal(total // 2),
            guaranteed_gpu_memory_mib=total * 8192,
            limit_gpu_memory_mib=None if k == 2 else total * 40960,
            fair_share_weight=Decimal("1.5") if k == 1 else Decimal(1),
            default_priority_class=classes["training"],
        )
    Quota.objects.create(team=teams[0], gpu_model=h100, guaranteed_gpus=Decimal(4), limit_gpus=Decimal(16))
    Quota.objects.create(team=teams[3], gpu_model=a100, guaranteed_gpus=Decimal("2.25"))
    Quota.objects.create(team=teams[3], gpu_model=l4, guaranteed_gpu_memory_mib=65536)
    TeamPriorityClass.objects.create(team=org, priority_class=classes["critical"], limit_gpus=Decimal(4))
    TeamPriorityClass.objects.create(
        team=teams[1], priority_class=classes["training"], limit_gpus=Decimal("7.5")
    )

    users = get_user_model()
    people = []
    for k, t in enumerate(teams):
        user = users.objects.create_user(username=f"user{k}")  # no password: no hashing
        membership_set(user=user, team=t)
        people.append((user, t))

    node_rows = []
    for i in range(nodes):
        state = NodeState.READY
        if i % 50 == 7:
            state = NodeState.CORDONED
        elif i % 97 == 11:
            state = NodeState.DRAINING
        node_rows.append(
            Node(
                name=f"node-{i:04d}",
                state=state,
                cpu_milli=128_000,
                memory_mib=1024 * 1024,
                labels={"rack": f"r{i // 40}", "zone": "a" if i % 2 else "b"} if i % 3 else {},
                address=f"10.0.{i // 250}.{i % 250}" if i % 4 else "",
            )
        )
    Node.objects.bulk_create(node_rows, batch_size=2000)
    node_list = list(Node.objects.order_by("name"))
    node_model = {n.pk: models[i % 3] for i, n in enumerate(node_list)}

    gpu_rows = []
    for i, n in enumerate(node_list):
        model = node_model[n.pk]
        for g in range(GPUS_PER_NODE):
            mode, capacity = SharingMode.EXCLUSIVE, 100
            if g >= 6 and model is a100 and i % 4 == 0:
                mode = SharingMode.MIG
            elif g >= 6 and model is not l4 and i % 4 == 1:
                mode = SharingMode.MPS
            elif g == 7 and model is l4:
                mode, capacity = SharingMode.TIMESLICE, 200
            health = GpuHealth.OK
            if (i * GPUS_PER_NODE + g) % 211 == 5:
                health = GpuHealth.FAILED
            elif (i * GPUS_PER_NODE + g) % 173 == 3:
                health = GpuHealth.DEGRADED
            gpu_rows.append(
                Gpu(
                    node=n,
                    index=g,
                    uuid=f"GPU-{i:04d}-{g}",
                    model=model,
                    memory_mib=model.memory_mib,
                    numa_node=g // 4,
                    sharing_mode=mode,
                    health=health,
                    compute_capacity_pct=capacity,
                )
            )
    Gpu.objects.bulk_create(gpu_rows, batch_size=4000)
    gpus = {(g.node_id, g.index): g for g in Gpu.objects.all()}

    links = []
    for i, n in enumerate(node_list):
        if node_model[n.pk] is l4:
            continue  # PCIe only: no links recorded
        island = range(GPUS_PER_NODE) if i % 5 else range(4)  # some nodes: one island of four
        for a in island:
            for b in island:
                if a < b:
                    ga, gb = gpus[n.pk, a], gpus[n.pk, b]
                    links.append(GpuLink(gpu_a=ga, gpu_b=gb, kind=LinkKind.NVLINK, nvlink_count=12))
        if i % 5 == 0:
            links.append(GpuLink(gpu_a=gpus[n.pk, 3], gpu_b=gpus[n.pk, 4], kind=LinkKind.PHB))
    GpuLink.objects.bulk_create(links, batch_size=5000)

    now = datetime.now(UTC)
    jobs: list[Job] = []
    # (job index, node, gpu index, memory MiB, compute %) and (job index, node, rank, outcome, attempt)
    holds: list[tuple[int, Node, int, int, int]] = []
    members: list[tuple[int, Node, int, str, int]] = []

    def job(*, k: int, state: str = JobState.PENDING, **fields) -> int:
        user, team = people[k % len(people)]
        pc = classes[fields.pop("pc", "training")]
        row = Job(
            team=team,
            submitter=user,
            name=fields.pop("name", f"job-{len(jobs)}"),
            command=fields.pop("command", "python train.py"),
            priority_class=pc,
            preemptible=fields.pop("preemptible", pc.preemptible),
            state=state,
            **fields,
        )
        jobs.append(row)
        return len(jobs) - 1

    def running(**fields) -> dict:
        state = rng.choice(
            [JobState.RUNNING, JobState.RUNNING, JobState.RUNNING, JobState.STARTING, JobState.PLACED]
        )
        placed = now - timedelta(seconds=rng.randrange(60, 86400))
        extra = {"placed_at": placed, "attempt": fields.pop("attempt", 1), "state": state}
        if state != JobState.PLACED:
            extra["started_at"] = placed + timedelta(seconds=rng.randrange(1, 30))
        return {**fields, **extra}

    for i, n in enumerate(node_list):
        model = node_model[n.pk]
        k = i
        j = job(k=k, **running(gpus=1, env={"SEED": str(i)}, max_runtime_s=86400, cpu_milli=8000))
        holds.append((j, n, 0, model.memory_mib, 100))
        j = job(
            k=k + 1, **running(gpus=2, topology="nvlink", borrowed=i % 3 == 0, checkpoint_interval_s=1800)
        )
        holds += [(j, n, 1, model.memory_mib, 100), (j, n, 2, model.memory_mib, 100)]
        j = job(k=k + 2, **running(gpus=1, pc="inference" if i % 2 else "training", workdir="/scratch/x"))
        holds.append((j, n, 3, model.memory_mib, 100))
        mode = gpus[n.pk, 6].sharing_mode
        if mode == SharingMode.MIG:
            j = job(k=k + 3, **running(gpu_memory_mib=9856, compute_pct=14))
            holds.append((j, n, 6, 9856, 14))
            j = job(k=k + 1, **running(gpu_memory_mib=40192, compute_pct=42, borrowed=True))
            holds.append((j, n, 6, 40192, 42))
        elif mode == SharingMode.MPS:
            for share in (30, 25):
                j = job(k=k + share, **running(gpu_memory_mib=20000, compute_pct=share, env={"MPS": "1"}))
                holds.append((j, n, 6, 20000, share))
        elif gpus[n.pk, 7].sharing_mode == SharingMode.TIMESLICE:
            for _ in range(3):
                j = job(k=k + 2, **running(gpu_memory_mib=6000, compute_pct=60, pc="inference"))
                holds.append((j, n, 7, 6000, 60))
        if i % 5 == 0 and i + 1 < len(node_list):  # a two-node gang on GPU 5 of this node and the next
            j = job(k=k, **running(gpus=1, nodes=2, attempt=2, max_runtime_s=7200))
            failing = i % 25 == 0
            for rank, member in enumerate((n, node_list[i + 1])):
                holds.append((j, member, 5, node_model[member.pk].memory_mib, 100))
                outcome = GangMemberOutcome.FAILED if failing and rank == 1 else GangMemberOutcome.RUNNING
                members.append((j, member, rank, outcome, 2))
            members.append((j, n, 1, GangMemberOutcome.FAILED, 1))  # the first attempt's rank 1 here

    shapes = [
        {"gpus": 1},
        {"gpus": 1, "gpu_models": ["A100-80GB"]},
        {"gpus": 2, "topology": "nvlink"},
        {"gpus": 4, "topology": "numa", "min_compute_capability": Decimal("8.0")},
        {"gpus": 8, "gpu_models": ["H100-80GB", "A100-80GB"]},
        {"gpus": 2, "nodes": 2},
        {"gpu_memory_mib": 20000, "compute_pct": 25},
        {"gpu_memory_mib": 9856},
        {"compute_pct": 50, "min_gpu_memory_mib": 40000},
        {
            "gpu_memory_mib": 6000,
            "compute_pct": 10,
            "gpu_models": ["L4"],
            "cpu_milli": 2000,
            "memory_mib": 8192,
        },
    ]
    for q in range(pending):
        shape = dict(rng.choice(shapes))
        shape["pc"] = rng.choice(["training", "training", "inference", "batch", "critical"])
        if q % 7 == 0:
            shape["checkpoint_interval_s"] = 600
        if q % 3 == 0:
            shape["max_runtime_s"] = rng.choice([3600, 86400])
        if q % 11 == 0:
            shape["preemptible"] = False
        job(k=q, name=f"q-{q}", env={"Q": str(q)} if q % 2 else {}, **shape)
    for q in range(max(2, pending // 50)):  # history: what the typical workload and fair-share usage read
        end = now - timedelta(hours=rng.randrange(1, 48))
        job(
            k=q,
            state=rng.choice([JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED]),
            gpus=rng.choice([1, 2, 4]),
            started_at=end - timedelta(hours=1),
            placed_at=end - timedelta(hours=1),
            finished_at=end,
        )

    Job.objects.bulk_create(jobs, batch_size=2000)
    # Submit times as a queue has them, some equal (the queue breaks ties by id).
    for k, row in enumerate(jobs):
        row.submitted_at = now - timedelta(seconds=(len(jobs) - k) // 3)
    Job.objects.bulk_update(jobs, ["submitted_at"], batch_size=2000)
    Slice.objects.bulk_create(
        (
            Slice(job=jobs[j], gpu=gpus[n.pk, g], memory_mib=mem, compute_pct=pct)
            for j, n, g, mem, pct in holds
        ),
        batch_size=5000,
    )
    ledger: dict[int, list[int]] = {}
    for _, n, g, mem, pct in holds:
        held = ledger.setdefault(gpus[n.pk, g].pk, [0, 0])
        held[0] += mem
        held[1] += pct
    touched = []
    for gpu_id, (mem, pct) in ledger.items():
        row = Gpu(pk=gpu_id, allocated_memory_mib=mem, allocated_compute_pct=pct)
        touched.append(row)
    Gpu.objects.bulk_update(touched, ["allocated_memory_mib", "allocated_compute_pct"], batch_size=4000)
    GangMember.objects.bulk_create(
        (
            GangMember(
                job=jobs[j],
                attempt=attempt,
                node=n,
                rank=rank,
                address=n.address or n.name,
                port=GANG_PORT + (j % 1000) if rank == 0 else None,
                outcome=outcome,
                ended_at=None if outcome == GangMemberOutcome.RUNNING else now,
                reported_state="" if outcome == GangMemberOutcome.RUNNING else "exited",
            )
            for j, n, rank, outcome, attempt in members
        ),
        batch_size=5000,
    )
    running_jobs = len({j for j, *_ in holds})
    return {"nodes": len(node_list), "gpus": len(gpus), "running": running_jobs, "pending": pending}


def _timed(fn, repeat: int) -> dict:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"min_s": round(min(times), 3), "median_s": round(statistics.median(times), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import psycopg

    parts = urlsplit(os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/tessera")
    bench_name = f"{parts.path.lstrip('/') or 'tessera'}_bench"
    admin_url = urlunsplit((parts.scheme, parts.netloc, "/postgres", "", ""))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{bench_name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{bench_name}"')
    os.environ.update(
        DATABASE_URL=urlunsplit((parts.scheme, parts.netloc, f"/{bench_name}", "", "")),
        DJANGO_SETTINGS_MODULE="portal.settings",
    )
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections

    from scheduling.cycle.desired_state import desired_state_sync
    from scheduling.cycle.models import NodeSync
    from scheduling.cycle.snapshot import snapshot_from_db
    from scheduling.jobs.models import Job

    try:
        call_command("migrate", verbosity=0)
        t0 = time.perf_counter()
        result: dict = {"benchmark": "snapshot_read", **seed(nodes=args.nodes, pending=args.pending)}
        result["seed_s"] = round(time.perf_counter() - t0, 1)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        snapshot_from_db()  # warm: imports, the request interning
        snap = _timed(snapshot_from_db, args.repeat)
        result["snapshot_read_s"] = snap["median_s"]
        result["snapshot_read"] = snap
        t0 = time.perf_counter()
        first = desired_state_sync()
        result["desired_state_sync_first_s"] = round(time.perf_counter() - t0, 3)
        result["desired_state_changed_first"] = len(first)
        steady = _timed(desired_state_sync, args.repeat)
        result["desired_state_sync_s"] = steady["median_s"]
        result["desired_state_sync"] = steady
        # A cycle that changed some nodes: 100 jobs gone from their nodes.
        gone = list(
            Job.objects.filter(slices__isnull=False, nodes=1)
            .distinct()
            .order_by("id")
            .values_list("id", flat=True)[:100]
        )
        Job.objects.filter(pk__in=gone).update(state="succeeded")
        t0 = time.perf_counter()
        some = desired_state_sync()
        result["desired_state_sync_some_changed_s"] = round(time.perf_counter() - t0, 3)
        result["desired_state_changed_some"] = len(some)
        result["node_syncs"] = NodeSync.objects.count()
        result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{bench_name}" WITH (FORCE)')
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
