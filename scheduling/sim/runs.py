"""Running a scenario: every policy (or the named ones) on the same jobs, with the figures the CLI prints and the
reports plot. Shared by `cli_dynamic` (the commands) and `report` (the docs' images)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from scheduling.sim.des import SimResult, simulate
from scheduling.sim.metrics import summarize
from scheduling.sim.scenario import build_profile, load_scenario
from scheduling.sim.scenario_types import Scenario, ScenarioError


def kind_wait(result: SimResult, kind: str) -> tuple[float | None, bool | None]:
    """The longest queue wait among jobs of one kind; a job still waiting at the end counts what it has waited.

    Returns (seconds, whether all of them started); (None, None) when the run has no such job.
    """
    jobs = [r for r in result.jobs if r.spec.kind == kind and r.spec.submit_time_s <= result.end_s]
    if not jobs:
        return None, None
    waits = [r.wait_s if r.wait_s is not None else result.end_s - r.spec.submit_time_s for r in jobs]
    return round(max(waits), 3), all(r.wait_s is not None for r in jobs)


def run_scenario(
    name_or_path: str | Path,
    *,
    policies: Sequence[str] | None = None,
    seed: int | None = None,
    progress: bool = False,
) -> tuple[Scenario, dict[str, SimResult], dict]:
    """Run every policy of a scenario (or the named ones) on the same jobs; return results and a JSON summary."""
    scenario = load_scenario(name_or_path)
    chosen = [p for p in scenario.policies if not policies or p.name in policies]
    unknown = sorted(set(policies or ()) - {p.name for p in scenario.policies})
    if unknown:
        raise ScenarioError(f"policies: {scenario.name} has no policy {unknown[0]!r}")
    config = scenario.config if seed is None else replace(scenario.config, seed=seed)
    results: dict[str, SimResult] = {}
    out: dict = {
        "scenario": scenario.name,
        "description": scenario.description,
        "nodes": len(scenario.nodes),
        "gpus": sum(len(n.gpus) for n in scenario.nodes),
        "seed": config.seed,
        "horizon_s": config.horizon_s,
        "cycle_interval_s": config.cycle_interval_s,
        "policies": {},
    }
    for policy in chosen:
        profile = build_profile(policy.profile)
        t0 = time.perf_counter()
        result = simulate(
            nodes=scenario.nodes_for(policy),
            jobs=scenario.jobs_for(policy, seed=config.seed),
            profile=profile,
            quotas=scenario.quotas,
            config=replace(
                config, progress=progress, progress_label=policy.name, idle_reclaim=policy.idle_reclaim
            ),
            failures=scenario.failures,
        )
        results[policy.name] = result
        figures = summarize(result)
        training_wait, training_started = kind_wait(result, "training")
        out["policies"][policy.name] = {
            "description": policy.description,
            "profile": getattr(profile, "name", str(policy.profile)),
            "whole_cards": policy.whole_cards,
            "allocation": figures["allocation"],
            "utilization": figures["utilization"],
            "training_wait_s": training_wait,
            "training_started": training_started,
            **{k: v for k, v in figures.items() if k not in ("allocation", "utilization")},
            "wall_s": round(time.perf_counter() - t0, 3),
        }
    return scenario, results, out
