"""A scenario's cluster and teams: its GPU models, node groups (each expanded into its nodes) and the teams'
quotas."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from scheduling.engine.types import Gpu, Node, Quota, Sharing
from scheduling.sim.scenario_fields import (
    as_list,
    as_mapping,
    known_fields,
    parse_cpu_milli,
    parse_memory_mib,
    whole_number,
)
from scheduling.sim.scenario_types import MODELS, GpuModel, NodeGroup, ScenarioError


def read_models(raw: Any) -> dict[str, GpuModel]:
    models = dict(MODELS)
    for name, spec in as_mapping(raw or {}, "models").items():
        where = f"models.{name}"
        spec = as_mapping(spec, where)
        known_fields(spec, {"memory", "compute_capability", "mig_profiles"}, where)
        if "memory" not in spec:
            raise ScenarioError(f"{where}.memory: required")
        cc = str(spec.get("compute_capability", "8.0"))
        if not re.fullmatch(r"\d+\.\d+", cc):
            raise ScenarioError(f"{where}.compute_capability: {cc!r} is not like 8.0")
        major, minor = (int(x) for x in cc.split("."))
        migs = tuple(
            parse_memory_mib(v, f"{where}.mig_profiles[{i}]")
            for i, v in enumerate(as_list(spec.get("mig_profiles", []), f"{where}.mig_profiles"))
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


def read_cluster(raw: Any, models: Mapping[str, GpuModel]) -> tuple[tuple[NodeGroup, ...], tuple[Node, ...]]:
    groups, nodes, seen = [], [], set()
    for gi, g in enumerate(as_list(raw, "cluster")):
        where = f"cluster[{gi}]"
        g = as_mapping(g, where)
        known_fields(
            g, {"name", "count", "model", "gpus", "memory", "cpu", "nvlink", "sharing", "numa_nodes"}, where
        )
        for req in ("name", "count", "model", "gpus"):
            if req not in g:
                raise ScenarioError(f"{where}.{req}: required")
        name = str(g["name"])
        if name in seen:
            raise ScenarioError(f"{where}.name: duplicate node group {name!r}")
        seen.add(name)
        count = whole_number(g["count"], f"{where}.count", minimum=1)
        model = str(g["model"])
        if model not in models:
            raise ScenarioError(
                f"{where}.model: unknown GPU model {model!r} (known: {', '.join(sorted(models))})"
            )
        n_gpus = whole_number(g["gpus"], f"{where}.gpus", minimum=0)
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
        numa = whole_number(g.get("numa_nodes", 2), f"{where}.numa_nodes", minimum=1)
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


def read_teams(raw: Any) -> dict[str, Quota]:
    quotas = {}
    for ti, t in enumerate(as_list(raw or [], "teams")):
        where = f"teams[{ti}]"
        t = as_mapping(t, where)
        known_fields(t, {"name", "quota"}, where)
        if "name" not in t:
            raise ScenarioError(f"{where}.name: required")
        q = as_mapping(t.get("quota", {}) or {}, f"{where}.quota")
        known_fields(q, {"gpu_memory", "gpu_memory_limit", "gpus", "gpus_limit", "weight"}, f"{where}.quota")

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
