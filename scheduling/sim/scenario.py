"""YAML scenarios: a cluster, teams with quotas, priority classes, job streams and the policies to compare.

`load_scenario(name_or_path)` reads a built-in scenario (scheduling/sim/scenarios/NAME.yaml) or a file, and
validates it; every error names the field (`cluster[0].memory: ...`). See docs/simulator.md for the format.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from scheduling.engine.framework import Profile
from scheduling.engine.profiles import get_profile
from scheduling.engine.types import Gpu, Node, Quota, Request, Sharing, TopologyNeed
from scheduling.sim.des import SimConfig
from scheduling.sim.synthetic import (
    ARRIVAL_PROCESSES,
    RUNTIME_DISTRIBUTIONS,
    Arrival,
    Runtime,
    Stream,
    generate,
    mixed_streams,
    with_whole_cards,
)
from scheduling.sim.workload import NodeFailure, SimJob

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message starts with the offending field's path."""


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    memory_mib: int
    compute_capability: tuple[int, int] = (8, 0)
    mig_profiles_mib: tuple[int, ...] = ()


# Card memory as the driver reports it (MiB). Scenarios may add their own under `models:`.
MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("A100-40GB", 40_960, (8, 0), (4_864, 9_856, 19_968, 40_960)),
        GpuModel("A100-80GB", 81_920, (8, 0), (9_856, 19_968, 40_192, 81_920)),
        GpuModel("H100-80GB", 81_559, (9, 0), (10_240, 20_480, 40_448, 81_559)),
        GpuModel("H200", 143_771, (9, 0), (17_920, 35_840, 71_680, 143_771)),
        GpuModel("L40S", 46_068, (8, 9)),
        GpuModel("L4", 23_034, (8, 9)),
        GpuModel("A10", 23_028, (8, 6)),
        GpuModel("T4", 15_360, (7, 5)),
        GpuModel("V100-16GB", 16_384, (7, 0)),
        GpuModel("V100-32GB", 32_768, (7, 0)),
    )
}


@dataclass(frozen=True, slots=True)
class NodeGroup:
    name: str
    count: int
    model: str
    gpus: int
    memory_mib: int
    cpu_milli: int
    nvlink: str  # all | pairs | none
    sharing: Sharing
    numa_nodes: int = 2


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """One way of running the cluster: an engine profile plus how the cluster is offered to it."""

    name: str
    profile: Any  # a profile name, or a mapping {base: NAME, <Profile fields>}
    whole_cards: bool = False  # every slice request becomes a whole card (no slicing)
    sharing: Sharing | None = None  # force every GPU into this sharing mode
    description: str = ""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    groups: tuple[NodeGroup, ...]
    nodes: tuple[Node, ...]
    quotas: Mapping[str, Quota]
    streams: tuple[Stream, ...]
    policies: tuple[PolicySpec, ...]
    config: SimConfig
    failures: tuple[NodeFailure, ...] = ()
    models: Mapping[str, GpuModel] = field(default_factory=dict)
    source: str = ""

    def jobs(self, *, seed: int | None = None) -> list[SimJob]:
        return generate(self.streams, self.config.seed if seed is None else seed)

    def nodes_for(self, policy: PolicySpec) -> tuple[Node, ...]:
        if policy.sharing is None:
            return self.nodes
        return tuple(
            replace(n, gpus=tuple(replace(g, sharing=policy.sharing) for g in n.gpus)) for n in self.nodes
        )

    def jobs_for(self, policy: PolicySpec, *, seed: int | None = None) -> list[SimJob]:
        jobs = self.jobs(seed=seed)
        return [with_whole_cards(j) for j in jobs] if policy.whole_cards else jobs


# --------------------------------------------------------------------------------------------------- units
_MEM_UNITS = {"mib": 1, "mb": 1, "gib": 1024, "gb": 1024, "tib": 1024 * 1024, "tb": 1024 * 1024}
_TIME_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_memory_mib(value: Any, where: str) -> int:
    """An int is MiB; strings take MiB/GiB/TiB (GB and TB are read as GiB and TiB, as GPU vendors use them)."""
    if isinstance(value, bool):
        raise ScenarioError(f"{where}: {value!r} is not a memory size")
    if isinstance(value, int | float):
        mib = value
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)?\s*", str(value))
        if not m or (m.group(2) or "mib").lower() not in _MEM_UNITS:
            raise ScenarioError(
                f"{where}: {value!r} is not a memory size (use a number of MiB, or MiB, GiB, TiB)"
            )
        mib = float(m.group(1)) * _MEM_UNITS[(m.group(2) or "mib").lower()]
    if mib <= 0:
        raise ScenarioError(f"{where}: memory must be positive, got {value!r}")
    return int(round(mib))


def parse_duration_s(value: Any, where: str, *, allow_zero: bool = True) -> float:
    """A number is seconds; strings take s, m, h, d (`90m`, `2h`, `1.5d`)."""
    if isinstance(value, bool):
        raise ScenarioError(f"{where}: {value!r} is not a duration")
    if isinstance(value, int | float):
        s = float(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]+)?\s*", str(value))
        if not m or (m.group(2) or "s") not in _TIME_UNITS:
            raise ScenarioError(f"{where}: {value!r} is not a duration (use seconds, or 30s, 10m, 2h, 1d)")
        s = float(m.group(1)) * _TIME_UNITS[m.group(2) or "s"]
    if s < 0 or (s == 0 and not allow_zero):
        raise ScenarioError(
            f"{where}: duration must be {'non-negative' if allow_zero else 'positive'}, got {value!r}"
        )
    return s


def parse_share_milli(value: Any, where: str) -> int:
    """A share of one card: `25%`, a fraction 0..1, or milli-GPU as an int above 1."""
    if isinstance(value, bool):
        raise ScenarioError(f"{where}: {value!r} is not a share")
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*%\s*", value)
        if not m:
            raise ScenarioError(f"{where}: {value!r} is not a share (use 25%, 0.25 or 250 milli)")
        milli = float(m.group(1)) * 10
    elif isinstance(value, int | float):
        milli = value * 1000 if value <= 1 else value
    else:
        raise ScenarioError(f"{where}: {value!r} is not a share")
    if not 0 < milli <= 1000:
        raise ScenarioError(f"{where}: a share must be above 0 and at most one whole card, got {value!r}")
    return int(round(milli))


def parse_cpu_milli(value: Any, where: str) -> int:
    """Cores as a number (`16`, `0.5`) or millicores as a string (`500m`)."""
    if isinstance(value, str) and value.strip().endswith("m"):
        try:
            milli = int(value.strip()[:-1])
        except ValueError:
            raise ScenarioError(f"{where}: {value!r} is not a CPU amount") from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        milli = int(round(value * 1000))
    else:
        raise ScenarioError(f"{where}: {value!r} is not a CPU amount (cores, or millicores like 500m)")
    if milli < 0:
        raise ScenarioError(f"{where}: CPU must not be negative, got {value!r}")
    return milli


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ScenarioError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _known(d: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ScenarioError(
            f"{where}.{unknown[0]}: unknown field (expected one of {', '.join(sorted(allowed))})"
        )


def _count(value: Any, where: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{where}: expected a whole number, got {value!r}")
    if value < minimum:
        raise ScenarioError(f"{where}: must be at least {minimum}, got {value}")
    return value


# ------------------------------------------------------------------------------------------------- sections
def _models(raw: Any) -> dict[str, GpuModel]:
    models = dict(MODELS)
    for name, spec in _mapping(raw or {}, "models").items():
        where = f"models.{name}"
        spec = _mapping(spec, where)
        _known(spec, {"memory", "compute_capability", "mig_profiles"}, where)
        if "memory" not in spec:
            raise ScenarioError(f"{where}.memory: required")
        cc = str(spec.get("compute_capability", "8.0"))
        if not re.fullmatch(r"\d+\.\d+", cc):
            raise ScenarioError(f"{where}.compute_capability: {cc!r} is not like 8.0")
        major, minor = (int(x) for x in cc.split("."))
        migs = tuple(
            parse_memory_mib(v, f"{where}.mig_profiles[{i}]")
            for i, v in enumerate(_list(spec.get("mig_profiles", []), f"{where}.mig_profiles"))
        )
        models[str(name)] = GpuModel(
            str(name), parse_memory_mib(spec["memory"], f"{where}.memory"), (major, minor), migs
        )
    return models


def _nvlink_pairs(kind: str, n: int) -> frozenset[tuple[int, int]]:
    if kind == "all":
        return frozenset((i, j) for i in range(n) for j in range(i + 1, n))
    if kind == "pairs":
        return frozenset((i, i + 1) for i in range(0, n - 1, 2))
    return frozenset()


def _cluster(raw: Any, models: Mapping[str, GpuModel]) -> tuple[tuple[NodeGroup, ...], tuple[Node, ...]]:
    groups, nodes, seen = [], [], set()
    for gi, g in enumerate(_list(raw, "cluster")):
        where = f"cluster[{gi}]"
        g = _mapping(g, where)
        _known(
            g, {"name", "count", "model", "gpus", "memory", "cpu", "nvlink", "sharing", "numa_nodes"}, where
        )
        for req in ("name", "count", "model", "gpus"):
            if req not in g:
                raise ScenarioError(f"{where}.{req}: required")
        name = str(g["name"])
        if name in seen:
            raise ScenarioError(f"{where}.name: duplicate node group {name!r}")
        seen.add(name)
        count = _count(g["count"], f"{where}.count", minimum=1)
        model = str(g["model"])
        if model not in models:
            raise ScenarioError(
                f"{where}.model: unknown GPU model {model!r} (known: {', '.join(sorted(models))})"
            )
        n_gpus = _count(g["gpus"], f"{where}.gpus", minimum=0)
        memory_mib = parse_memory_mib(g.get("memory", "512GiB"), f"{where}.memory")
        cpu_milli = parse_cpu_milli(g.get("cpu", 64), f"{where}.cpu")
        nvlink = str(g.get("nvlink", "none"))
        if nvlink not in ("all", "pairs", "none"):
            raise ScenarioError(f"{where}.nvlink: {nvlink!r} is not one of all, pairs, none")
        try:
            sharing = Sharing(str(g.get("sharing", "exclusive")))
        except ValueError:
            raise ScenarioError(
                f"{where}.sharing: {g.get('sharing')!r} is not one of {', '.join(s.value for s in Sharing)}"
            ) from None
        numa = _count(g.get("numa_nodes", 2), f"{where}.numa_nodes", minimum=1)
        spec = models[model]
        group = NodeGroup(name, count, model, n_gpus, memory_mib, cpu_milli, nvlink, sharing, numa)
        groups.append(group)
        per_numa = max(1, -(-n_gpus // numa))
        for k in range(count):
            node_name = f"{name}-{k:02d}"
            gpus = tuple(
                Gpu(
                    index=i,
                    uuid=f"GPU-{node_name}-{i}",
                    model=model,
                    memory_mib=spec.memory_mib,
                    compute_capability=spec.compute_capability,
                    numa_node=i // per_numa,
                    sharing=sharing,
                    mig_profiles_mib=spec.mig_profiles_mib,
                )
                for i in range(n_gpus)
            )
            nodes.append(
                Node(
                    name=node_name,
                    cpu_milli=cpu_milli,
                    memory_mib=memory_mib,
                    gpus=gpus,
                    nvlink=_nvlink_pairs(nvlink, n_gpus),
                    labels={"group": name},
                )
            )
    if not nodes:
        raise ScenarioError("cluster: at least one node group is required")
    return tuple(groups), tuple(nodes)


def _teams(raw: Any) -> dict[str, Quota]:
    quotas = {}
    for ti, t in enumerate(_list(raw or [], "teams")):
        where = f"teams[{ti}]"
        t = _mapping(t, where)
        _known(t, {"name", "quota"}, where)
        if "name" not in t:
            raise ScenarioError(f"{where}.name: required")
        q = _mapping(t.get("quota", {}) or {}, f"{where}.quota")
        _known(q, {"gpu_memory", "gpu_memory_limit", "gpus", "gpus_limit", "weight"}, f"{where}.quota")

        def mem(key: str, q: Mapping[str, Any] = q, where: str = where) -> int | None:
            return None if key not in q else parse_memory_mib(q[key], f"{where}.quota.{key}")

        def gpus(key: str, q: Mapping[str, Any] = q, where: str = where) -> int | None:
            if key not in q:
                return None
            v = q[key]
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise ScenarioError(f"{where}.quota.{key}: expected a non-negative number of GPUs, got {v!r}")
            return int(round(v * 1000))

        weight = q.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise ScenarioError(f"{where}.quota.weight: expected a positive number, got {weight!r}")
        name = str(t["name"])
        quotas[name] = Quota(
            team=name,
            guaranteed_gpu_memory_mib=mem("gpu_memory") or 0,
            limit_gpu_memory_mib=mem("gpu_memory_limit"),
            guaranteed_compute_milli=gpus("gpus") or 0,
            limit_compute_milli=gpus("gpus_limit"),
            weight=float(weight),
        )
    return quotas


@dataclass(frozen=True, slots=True)
class _PriorityClass:
    priority: int
    preemptible: bool
    grace_s: float
    checkpoint_interval_s: float | None


def _priority_classes(raw: Any) -> dict[str, _PriorityClass]:
    out = {}
    for name, spec in _mapping(raw or {}, "priority_classes").items():
        where = f"priority_classes.{name}"
        spec = _mapping(spec, where)
        _known(spec, {"priority", "preemptible", "grace", "checkpoint_interval"}, where)
        pr = spec.get("priority", 0)
        if isinstance(pr, bool) or not isinstance(pr, int):
            raise ScenarioError(f"{where}.priority: expected a whole number, got {pr!r}")
        ci = spec.get("checkpoint_interval")
        out[str(name)] = _PriorityClass(
            priority=pr,
            preemptible=bool(spec.get("preemptible", True)),
            grace_s=parse_duration_s(spec.get("grace", 30), f"{where}.grace"),
            checkpoint_interval_s=None
            if ci is None
            else parse_duration_s(ci, f"{where}.checkpoint_interval", allow_zero=False),
        )
    return out


def _request(raw: Any, where: str) -> Request:
    r = _mapping(raw, where)
    _known(
        r,
        {
            "gpus",
            "nodes",
            "gpu_memory",
            "gpu_compute",
            "gpu_models",
            "min_gpu_memory",
            "topology",
            "cpu",
            "memory",
        },
        where,
    )
    gpus = _count(r.get("gpus", 0), f"{where}.gpus")
    nodes = _count(r.get("nodes", 1), f"{where}.nodes", minimum=1)
    mem = parse_memory_mib(r["gpu_memory"], f"{where}.gpu_memory") if "gpu_memory" in r else 0
    compute = parse_share_milli(r["gpu_compute"], f"{where}.gpu_compute") if "gpu_compute" in r else 0
    if gpus and (mem or compute):
        raise ScenarioError(f"{where}.gpu_memory: a request asks for whole gpus or for one slice, not both")
    try:
        topology = TopologyNeed(str(r.get("topology", "none")))
    except ValueError:
        raise ScenarioError(
            f"{where}.topology: {r.get('topology')!r} is not one of {', '.join(t.value for t in TopologyNeed)}"
        ) from None
    models = r.get("gpu_models", [])
    if isinstance(models, str):
        models = [models]
    return Request(
        gpus=gpus,
        nodes=nodes,
        gpu_memory_mib=mem,
        gpu_compute_milli=compute,
        gpu_models=tuple(str(m) for m in _list(models, f"{where}.gpu_models")),
        min_gpu_memory_mib=parse_memory_mib(r["min_gpu_memory"], f"{where}.min_gpu_memory")
        if "min_gpu_memory" in r
        else 0,
        topology=topology,
        cpu_milli=parse_cpu_milli(r.get("cpu", 0), f"{where}.cpu"),
        memory_mib=parse_memory_mib(r["memory"], f"{where}.memory") if "memory" in r else 0,
    )


def _arrival(raw: Any, where: str) -> Arrival:
    a = _mapping(raw or {}, where)
    _known(a, {"process", "at", "start", "end", "rate_per_h"}, where)
    process = str(a.get("process", "at"))
    if process not in ARRIVAL_PROCESSES:
        raise ScenarioError(f"{where}.process: {process!r} is not one of {', '.join(ARRIVAL_PROCESSES)}")
    start = parse_duration_s(a.get("at", a.get("start", 0)), f"{where}.start")
    end = parse_duration_s(a["end"], f"{where}.end") if "end" in a else None
    if end is not None and end < start:
        raise ScenarioError(f"{where}.end: ends before it starts")
    rate = a.get("rate_per_h")
    if process == "poisson" and (isinstance(rate, bool) or not isinstance(rate, int | float) or rate <= 0):
        raise ScenarioError(f"{where}.rate_per_h: a poisson process needs a positive rate, got {rate!r}")
    if process in ("uniform", "random") and end is None:
        raise ScenarioError(f"{where}.end: a {process} arrival needs an end")
    return Arrival(process, start, end, float(rate) if rate is not None else None)


def _runtime(raw: Any, where: str) -> Runtime:
    if not isinstance(raw, Mapping):
        return Runtime("fixed", parse_duration_s(raw, where, allow_zero=False))
    r = raw
    _known(r, {"dist", "value", "mean", "median", "low", "high", "sigma", "min", "max"}, where)
    dist = str(r.get("dist", "fixed"))
    if dist not in RUNTIME_DISTRIBUTIONS:
        raise ScenarioError(f"{where}.dist: {dist!r} is not one of {', '.join(RUNTIME_DISTRIBUTIONS)}")
    key = {"fixed": "value", "exponential": "mean", "lognormal": "median"}.get(dist)
    value = 0.0
    if key:
        if key not in r:
            raise ScenarioError(f"{where}.{key}: required for a {dist} runtime")
        value = parse_duration_s(r[key], f"{where}.{key}", allow_zero=False)
    low = parse_duration_s(r.get("low", 0), f"{where}.low")
    high = parse_duration_s(r.get("high", 0), f"{where}.high")
    if dist == "uniform" and not 0 < high >= low:
        raise ScenarioError(f"{where}.high: a uniform runtime needs 0 <= low <= high and high > 0")
    sigma = r.get("sigma", 0.5)
    if isinstance(sigma, bool) or not isinstance(sigma, int | float) or sigma < 0:
        raise ScenarioError(f"{where}.sigma: expected a non-negative number, got {sigma!r}")
    return Runtime(
        dist,
        value,
        low,
        high,
        float(sigma),
        parse_duration_s(r["min"], f"{where}.min") if "min" in r else None,
        parse_duration_s(r["max"], f"{where}.max") if "max" in r else None,
    )


def _streams(raw: Any, classes: Mapping[str, _PriorityClass], teams: Mapping[str, Quota]) -> list[Stream]:
    out, names = [], set()
    for si, s in enumerate(_list(raw, "streams")):
        where = f"streams[{si}]"
        s = _mapping(s, where)
        _known(
            s,
            {
                "name",
                "team",
                "count",
                "arrival",
                "request",
                "runtime",
                "priority_class",
                "usage",
                "checkpoint_interval",
                "grace",
                "max_runtime",
                "kind",
            },
            where,
        )
        for req in ("name", "team", "count", "request", "runtime"):
            if req not in s:
                raise ScenarioError(f"{where}.{req}: required")
        name = str(s["name"])
        if name in names:
            raise ScenarioError(f"{where}.name: duplicate stream {name!r}")
        names.add(name)
        team = str(s["team"])
        if teams and team not in teams:
            raise ScenarioError(f"{where}.team: unknown team {team!r} (declare it under teams)")
        pc_name = s.get("priority_class")
        pc = _PriorityClass(0, True, 30.0, None)
        if pc_name is not None:
            if pc_name not in classes:
                raise ScenarioError(f"{where}.priority_class: unknown priority class {pc_name!r}")
            pc = classes[pc_name]
        request = _request(s["request"], f"{where}.request")
        usage = s.get("usage")
        usage_milli = None if usage is None else parse_share_milli(usage, f"{where}.usage")
        ci = s.get("checkpoint_interval")
        out.append(
            Stream(
                name=name,
                team=team,
                count=_count(s["count"], f"{where}.count"),
                request=request,
                arrival=_arrival(s.get("arrival"), f"{where}.arrival"),
                runtime=_runtime(s["runtime"], f"{where}.runtime"),
                priority=pc.priority,
                preemptible=pc.preemptible,
                grace_s=parse_duration_s(s["grace"], f"{where}.grace") if "grace" in s else pc.grace_s,
                checkpoint_interval_s=(
                    parse_duration_s(ci, f"{where}.checkpoint_interval", allow_zero=False)
                    if ci is not None
                    else pc.checkpoint_interval_s
                ),
                max_runtime_s=parse_duration_s(s["max_runtime"], f"{where}.max_runtime")
                if "max_runtime" in s
                else None,
                usage_milli=usage_milli,
                priority_class=str(pc_name or ""),
                kind=str(s.get("kind", name)),
            )
        )
    return out


def _synthetic(raw: Any, teams: Mapping[str, Quota]) -> list[Stream]:
    if raw is None:
        return []
    where = "synthetic"
    s = _mapping(raw, where)
    _known(s, {"jobs_per_hour", "duration", "teams", "card_memory", "shares"}, where)
    rate = s.get("jobs_per_hour")
    if isinstance(rate, bool) or not isinstance(rate, int | float) or rate <= 0:
        raise ScenarioError(f"{where}.jobs_per_hour: expected a positive number, got {rate!r}")
    team_names = [str(t) for t in _list(s.get("teams", list(teams)), f"{where}.teams")]
    if not team_names:
        raise ScenarioError(f"{where}.teams: at least one team is required")
    shares = tuple(float(x) for x in _list(s.get("shares", [0.5, 0.4, 0.1]), f"{where}.shares"))
    if len(shares) != 3 or any(x < 0 for x in shares):
        raise ScenarioError(f"{where}.shares: three non-negative numbers (inference, batch, training)")
    return mixed_streams(
        teams=team_names,
        jobs_per_hour=float(rate),
        duration_s=parse_duration_s(s.get("duration", "8h"), f"{where}.duration", allow_zero=False),
        card_memory_mib=parse_memory_mib(s.get("card_memory", "80GiB"), f"{where}.card_memory"),
        shares=shares,  # type: ignore[arg-type]
    )


def _policies(raw: Any) -> list[PolicySpec]:
    out, names = [], set()
    for pi, p in enumerate(_list(raw or [{"name": "default", "profile": "default"}], "policies")):
        where = f"policies[{pi}]"
        p = _mapping(p, where)
        _known(p, {"name", "profile", "whole_cards", "sharing", "description"}, where)
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
            )
        )
    return out


def _config(raw: Any) -> tuple[SimConfig, list[NodeFailure]]:
    s = _mapping(raw or {}, "simulation")
    _known(
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
    for fi, f in enumerate(_list(s.get("failures", []), "simulation.failures")):
        where = f"simulation.failures[{fi}]"
        f = _mapping(f, where)
        _known(f, {"node", "at", "repair"}, where)
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
    d = _mapping(data, "scenario")
    _known(
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
    models = _models(d.get("models"))
    groups, nodes = _cluster(d["cluster"], models)
    quotas = _teams(d.get("teams"))
    classes = _priority_classes(d.get("priority_classes"))
    streams = _streams(d.get("streams", []), classes, quotas) + _synthetic(d.get("synthetic"), quotas)
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
