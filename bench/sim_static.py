"""Time one static openb replay (one seed) of FGD and Tessera through the production engine; prints JSON.

python -m bench.sim_static [--trace-dir ../shared/traces/openb] [--pods default] [--seed 42] [--policies fgd,tessera]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time
from pathlib import Path

from scheduling.engine.openb_profiles import openb_profile
from scheduling.sim.openb import load_nodes, load_pods
from scheduling.sim.static import run_static_seed

DEFAULT_TRACE = Path(__file__).resolve().parents[1] / "../shared/traces/openb"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--pods", default="default", help="pod list suffix: default, gpushare40, ...")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--policies", default="fgd,tessera")
    args = parser.parse_args()
    nodes = load_nodes(args.trace_dir / "openb_node_list_gpu_node.csv")
    pods = load_pods(args.trace_dir / f"openb_pod_list_{args.pods}.csv")
    runs = []
    for policy in args.policies.split(","):
        started = time.perf_counter()
        result = run_static_seed(nodes, pods, profile=openb_profile(policy), seed=args.seed)
        wall_s = time.perf_counter() - started
        runs.append(
            {
                "policy": policy,
                "seed": args.seed,
                "pods": result.pods,
                "wall_s": round(wall_s, 3),
                "pods_per_s": round(result.pods / wall_s, 1),
                "unallocated_pct_at_100": round(result.unallocated_pct_at_100, 4),
                "meets_10s_target": wall_s <= 10.0,
            }
        )
    print(
        json.dumps(
            {
                "bench": "sim_static",
                "pod_list": args.pods,
                "nodes": len(nodes),
                "gpus": sum(node.gpus for node in nodes),
                "original_pods": len(pods),
                "engine": "scheduling.engine.run_cycle",
                "python": platform.python_version(),
                "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                "runs": runs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
