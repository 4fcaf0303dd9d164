"""Big jobs among small ones: run scenarios x seeds through the simulator with one profile and check, per run, the
targets of docs/simulator.md ("Big jobs among small ones"); prints JSON.

    python -m bench.big_jobs                                  # the five built-in scenarios, seeds 1-5
    python -m bench.big_jobs --baseline HEAD~20               # also today's engine at that commit, same jobs
    python -m bench.big_jobs --scenarios big-jobs,./mine.yaml --seeds 1-3 --profile default

Per run, for every team with a guarantee: time to guarantee p95 at most the victims' grace + 60 s (the longest grace
of the scenario's preemptible classes) and max at most 15 min; quota satisfaction at least 0.98; no within-guarantee
job of kind "training" still waiting at the end; no work within a team's guarantee evicted for another team; work
lost at most 2 % of the GPU-hours delivered. Per scenario:
utilisation (mean over the seeds) at most one point below the baseline's, when one is given. `--baseline REF` runs
the same scenario files with the engine and simulator of git commit REF (a temporary worktree), so "today's" figures
come from the same jobs on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from bench.baseline import run_python, worktree

SCENARIOS = ("big-jobs", "gangs", "memory-guarantees", "mixed-models", "churn")
TTG_SLACK_S = 60.0
TTG_MAX_S = 900.0
QUOTA_SATISFACTION_MIN = 0.98
LOST_PCT_MAX = 2.0
UTILISATION_DROP_MAX = 0.01


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds.extend(range(int(low), int(high or low) + 1))
    return seeds


def scenario_path(name: str) -> str:
    """A scenario name or file, as an absolute path (the baseline worktree reads the same files)."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return str(path.resolve())
    here = Path(__file__).resolve().parents[1] / "scheduling" / "sim" / "scenarios" / f"{name}.yaml"
    return str(here)


def run_one(job: tuple[str, int, str]) -> dict:
    """One scenario at one seed: the figures the targets read. Uses only what older engines have too."""
    path, seed, profile_name = job
    from scheduling.sim.des import simulate
    from scheduling.sim.metrics import summarize
    from scheduling.sim.scenario import build_profile, load_scenario

    scenario = load_scenario(path)
    policy = next(
        (p for p in scenario.policies if p.profile in ("tessera-prod", "default")), scenario.policies[0]
    )
    profile = build_profile(profile_name or policy.profile)
    config = replace(scenario.config, seed=seed)
    result = simulate(
        nodes=scenario.nodes_for(policy),
        jobs=scenario.jobs_for(policy, seed=seed),
        profile=profile,
        quotas=scenario.quotas,
        config=config,
        failures=scenario.failures,
    )
    f = summarize(result)
    graces = [s.grace_s for s in scenario.streams if s.preemptible]
    by_team = f.get("time_to_guarantee", {}).get("by_team", {})
    never = f.get("owed_never_started", {"jobs": None, "by_kind": {}})
    return {
        "scenario": scenario.name,
        "seed": seed,
        "utilization": f["utilization"],
        "allocation": f["allocation"],
        "lost_pct_of_delivered": f.get("lost_pct_of_delivered"),
        "quota_satisfaction": f.get("quota_satisfaction", {}),
        "time_to_guarantee": {t: {"p95_s": v["p95_s"], "max_s": v["max_s"]} for t, v in by_team.items()},
        "victims_grace_s": max(graces, default=0.0),
        "within_guarantee_evictions_by_other_teams": f.get("within_guarantee_evictions_by_other_teams"),
        "owed_never_started": never.get("jobs"),
        "owed_trainings_never_started": never.get("by_kind", {}).get("training", 0),
        "time_owed_by_shape": f.get("time_owed_by_shape"),
        "wait_by_shape": {
            k: {"p50_s": v["wait_p50_s"], "p95_s": v["wait_p95_s"], "max_s": v["wait_max_s"]}
            for k, v in f.get("wait_by_shape", {}).items()
        },
        "moves": f.get("moves"),
        "lost_gpu_h_moves": f.get("lost_gpu_h_moves"),
        "reservations": f.get("reservations"),
        "whole_nvlink_nodes_free_mean": f.get("whole_nvlink_nodes_free_mean"),
        "engine_s": f.get("cycle_wall_s"),
    }


def checks(run: dict) -> dict[str, bool]:
    """Whether one run meets each target."""
    ttg_p95 = run["victims_grace_s"] + TTG_SLACK_S
    ttg = run["time_to_guarantee"].values()
    sat = [v for v in run["quota_satisfaction"].values() if v is not None]
    lost = run["lost_pct_of_delivered"]
    return {
        "time_to_guarantee_p95": all((v["p95_s"] or 0.0) <= ttg_p95 for v in ttg),
        "time_to_guarantee_max": all((v["max_s"] or 0.0) <= TTG_MAX_S for v in ttg),
        "quota_satisfaction": all(v >= QUOTA_SATISFACTION_MIN for v in sat),
        "owed_trainings_started": not run["owed_trainings_never_started"],
        "no_guaranteed_work_taken": not run["within_guarantee_evictions_by_other_teams"],
        "lost_work": lost is None or lost <= LOST_PCT_MAX,
    }


def run_all(paths: list[str], seeds: list[int], profile: str, workers: int) -> list[dict]:
    jobs = [(path, seed, profile) for path in paths for seed in seeds]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run_one, jobs))


def baseline_runs(ref: str, paths: list[str], seeds: list[int], workers: int) -> list[dict]:
    """The same runs with the engine and simulator of commit `ref` (this script, that commit's code)."""
    with worktree(ref) as tree:
        argv = [
            str(Path(__file__).resolve()),
            "--worker",
            "--seeds",
            ",".join(map(str, seeds)),
            "--workers",
            str(workers),
            "--scenarios",
            ",".join(paths),
        ]
        return json.loads(run_python(tree, argv))


def summary(runs: list[dict], base: list[dict] | None) -> dict:
    by_scenario: dict[str, dict] = {}
    for name in dict.fromkeys(r["scenario"] for r in runs):
        mine = [r for r in runs if r["scenario"] == name]
        util = statistics.fmean(r["utilization"] for r in mine)
        entry = {
            "seeds": [r["seed"] for r in mine],
            "utilization_mean": round(util, 4),
            "runs_meeting_every_target": sum(all(checks(r).values()) for r in mine),
            "failed": [
                {"seed": r["seed"], "targets": [k for k, v in checks(r).items() if not v]}
                for r in mine
                if not all(checks(r).values())
            ],
        }
        if base is not None:
            theirs = [r for r in base if r["scenario"] == name]
            base_util = statistics.fmean(r["utilization"] for r in theirs)
            entry["baseline_utilization_mean"] = round(base_util, 4)
            entry["utilization_kept"] = util >= base_util - UTILISATION_DROP_MAX
            entry["baseline_failed_runs"] = sum(not all(checks(r).values()) for r in theirs)
        by_scenario[name] = entry
    met = all(not e["failed"] and e.get("utilization_kept", True) for e in by_scenario.values())
    return {"by_scenario": by_scenario, "met": met}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help="names or YAML files, comma-separated"
    )
    parser.add_argument("--seeds", default="1-5")
    parser.add_argument(
        "--profile", default="", help="engine profile (default: each scenario's production one)"
    )
    parser.add_argument("--baseline", default="", help="a git commit whose engine to compare with")
    parser.add_argument("--workers", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    paths = [scenario_path(s) for s in args.scenarios.split(",") if s]
    seeds = parse_seeds(args.seeds)
    if args.worker:
        print(json.dumps(run_all(paths, seeds, args.profile, args.workers)))
        return 0
    runs = run_all(paths, seeds, args.profile, args.workers)
    base = baseline_runs(args.baseline, paths, seeds, args.workers) if args.baseline else None
    for r in runs:
        r["met"] = checks(r)
    out = {
        "benchmark": "big_jobs",
        "profile": args.profile or "each scenario's production policy",
        "targets": {
            "time_to_guarantee_p95_s": f"victims' grace + {TTG_SLACK_S:g}",
            "time_to_guarantee_max_s": TTG_MAX_S,
            "quota_satisfaction_min": QUOTA_SATISFACTION_MIN,
            "lost_pct_of_delivered_max": LOST_PCT_MAX,
            "utilization_drop_max": UTILISATION_DROP_MAX,
        },
        **summary(runs, base),
        "runs": runs,
        **({"baseline": {"ref": args.baseline, "runs": base}} if base is not None else {}),
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
