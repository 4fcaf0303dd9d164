"""`tessera simulate scenario ...` and `tessera simulate dynamic ...`: run, print figures, write reports.

Also runnable as `python -m scheduling.sim.cli_dynamic scenario|dynamic ...`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from scheduling.sim.des import SimConfig, SimResult
from scheduling.sim.dynamic import DEFAULT_TEAMS, QOS_CLASSES, run_dynamic
from scheduling.sim.metrics import summarize
from scheduling.sim.report import write_run_report
from scheduling.sim.runs import run_scenario
from scheduling.sim.scenario import builtin_scenarios
from scheduling.sim.scenario_types import ScenarioError

DEFAULT_OUT = Path("reports")
__all__ = ["main", "main_dynamic", "main_scenario", "run_scenario"]  # run_scenario lives in runs.py


def _table(summary: dict) -> str:
    lines = [f"{summary.get('scenario', 'run')}: {summary.get('gpus')} GPUs on {summary.get('nodes')} nodes"]
    head = f"{'policy':<22}{'alloc':>7}{'util':>7}{'frag':>7}{'wait p50':>10}{'wait p95':>10}{'preempt':>9}{'lost GPU-h':>11}"
    extra = any(p.get("training_wait_s") is not None for p in summary["policies"].values())
    if extra:
        head += f"{'training wait':>15}"
    lines.append(head)
    for name, p in summary["policies"].items():
        w = p["wait"]
        row = (
            f"{name:<22}{p['allocation']:>7.1%}{p['utilization']:>7.1%}{p['fragmentation']:>7.1%}"
            f"{_dur(w['wait_p50_s']):>10}{_dur(w['wait_p95_s']):>10}{p['preemptions']:>9}{p['lost_gpu_s'] / 3600:>11.2f}"
        )
        if extra:
            tw = _dur(p.get("training_wait_s"))
            row += (
                "  " + f"{tw + ('' if p.get('training_started') in (True, None) else ' (not started)'):>13}"
            )
        lines.append(row)
    lines += ["", *_guarantee_table(summary)]
    if any((p.get("idle") or {}).get("jobs") for p in summary["policies"].values()):
        lines += ["", *_idle_table(summary)]
    return "\n".join(lines)


def _idle_table(summary: dict) -> list[str]:
    """Per policy: the jobs that sit idle part of each hour (notebooks), how many were stopped idle, the card-hours
    held idle and given back, and the others' waits."""
    head = (
        f"{'idle GPUs':<22}{'idle jobs':>10}{'stopped':>9}{'held idle GPU-h':>17}{'given back GPU-h':>18}"
        f"{'others wait mean':>18}{'p95':>9}{'never started':>15}"
    )
    lines = [head]
    for name, p in summary["policies"].items():
        idle = p.get("idle") or {}
        others = idle.get("others_wait") or {}
        lines.append(
            f"{name:<22}{idle.get('jobs', 0):>10}{idle.get('stopped_idle', 0):>9}"
            f"{idle.get('gpu_hours_held_idle', 0):>17.1f}{idle.get('gpu_hours_reclaimed', 0):>18.1f}"
            f"{_dur(others.get('wait_mean_s')):>18}{_dur(others.get('wait_p95_s')):>9}"
            f"{others.get('never_started', 0):>15}"
        )
    lines.append(
        "held idle: GPU-hours held on idle cards; given back: the GPU-hours (busy and idle) the stopped sessions "
        "would still have held until their natural end; others wait: every other job's queue wait (docs/simulator.md)"
    )
    return lines


def _guarantee_table(summary: dict) -> list[str]:
    """Per policy: quota satisfaction, time to guarantee, evictions (of within-guarantee work by other teams,
    across teams, within a team), priority inversions, borrowed-share error, Jain's index and lost work."""
    head = (
        f"{'guarantees':<22}{'quota sat':>10}{'episodes':>9}{'ttg p50':>8}{'ttg p95':>8}{'ttg max':>8}"
        f"{'wg evict':>9}{'x-team':>7}{'in-team':>8}{'invert':>7}{'share err':>10}{'jain':>7}"
        f"{'lost pre/fail GPU-h':>21}{'lost %':>8}"
    )
    lines = [head]
    for name, p in summary["policies"].items():
        ttg = p.get("time_to_guarantee") or {}
        lost = f"{_num(p.get('lost_gpu_h_preemption'), '.2f')}/{_num(p.get('lost_gpu_h_failure'), '.2f')}"
        lines.append(
            f"{name:<22}{_num(p.get('quota_satisfaction_rate'), '.1%'):>10}{ttg.get('episodes', '-'):>9}"
            f"{_dur(ttg.get('p50_s')):>8}{_dur(ttg.get('p95_s')):>8}{_dur(ttg.get('max_s')):>8}"
            f"{p.get('within_guarantee_evictions_by_other_teams', '-'):>9}{p.get('evictions_cross_team', '-'):>7}"
            f"{p.get('evictions_within_team', '-'):>8}{p.get('priority_inversions', '-'):>7}"
            f"{_num(p.get('borrowed_share_error'), '.1%'):>10}{_num(p.get('jain_index'), '.3f'):>7}"
            f"{lost:>21}{_num(p.get('lost_pct_of_delivered'), '.2f'):>8}"
        )
    lines.append(
        "ttg: time to guarantee per episode; wg evict: within-guarantee jobs evicted for another team; "
        "invert: priority inversions (docs/simulator.md, Metrics)"
    )
    return lines


def _num(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _dur(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.2f}h"


def _emit(summary: dict, args: argparse.Namespace, name: str, results: dict[str, SimResult]) -> None:
    if not args.no_report:
        files = write_run_report(Path(args.out), name, results, summary, plots=not args.no_plots)
        print(f"report: {files[0].parent}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(_table(summary))


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--out", default=str(DEFAULT_OUT), help="report directory (JSON, CSV, PNG); default reports/"
    )
    parser.add_argument("--no-report", action="store_true", help="write no files, only print")
    parser.add_argument("--no-plots", action="store_true", help="write JSON and CSV but no PNG")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main_scenario(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tessera simulate scenario",
        description="Run a YAML scenario (a built-in name or a path) under each of its policies.",
        epilog=f"built-in scenarios: {', '.join(builtin_scenarios())}",
    )
    parser.add_argument("scenario", help="built-in name (e.g. seed-case) or path to a YAML file")
    parser.add_argument("--policy", action="append", help="run only this policy of the scenario (repeatable)")
    parser.add_argument("--seed", type=int, help="override the scenario's seed")
    _common(parser)
    args = parser.parse_args(argv)
    try:
        scenario, results, summary = run_scenario(
            args.scenario, policies=args.policy, seed=args.seed, progress=not args.quiet
        )
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _emit(summary, args, scenario.name, results)
    return 0


def main_dynamic(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tessera simulate dynamic",
        description="Replay an openb pod list on its timestamps (creation to deletion) through the engine.",
    )
    parser.add_argument("--nodes", required=True, help="openb node list CSV")
    parser.add_argument("--pods", required=True, help="openb pod list CSV (with timestamps)")
    parser.add_argument(
        "--policy", action="append", help="engine profile name (repeatable); default: default"
    )
    parser.add_argument("--teams", type=int, default=DEFAULT_TEAMS, help="teams the pods are spread over")
    parser.add_argument("--limit", type=int, help="replay only the first N pods of the list")
    parser.add_argument(
        "--compression",
        type=float,
        default=1.0,
        help="divide arrival times by this (runtimes kept): more load",
    )
    parser.add_argument(
        "--cycle-interval", type=float, default=10.0, help="seconds between scheduling cycles"
    )
    parser.add_argument("--checkpoint-interval", type=float, help="seconds of work between checkpoints")
    parser.add_argument(
        "--horizon", type=float, help="seconds of the metrics window (default: up to the last arrival)"
    )
    parser.add_argument("--node-mtbf", type=float, help="random node failures: mean seconds between failures")
    parser.add_argument("--node-repair", type=float, default=3600.0, help="seconds a failed node stays lost")
    parser.add_argument("--seed", type=int, default=0)
    _common(parser)
    args = parser.parse_args(argv)
    policies = args.policy or ["default"]
    try:
        runs = run_dynamic(
            nodes_csv=args.nodes,
            pods_csv=args.pods,
            policies=policies,
            teams=args.teams,
            limit=args.limit,
            compression=args.compression,
            checkpoint_interval_s=args.checkpoint_interval,
            config=SimConfig(
                cycle_interval_s=args.cycle_interval,
                seed=args.seed,
                progress=not args.quiet,
                horizon_s=args.horizon,
                node_mtbf_s=args.node_mtbf,
                node_repair_s=args.node_repair,
            ),
        )
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    name = f"dynamic-{Path(args.pods).stem}"
    results = {r.policy: r.result for r in runs}
    summary: dict = {
        "scenario": name,
        "nodes_csv": str(args.nodes),
        "pods_csv": str(args.pods),
        "nodes": runs[0].nodes if runs else 0,
        "gpus": runs[0].result.capacity_milli // 1000 if runs else 0,
        "jobs": runs[0].jobs if runs else 0,
        "teams": args.teams,
        "team_rule": "team-(crc32(pod name) mod teams)",
        "qos_classes": {
            k: {"class": v.name, "priority": v.priority, "preemptible": v.preemptible}
            for k, v in QOS_CLASSES.items()
        },
        "compression": args.compression,
        "policies": {},
    }
    for r in runs:
        figures = summarize(r.result)
        summary["policies"][r.policy] = {"profile": r.policy, **figures}
    _emit(summary, args, name, results)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "scenario":
        return main_scenario(argv[1:])
    if argv and argv[0] == "dynamic":
        return main_dynamic(argv[1:])
    print("usage: python -m scheduling.sim.cli_dynamic {scenario,dynamic} ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
