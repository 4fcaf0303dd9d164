"""YAML scenarios: a cluster, teams with quotas, priority classes, job streams and the policies to compare.

`load_scenario(name_or_path)` reads a built-in scenario (scheduling/sim/scenarios/NAME.yaml) or a file, and
validates it section by section (the cluster and teams in scenario_cluster.py, the job streams in
scenario_streams.py, the policies and the simulation's settings here); every error names the field
(`cluster[0].memory: ...`). See docs/simulator.md for the format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from scheduling.engine.framework import Profile
from scheduling.engine.profiles import get_profile
from scheduling.engine.types import Sharing
from scheduling.sim.des import SimConfig
from scheduling.sim.scenario_cluster import read_cluster, read_models, read_teams
from scheduling.sim.scenario_fields import as_list, as_mapping, known_fields, parse_duration_s
from scheduling.sim.scenario_streams import read_priority_classes, read_streams, read_synthetic
from scheduling.sim.scenario_types import PolicySpec, Scenario, ScenarioError
from scheduling.sim.workload import NodeFailure

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


def _policies(raw: Any) -> list[PolicySpec]:
    out, names = [], set()
    for pi, p in enumerate(as_list(raw or [{"name": "default", "profile": "default"}], "policies")):
        where = f"policies[{pi}]"
        p = as_mapping(p, where)
        known_fields(p, {"name", "profile", "whole_cards", "sharing", "description", "idle_reclaim"}, where)
        if "name" not in p or "profile" not in p:
            raise ScenarioError(f"{where}.{'name' if 'name' not in p else 'profile'}: required")
        name = str(p["name"])
        if name in names:
            raise ScenarioError(f"{where}.name: duplicate policy {name!r}")
        names.add(name)
        sharing = None
        if p.get("sharing") is not None:
            try:
                sharing = Sharing(str(p["sharing"]))
            except ValueError:
                raise ScenarioError(f"{where}.sharing: {p['sharing']!r} is not a sharing mode") from None
        profile = p["profile"]
        if not isinstance(profile, str | Mapping):
            raise ScenarioError(f"{where}.profile: a profile name or a mapping")
        out.append(
            PolicySpec(
                name,
                profile,
                bool(p.get("whole_cards", False)),
                sharing,
                str(p.get("description", "")).strip(),
                idle_reclaim=bool(p.get("idle_reclaim", True)),
            )
        )
    return out


def _config(raw: Any) -> tuple[SimConfig, list[NodeFailure]]:
    s = as_mapping(raw or {}, "simulation")
    known_fields(
        s,
        {
            "horizon",
            "cycle_interval",
            "idle_recheck",
            "seed",
            "usage_half_life",
            "node_mtbf",
            "node_repair",
            "failures",
        },
        "simulation",
    )
    failures = []
    for fi, f in enumerate(as_list(s.get("failures", []), "simulation.failures")):
        where = f"simulation.failures[{fi}]"
        f = as_mapping(f, where)
        known_fields(f, {"node", "at", "repair"}, where)
        if "node" not in f or "at" not in f:
            raise ScenarioError(f"{where}.{'node' if 'node' not in f else 'at'}: required")
        failures.append(
            NodeFailure(
                str(f["node"]),
                parse_duration_s(f["at"], f"{where}.at"),
                parse_duration_s(f["repair"], f"{where}.repair") if "repair" in f else None,
            )
        )
    seed = s.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ScenarioError(f"simulation.seed: expected a whole number, got {seed!r}")
    cfg = SimConfig(
        cycle_interval_s=parse_duration_s(
            s.get("cycle_interval", 10), "simulation.cycle_interval", allow_zero=False
        ),
        idle_recheck_s=parse_duration_s(
            s.get("idle_recheck", 300), "simulation.idle_recheck", allow_zero=False
        ),
        horizon_s=parse_duration_s(s["horizon"], "simulation.horizon", allow_zero=False)
        if "horizon" in s
        else None,
        seed=seed,
        usage_half_life_s=(
            parse_duration_s(s["usage_half_life"], "simulation.usage_half_life", allow_zero=False)
            if "usage_half_life" in s
            else None
        ),
        node_mtbf_s=parse_duration_s(s["node_mtbf"], "simulation.node_mtbf", allow_zero=False)
        if "node_mtbf" in s
        else None,
        node_repair_s=parse_duration_s(s.get("node_repair", "1h"), "simulation.node_repair"),
    )
    return cfg, failures


def parse_scenario(data: Any, *, source: str = "") -> Scenario:
    """Validate a scenario document (already parsed from YAML)."""
    d = as_mapping(data, "scenario")
    known_fields(
        d,
        {
            "name",
            "description",
            "models",
            "cluster",
            "teams",
            "priority_classes",
            "streams",
            "synthetic",
            "policies",
            "simulation",
        },
        "scenario",
    )
    if "cluster" not in d:
        raise ScenarioError("cluster: required")
    models = read_models(d.get("models"))
    groups, nodes = read_cluster(d["cluster"], models)
    quotas = read_teams(d.get("teams"))
    classes = read_priority_classes(d.get("priority_classes"))
    streams = read_streams(d.get("streams", []), classes, quotas) + read_synthetic(d.get("synthetic"), quotas)
    if not streams:
        raise ScenarioError("streams: at least one job stream (or a synthetic block) is required")
    config, failures = _config(d.get("simulation"))
    names = {n.name for n in nodes}
    for fi, f in enumerate(failures):
        if f.node not in names:
            raise ScenarioError(f"simulation.failures[{fi}].node: unknown node {f.node!r}")
    return Scenario(
        name=str(d.get("name", Path(source).stem or "scenario")),
        description=str(d.get("description", "")).strip(),
        groups=groups,
        nodes=nodes,
        quotas=quotas,
        streams=tuple(streams),
        policies=tuple(_policies(d.get("policies"))),
        config=config,
        failures=tuple(failures),
        models=models,
        source=source,
    )


def builtin_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A built-in scenario by name (`seed-case`) or a YAML file by path."""
    path = Path(name_or_path)
    if not path.exists():
        builtin = SCENARIO_DIR / f"{name_or_path}.yaml"
        if not builtin.exists():
            raise ScenarioError(
                f"scenario: no file {str(name_or_path)!r} and no built-in scenario of that name "
                f"(built-in: {', '.join(builtin_scenarios())})"
            )
        path = builtin
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ScenarioError(f"scenario: {path} is not valid YAML: {exc}") from None
    return parse_scenario(data, source=str(path))


def build_profile(spec: Any) -> Any:
    """An engine profile from a policy's `profile`: a registered name, or {base: NAME, field: value...}."""
    if isinstance(spec, str):
        return get_profile(spec)
    spec = dict(spec)
    base = get_profile(str(spec.pop("base", "default")))
    changes: dict[str, Any] = {}
    for key, value in spec.items():
        if key not in Profile.__dataclass_fields__:
            raise ScenarioError(f"profile.{key}: not a profile field")
        if key in ("node_scores", "gpu_scores") and isinstance(value, Mapping):
            value = tuple((str(k), float(v)) for k, v in value.items())
        elif key == "params":
            value = {**dict(base.params), **dict(value)}
        elif isinstance(value, list):
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        changes[key] = value
    return replace(base, **changes)
