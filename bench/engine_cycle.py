"""Time full scheduling cycles on a synthetic cluster and queue; prints JSON (see docs/engine.md, "Performance").

    python -m bench.engine_cycle --nodes 1000 --gpus-per-node 8 --pending 10000 --running 5000 --json

The cluster mixes models, NVLink islands, NUMA nodes and MPS / MIG cards; the queue is 60 % slices, 30 % jobs of
1-8 whole GPUs and 10 % multi-node gangs, spread over teams with quotas. Running jobs are placed by the engine
itself first (not timed). Each timed cycle sees a fresh snapshot built with new node objects, as the production
cycle gets from the database: last cycle's placements are running, jobs past their max runtime have ended, and
the clock has moved on by `--interval-s`.

`--scenario fill` is a freshly filled queue on an empty cluster instead (`--pending 20000 --running 0` unless
given): half the nodes A100, half H100, and every queued job asks for one A100 card or a slice of one, so the
first cycle places thousands of jobs and then finds the A100s full while the H100s stay free.

    python -m bench.engine_cycle --scenario fill --json

`--baseline REF` runs the same benchmark with the engine of git commit REF too, alternately (`--rounds` each, 3 by
default), and compares the median cycle CPU time: a cycle may cost at most 1.3 times the baseline's.

    python -m bench.engine_cycle --nodes 1000 --pending 10000 --running 5000 --baseline 0ab7261 --json
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from types import MappingProxyType

from bench.baseline import REPO, run_python, worktree
from scheduling.engine import get_profile, run_cycle
from scheduling.engine.framework import Profile
from scheduling.engine.resources import allocate_on_node, job_host_on
from scheduling.engine.types import (
    Decisions,
    Gpu,
    Job,
    Node,
    Quota,
    Request,
    Sharing,
    Snapshot,
    TopologyNeed,
)

GIB = 1024
MODELS = [  # name, memory GiB, compute capability, NVLink islands, share of nodes
    ("H100", 80, (9, 0), [8], 0.25),
    ("A100", 80, (8, 0), [8], 0.35),
    ("V100", 32, (7, 0), [4, 4], 0.2),
    ("L4", 24, (8, 9), [], 0.2),
]
MIG_PROFILES_GIB = (10, 20, 40, 80)
TEAMS = [f"org{o}/team{t}" for o in range(4) for t in range(5)]


FILL_MODELS = [("H100", 80, (9, 0), [8], 0.5), ("A100", 80, (8, 0), [8], 0.5)]


def build_nodes(rng: random.Random, count: int, gpus_per_node: int, models=MODELS) -> list[Node]:
    nodes = []
    weights = [m[4] for m in models]
    for i in range(count):
        model, mem_gib, cc, islands, _ = rng.choices(models, weights)[0]
        roll = rng.random()
        sharing = (
            Sharing.MPS if roll < 0.2 else Sharing.MIG if roll < 0.3 and model in ("A100", "H100") else None
        )
        cards = []
        for g in range(gpus_per_node):
            mode = sharing or Sharing.EXCLUSIVE
            cards.append(
                Gpu(
                    index=g,
                    uuid=f"GPU-{i}-{g}",
                    model=model,
                    memory_mib=mem_gib * GIB,
                    compute_capability=cc,
                    numa_node=g * 2 // gpus_per_node,
                    sharing=mode,
                    mig_profiles_mib=tuple(p * GIB for p in MIG_PROFILES_GIB) if mode is Sharing.MIG else (),
                )
            )
        links = set()
        start = 0
        for size in islands:
            size = min(size, gpus_per_node - start)
            links |= {(a, b) for a in range(start, start + size) for b in range(a + 1, start + size)}
            start += size
        nodes.append(
            Node(
                name=f"{model.lower()}-{i:05d}",
                cpu_milli=128_000,
                memory_mib=1024 * GIB,
                gpus=tuple(cards),
                nvlink=frozenset(links),
            )
        )
    return nodes


QUEUE_MIX = (0.6, 0.9)  # slices below 0.6, whole-GPU jobs below 0.9, gangs above
RUNNING_MIX = (0.8, 0.98)  # what already runs is mostly small, so that --running jobs fit the cluster


def make_job(rng: random.Random, number: int, now: float, gpus_per_node: int, mix=QUEUE_MIX) -> Job:
    roll = rng.random()
    models: tuple[str, ...] = ()
    if roll < mix[0]:
        mem = rng.choice([0, 4, 5, 10, 20])
        comp = rng.choice([100, 250, 500]) if mem == 0 else rng.choice([0, 0, 100, 250])
        request = Request(
            gpu_memory_mib=mem * GIB,
            gpu_compute_milli=comp,
            cpu_milli=rng.choice([1000, 4000]),
            memory_mib=rng.choice([8, 16]) * GIB,
        )
    elif roll < mix[1]:
        gpus = min(gpus_per_node, rng.choice([1, 1, 2, 2, 4, 8]))
        if rng.random() < 0.3:
            models = (rng.choice(["H100", "A100"]),)
        request = Request(
            gpus=gpus,
            gpu_models=models,
            # NUMA only where it can be met (two NUMA nodes per node).
            topology=rng.choice(
                [TopologyNeed.NONE, TopologyNeed.NONE, TopologyNeed.NVLINK]
                + ([TopologyNeed.NUMA] if gpus <= gpus_per_node // 2 else [])
            )
            if gpus > 1
            else TopologyNeed.NONE,
            cpu_milli=gpus * 8000,
            memory_mib=gpus * 64 * GIB,
        )
    else:
        request = Request(
            gpus=gpus_per_node,
            nodes=rng.choice([2, 2, 4]),
            topology=TopologyNeed.NVLINK,
            gpu_models=(rng.choice(["H100", "A100"]),),
            cpu_milli=32_000,
            memory_mib=256 * GIB,
        )
    return queued_job(rng, number, now, request)


def queued_job(rng: random.Random, number: int, now: float, request: Request) -> Job:
    """A queued job asking `request`: its team, priority, preemptibility, submit time and runtime drawn."""
    return Job(
        id=f"job-{number:06d}",
        team=rng.choice(TEAMS),
        request=request,
        priority=rng.choice([10, 50, 50, 100]),
        preemptible=rng.random() < 0.8,
        submit_time=now - rng.uniform(0, 7200),
        max_runtime_s=rng.choice([None, 1800.0, 3600.0, 4 * 3600.0, 24 * 3600.0]),
    )


def make_fill_job(rng: random.Random, number: int, now: float, gpus_per_node: int) -> Job:
    """A queued job of the fill scenario: one whole A100 or a slice of one (half each)."""
    if rng.random() < 0.5:
        mem = rng.choice([0, 4, 5, 10, 20])
        request = Request(
            gpu_memory_mib=mem * GIB,
            gpu_compute_milli=rng.choice([100, 250, 500]) if mem == 0 else rng.choice([0, 0, 100, 250]),
            gpu_models=("A100",),
            cpu_milli=rng.choice([1000, 4000]),
            memory_mib=rng.choice([8, 16]) * GIB,
        )
    else:
        request = Request(gpus=1, gpu_models=("A100",), cpu_milli=8000, memory_mib=64 * GIB)
    return queued_job(rng, number, now, request)


def quotas_for(gpu_count: int) -> dict[str, Quota]:
    share = gpu_count * 1000 // len(TEAMS)
    return {
        t: Quota(
            team=t,
            guaranteed_gpu_memory_mib=share * 60 * GIB // 1000,
            limit_gpu_memory_mib=None,
            guaranteed_compute_milli=share,
            limit_compute_milli=None,
            weight=1.0 + (i % 3),
        )
        for i, t in enumerate(TEAMS)
    }


def ledger(nodes: list[Node], running: list[Job]) -> tuple[Node, ...]:
    """New node objects carrying the running jobs' holdings, as snapshot_from_db would build them."""
    by_name = {n.name: replace(n) for n in nodes}
    for job in running:
        per_node: dict[str, list] = {}
        for a in job.assignments:
            per_node.setdefault(a.node, []).append(a)
        for name in set(per_node) | set(job.cpu_assignments):
            cpu, mem = job_host_on(job, name)
            by_name[name] = allocate_on_node(by_name[name], tuple(per_node.get(name, ())), cpu, mem)
    return tuple(by_name[n.name] for n in nodes)


SCENARIOS = {  # name -> (node models, queued-job maker, default pending, default running)
    "steady": (MODELS, make_job, 10_000, 5_000),
    "fill": (FILL_MODELS, make_fill_job, 20_000, 0),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="steady")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--pending", type=int, default=None, help="10,000 (steady) or 20,000 (fill)")
    parser.add_argument("--running", type=int, default=None, help="5,000 (steady) or 0 (fill)")
    parser.add_argument("--cycles", type=int, default=7)
    parser.add_argument("--interval-s", type=float, default=60.0)
    parser.add_argument("--profile", default="default")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument(
        "--baseline", default="", help="also run commit REF's engine, alternately, and compare"
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side with --baseline")
    args = parser.parse_args(argv)
    _, _, pending, running = SCENARIOS[args.scenario]
    args.pending = pending if args.pending is None else args.pending
    args.running = running if args.running is None else args.running
    return args


def cycles(args: argparse.Namespace, profile: Profile) -> Iterator[tuple[Snapshot, Decisions, float, float]]:
    """Set up the scenario (not timed), then run `args.cycles` cycles: (snapshot, decisions, wall s, CPU s)
    each, the world moving on between them."""
    models, queued_job, _, _ = SCENARIOS[args.scenario]
    rng = random.Random(args.seed)
    now = 1_000_000.0
    nodes = build_nodes(rng, args.nodes, args.gpus_per_node, models)
    gpu_count = args.nodes * args.gpus_per_node
    quotas = MappingProxyType(quotas_for(gpu_count))
    fill = replace(profile, name=f"{profile.name}-fill", actions=("allocate",), admit=())

    # Set-up: the engine places the running jobs on the empty cluster.
    candidates = [
        make_job(rng, i, now - 3600, args.gpus_per_node, RUNNING_MIX) for i in range(args.running * 2)
    ]
    placed = (
        run_cycle(Snapshot(now=now - 3600, nodes=tuple(nodes), pending=tuple(candidates)), fill).placements
        if candidates
        else ()
    )
    by_id = {j.id: j for j in candidates}
    running = []
    for p in placed[: args.running]:
        job = by_id[p.job_id]
        running.append(
            replace(
                job,
                assignments=p.assignments,
                cpu_assignments=MappingProxyType(dict(p.cpu)),
                start_time=now - rng.uniform(0, 3 * 3600),
                borrowed=rng.random() < 0.3,
            )
        )
    args.running_placed_at_setup = len(running)
    pending = [queued_job(rng, args.running * 2 + i, now, args.gpus_per_node) for i in range(args.pending)]
    next_id = args.running * 2 + args.pending

    for _ in range(args.cycles):
        snap = Snapshot(
            now=now,
            nodes=ledger(nodes, running),
            running=tuple(running),
            pending=tuple(pending),
            quotas=quotas,
            seed=args.seed,
        )
        started, cpu_started = time.perf_counter(), time.process_time()
        decisions = run_cycle(snap, profile)
        wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
        yield snap, decisions, wall_s, cpu_s
        # The world moves on: placed jobs run, evicted ones requeue, finished ones leave, new ones arrive.
        evicted = {e.job_id for e in decisions.evictions}
        pend_by_id = {j.id: j for j in pending}
        started_jobs = [
            replace(
                pend_by_id[p.job_id],
                assignments=p.assignments,
                cpu_assignments=MappingProxyType(dict(p.cpu)),
                start_time=now,
                borrowed=p.borrowed,
            )
            for p in decisions.placements
        ]
        placed_ids = {p.job_id for p in decisions.placements}
        requeued = [
            replace(j, assignments=(), cpu_assignments=MappingProxyType({}), start_time=None)
            for j in running
            if j.id in evicted
        ]
        now += args.interval_s
        running = [
            j
            for j in running
            if j.id not in evicted and (j.max_runtime_s is None or j.start_time + j.max_runtime_s > now)
        ] + started_jobs
        arrivals = [queued_job(rng, next_id + i, now, args.gpus_per_node) for i in range(len(placed_ids))]
        next_id += len(arrivals)
        pending = [j for j in pending if j.id not in placed_ids] + requeued + arrivals


def compare(args: argparse.Namespace, argv: list[str]) -> int:
    """This engine against commit `args.baseline`'s in the same run: the same benchmark, alternately in a
    subprocess of each (`args.rounds` each), compared by the median of their cycle CPU time (p50)."""
    rest = [a for a in argv if a != "--json"]
    i = rest.index("--baseline")
    rest = rest[:i] + rest[i + 2 :]
    if "--rounds" in rest:
        j = rest.index("--rounds")
        rest = rest[:j] + rest[j + 2 :]
    bench = ["-m", "bench.engine_cycle", *rest, "--json"]
    here: list[dict] = []
    there: list[dict] = []
    with worktree(args.baseline) as tree:
        for _ in range(args.rounds):
            there.append(json.loads(run_python(tree, bench)))
            here.append(json.loads(run_python(REPO, bench)))
    mine = statistics.median(r["cycle_cpu_s_p50"] for r in here)
    theirs = statistics.median(r["cycle_cpu_s_p50"] for r in there)
    result = {
        "scenario": args.scenario,
        "nodes": args.nodes,
        "pending": here[0]["pending"],
        "baseline": args.baseline,
        "rounds": args.rounds,
        "cycle_cpu_s_p50": round(mine, 4),
        "baseline_cycle_cpu_s_p50": round(theirs, 4),
        "ratio": round(mine / theirs, 3) if theirs else None,
        "target_ratio_max": COMPARE_TARGET,
        "met": bool(theirs) and mine / theirs <= COMPARE_TARGET,
        "runs": here,
        "baseline_runs": there,
    }
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


# A cycle may cost at most this much more than the baseline's (docs/engine.md, "Performance").
COMPARE_TARGET = 1.3


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.baseline:
        return compare(args, argv)
    profile = get_profile(args.profile)
    setup_started = time.perf_counter()
    runs = cycles(args, profile)
    times: list[float] = []
    # CPU seconds: less sensitive than wall time to other work on a shared machine.
    cpu_times: list[float] = []
    placements = evictions = reservations = 0
    setup_s = None
    for _, decisions, wall_s, cpu_s in runs:
        if setup_s is None:
            setup_s = time.perf_counter() - setup_started - wall_s
        times.append(wall_s)
        cpu_times.append(cpu_s)
        placements += len(decisions.placements)
        evictions += len(decisions.evictions)
        reservations += len(decisions.reservations)

    gpu_count = args.nodes * args.gpus_per_node
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ordered = sorted(times)
    result = {
        "scenario": args.scenario,
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "gpus": gpu_count,
        "pending": args.pending,
        "running": args.running,
        "running_placed_at_setup": args.running_placed_at_setup,
        "profile": profile.name,
        "cycles": args.cycles,
        "cycle_s_first": round(times[0], 4),
        "cycle_cpu_s_first": round(cpu_times[0], 4),
        "cycle_s_p50": round(statistics.median(times), 4),
        "cycle_s_p95": round(ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))], 4),
        "cycle_s_max": round(ordered[-1], 4),
        "cycle_cpu_s_p50": round(statistics.median(cpu_times), 4),
        "placements": placements,
        "evictions": evictions,
        "reservations": reservations,
        "placements_per_s": round(placements / sum(times), 1) if sum(times) else None,
        "peak_rss_mib": round(peak_rss_mib, 1),
        "setup_s": round(setup_s or 0.0, 2),
    }
    if not args.json:
        print(
            f"engine cycle benchmark, {args.scenario} ({args.nodes} nodes x {args.gpus_per_node} GPUs)",
            file=sys.stderr,
        )
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
