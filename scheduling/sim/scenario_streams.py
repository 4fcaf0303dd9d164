"""A scenario's job streams: priority classes, what each stream's jobs ask for, when they arrive and how long
they run, and the synthetic mix of inference, batch and training streams."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduling.engine.types import Quota, Request, TopologyNeed
from scheduling.sim.scenario_fields import (
    as_list,
    as_mapping,
    known_fields,
    parse_cpu_milli,
    parse_duration_s,
    parse_memory_mib,
    parse_share_milli,
    whole_number,
)
from scheduling.sim.scenario_types import ScenarioError
from scheduling.sim.synthetic import (
    ARRIVAL_PROCESSES,
    RUNTIME_DISTRIBUTIONS,
    Arrival,
    Runtime,
    Stream,
    mixed_streams,
)


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A scenario's priority class: what its streams' jobs inherit unless the stream says otherwise."""

    priority: int
    preemptible: bool
    grace_s: float
    checkpoint_interval_s: float | None
    idle_timeout_s: float | None = None  # a job whose usage leaves it idle this long is stopped (a session)


def read_priority_classes(raw: Any) -> dict[str, PriorityClass]:
    out = {}
    for name, spec in as_mapping(raw or {}, "priority_classes").items():
        where = f"priority_classes.{name}"
        spec = as_mapping(spec, where)
        known_fields(spec, {"priority", "preemptible", "grace", "checkpoint_interval", "idle_timeout"}, where)
        pr = spec.get("priority", 0)
        if isinstance(pr, bool) or not isinstance(pr, int):
            raise ScenarioError(f"{where}.priority: expected a whole number, got {pr!r}")
        ci = spec.get("checkpoint_interval")
        out[str(name)] = PriorityClass(
            priority=pr,
            preemptible=bool(spec.get("preemptible", True)),
            grace_s=parse_duration_s(spec.get("grace", 30), f"{where}.grace"),
            checkpoint_interval_s=None
            if ci is None
            else parse_duration_s(ci, f"{where}.checkpoint_interval", allow_zero=False),
            idle_timeout_s=None
            if spec.get("idle_timeout") is None
            else parse_duration_s(spec["idle_timeout"], f"{where}.idle_timeout", allow_zero=False),
        )
    return out


def _usage(raw: Any, where: str) -> tuple[int | None, float | None, float | None]:
    """A stream's `usage`: a share of each card kept busy (`100%`), or busy only part of the time
    (`{busy: 100%, active: 10m, every: 1h}`: a notebook worked in 10 minutes of each hour). (usage milli averaged
    over time, busy seconds, period seconds)."""
    if raw is None:
        return None, None, None
    if not isinstance(raw, dict):
        return parse_share_milli(raw, where), None, None
    known_fields(raw, {"busy", "active", "every"}, where)
    for required in ("active", "every"):
        if required not in raw:
            raise ScenarioError(f"{where}.{required}: required")
    busy_milli = parse_share_milli(raw.get("busy", "100%"), f"{where}.busy")
    active = parse_duration_s(raw["active"], f"{where}.active")
    every = parse_duration_s(raw["every"], f"{where}.every", allow_zero=False)
    if active > every:
        raise ScenarioError(f"{where}.active: longer than every ({raw['active']} > {raw['every']})")
    return round(busy_milli * active / every), active, every


def _request(raw: Any, where: str) -> Request:
    r = as_mapping(raw, where)
    known_fields(
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
    gpus = whole_number(r.get("gpus", 0), f"{where}.gpus")
    nodes = whole_number(r.get("nodes", 1), f"{where}.nodes", minimum=1)
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
        gpu_models=tuple(str(m) for m in as_list(models, f"{where}.gpu_models")),
        min_gpu_memory_mib=parse_memory_mib(r["min_gpu_memory"], f"{where}.min_gpu_memory")
        if "min_gpu_memory" in r
        else 0,
        topology=topology,
        cpu_milli=parse_cpu_milli(r.get("cpu", 0), f"{where}.cpu"),
        memory_mib=parse_memory_mib(r["memory"], f"{where}.memory") if "memory" in r else 0,
    )


def _arrival(raw: Any, where: str) -> Arrival:
    a = as_mapping(raw or {}, where)
    known_fields(a, {"process", "at", "start", "end", "rate_per_h"}, where)
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
    known_fields(r, {"dist", "value", "mean", "median", "low", "high", "sigma", "min", "max"}, where)
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


def read_streams(raw: Any, classes: Mapping[str, PriorityClass], teams: Mapping[str, Quota]) -> list[Stream]:
    out, names = [], set()
    for si, s in enumerate(as_list(raw, "streams")):
        where = f"streams[{si}]"
        s = as_mapping(s, where)
        known_fields(
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
        pc = PriorityClass(0, True, 30.0, None)
        if pc_name is not None:
            if pc_name not in classes:
                raise ScenarioError(f"{where}.priority_class: unknown priority class {pc_name!r}")
            pc = classes[pc_name]
        request = _request(s["request"], f"{where}.request")
        usage_milli, busy_s, busy_every_s = _usage(s.get("usage"), f"{where}.usage")
        ci = s.get("checkpoint_interval")
        out.append(
            Stream(
                name=name,
                team=team,
                count=whole_number(s["count"], f"{where}.count"),
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
                busy_s=busy_s,
                busy_every_s=busy_every_s,
                idle_timeout_s=pc.idle_timeout_s if busy_s is not None else None,
            )
        )
    return out


def read_synthetic(raw: Any, teams: Mapping[str, Quota]) -> list[Stream]:
    if raw is None:
        return []
    where = "synthetic"
    s = as_mapping(raw, where)
    known_fields(s, {"jobs_per_hour", "duration", "teams", "card_memory", "shares"}, where)
    rate = s.get("jobs_per_hour")
    if isinstance(rate, bool) or not isinstance(rate, int | float) or rate <= 0:
        raise ScenarioError(f"{where}.jobs_per_hour: expected a positive number, got {rate!r}")
    team_names = [str(t) for t in as_list(s.get("teams", list(teams)), f"{where}.teams")]
    if not team_names:
        raise ScenarioError(f"{where}.teams: at least one team is required")
    shares = tuple(float(x) for x in as_list(s.get("shares", [0.5, 0.4, 0.1]), f"{where}.shares"))
    if len(shares) != 3 or any(x < 0 for x in shares):
        raise ScenarioError(f"{where}.shares: three non-negative numbers (inference, batch, training)")
    return mixed_streams(
        teams=team_names,
        jobs_per_hour=float(rate),
        duration_s=parse_duration_s(s.get("duration", "8h"), f"{where}.duration", allow_zero=False),
        card_memory_mib=parse_memory_mib(s.get("card_memory", "80GiB"), f"{where}.card_memory"),
        shares=shares,  # type: ignore[arg-type]
    )
