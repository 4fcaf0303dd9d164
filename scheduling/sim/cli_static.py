"""`tessera simulate static`: replay an openb node and pod list with the published protocol and print the result."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Sequence

from scheduling.engine.openb_profiles import POLICIES, openb_profile
from scheduling.sim.openb import TraceError, load_nodes, load_pods
from scheduling.sim.static import expected_pods, run_static


def parse_seeds(text: str) -> list[int]:
    """'42-51' -> 42..51; '42,45,47' -> those; '42' -> [42]."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                low, high = (int(value) for value in part.split("-", 1))
                if high < low:
                    raise ValueError
                seeds.extend(range(low, high + 1))
            elif part:
                seeds.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must look like 42-51 or 42,43: got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("no seeds given")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessera simulate static",
        description="Static packing replay of an openb trace (the FGD paper's protocol) through the engine.",
    )
    parser.add_argument("--nodes", required=True, help="node list CSV (openb_node_list_gpu_node.csv)")
    parser.add_argument("--pods", required=True, help="pod list CSV (openb_pod_list_*.csv)")
    parser.add_argument("--policy", required=True, choices=POLICIES)
    parser.add_argument(
        "--seeds", type=parse_seeds, default=parse_seeds("42-51"), help="e.g. 42-51 (default)"
    )
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")
    parser.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    return parser


def _summary(result: dict) -> str:
    lines = [
        f"policy {result['policy']}: {result['nodes']} nodes, {result['gpus']} GPUs, "
        f"{result['original_pods']} pods, seeds {result['seeds'][0]}..{result['seeds'][-1]}",
        f"unallocated GPU at arrival 100%: {result['unallocated_pct_at_100']:.2f}% "
        f"(sd {result['unallocated_pct_at_100_sd']:.2f})",
        f"fragmentation at arrival 90%: {result['frag_pct_at_90']:.2f}% of capacity",
        f"runtime: {result['runtime_s']:.1f} s",
    ]
    return "\n".join(lines)


def main_static(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        nodes = load_nodes(args.nodes)
        pods = load_pods(args.pods)
    except TraceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    profile = openb_profile(args.policy)
    show_progress = not args.no_progress and (not args.json or sys.stderr.isatty())
    bar = None
    # The bar is a convenience (the `sim` extra installs tqdm).
    if show_progress and importlib.util.find_spec("tqdm") is not None:
        from tqdm import tqdm

        per_seed = expected_pods(pods, sum(node.gpus for node in nodes) * 1000)
        bar = tqdm(total=per_seed * len(args.seeds), unit="pod", file=sys.stderr, desc=args.policy)
    try:
        report = run_static(
            nodes, pods, profile=profile, seeds=args.seeds, on_pod=(bar.update if bar is not None else None)
        )
    finally:
        if bar is not None:
            bar.total = bar.n  # the length per seed was an estimate
            bar.refresh()
            bar.close()
    result = report.as_dict()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(_summary(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main_static())
