"""Check that a packing policy generalises: derive openb-like pod lists from the default one (more or fewer slices,
multi-GPU pods, model-restricted pods, CPU-only pods), replay them statically and compare two policies; prints JSON.

    python -m bench.static_generalisation [--trace-dir ../shared/traces/openb] [--seeds 52-54] [--policies fgd,tessera]

The variants are drawn with a fixed seed from the default list's own pods, so they resemble the published family
without being any of its members.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from dataclasses import replace
from pathlib import Path

from scheduling.engine.openb_profiles import openb_profile
from scheduling.sim.cli_static import parse_seeds
from scheduling.sim.openb import TracePod, load_nodes, load_pods
from scheduling.sim.static import run_static

DEFAULT_TRACE = Path(__file__).resolve().parents[1] / "../shared/traces/openb"


def derive_variants(
    base: list[TracePod], specs: list[tuple[str, ...]], seed: int = 2024
) -> dict[str, list[TracePod]]:
    rng = random.Random(seed)
    slices = [p for p in base if p.num_gpu == 1 and p.gpu_milli < 1000]
    multi = [p for p in base if p.num_gpu > 1]
    gpu_idx = [i for i, p in enumerate(base) if p.num_gpu > 0]
    variants: dict[str, list[TracePod]] = {}
    for pct in (20, 60, 80, 100):  # share of single-card pods that ask for a fraction of a card
        pods = list(base)
        single = [i for i in gpu_idx if pods[i].num_gpu == 1]
        current = [i for i in single if pods[i].gpu_milli < 1000]
        want = int(pct / 100 * len(single))
        if want > len(current):
            whole = [i for i in gpu_idx if pods[i].num_gpu == 1 and pods[i].gpu_milli == 1000]
            for i in rng.sample(whole, want - len(current)):
                donor = rng.choice(slices)
                pods[i] = replace(pods[i], gpu_milli=donor.gpu_milli, cpu_milli=donor.cpu_milli)
        else:
            for i in rng.sample(current, len(current) - want):
                pods[i] = replace(pods[i], gpu_milli=1000)
        variants[f"gpushare{pct}"] = pods
    for pct in (10, 30):  # share of GPU pods turned into 2-, 4- or 8-card pods
        pods = list(base)
        for i in rng.sample(gpu_idx, int(pct / 100 * len(gpu_idx))):
            donor = rng.choice(multi)
            pods[i] = replace(pods[i], num_gpu=donor.num_gpu, gpu_milli=1000, cpu_milli=donor.cpu_milli)
        variants[f"multigpu{pct}"] = pods
    for pct in (20, 33):  # share of GPU pods restricted to GPU models, as gpuspec10 restricts them
        pods = list(base)
        for i in rng.sample(gpu_idx, int(pct / 100 * len(gpu_idx))):
            pods[i] = replace(pods[i], gpu_spec=rng.choice(specs))
        variants[f"gpuspec{pct}"] = pods
    cpu_only = [p for p in base if p.num_gpu == 0]
    gpu_pods = [p for p in base if p.num_gpu > 0]
    for pct in (0, 200):  # CPU-only pods scaled
        pods = gpu_pods + [rng.choice(cpu_only) for _ in range(int(len(cpu_only) * pct / 100))]
        rng.shuffle(pods)
        variants[f"cpu{pct:03d}"] = pods
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("52-54"))
    parser.add_argument("--policies", default="fgd,tessera")
    args = parser.parse_args()
    nodes = load_nodes(args.trace_dir / "openb_node_list_gpu_node.csv")
    base = load_pods(args.trace_dir / "openb_pod_list_default.csv")
    specs = sorted(
        {p.gpu_spec for p in load_pods(args.trace_dir / "openb_pod_list_gpuspec10.csv") if p.gpu_spec}
    )
    policies = args.policies.split(",")
    rows = {}
    for name, pods in derive_variants(base, specs).items():
        rows[name] = {
            policy: round(
                run_static(
                    nodes, pods, profile=openb_profile(policy), seeds=args.seeds
                ).unallocated_pct_at_100,
                3,
            )
            for policy in policies
        }
        if len(policies) == 2:
            first, second = policies
            rows[name][f"{second}/{first}"] = round(rows[name][second] / rows[name][first], 3)
    ratios = [row[f"{policies[1]}/{policies[0]}"] for row in rows.values()] if len(policies) == 2 else []
    print(
        json.dumps(
            {
                "bench": "static_generalisation",
                "seeds": args.seeds,
                "unallocated_pct_at_100": rows,
                "ratio_mean": round(statistics.fmean(ratios), 3) if ratios else None,
                "ratio_max": max(ratios) if ratios else None,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
