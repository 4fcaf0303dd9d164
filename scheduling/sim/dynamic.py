"""openb dynamic mode: replay the trace's pods on their own timestamps through the production cycle.

Each pod arrives at its creation time and runs for (deletion - creation) seconds once placed. QoS sets priority:
LS and Guaranteed are high and never preempted, Burstable is in between, BE is low and preemptible. Pods are
spread over teams by a fixed rule (CRC-32 of the pod name modulo the number of teams) so fairness can be measured.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from scheduling.engine.profiles import get_profile
from scheduling.engine.types import WHOLE_GPU_MILLI, Node, Quota
from scheduling.sim.des import SimConfig, SimResult, simulate
from scheduling.sim.openb import TracePod, load_nodes, load_pods
from scheduling.sim.static import build_node, pod_request
from scheduling.sim.workload import SimJob, default_usage_milli


@dataclass(frozen=True, slots=True)
class QosClass:
    name: str
    priority: int
    preemptible: bool


# qos -> (priority class, priority, preemptible). Unknown qos values count as Burstable.
QOS_CLASSES: dict[str, QosClass] = {
    "LS": QosClass("high", 100, False),
    "Guaranteed": QosClass("high", 100, False),
    "Burstable": QosClass("medium", 50, True),
    "BE": QosClass("low", 0, True),
}
DEFAULT_TEAMS = 4


def team_of(pod_name: str, teams: int) -> str:
    """The team a pod belongs to: CRC-32 of its name modulo the number of teams (stable across runs and Pythons)."""
    return f"team-{zlib.crc32(pod_name.encode()) % teams}"


def pod_job(
    pod: TracePod,
    *,
    teams: int,
    grace_s: float,
    checkpoint_interval_s: float | None,
    compression: float = 1.0,
) -> SimJob:
    if pod.creation_time_s is None or pod.deletion_time_s is None:
        raise ValueError(
            f"{pod.name}: the dynamic mode needs creation_time and deletion_time (this list has none)"
        )
    qos = QOS_CLASSES.get(pod.qos, QOS_CLASSES["Burstable"])
    request = pod_request(pod)
    return SimJob(
        id=pod.name,
        team=team_of(pod.name, teams),
        request=request,
        submit_time_s=pod.creation_time_s / compression,
        runtime_s=float(max(1, pod.deletion_time_s - pod.creation_time_s)),
        priority=qos.priority,
        preemptible=qos.preemptible,
        grace_s=grace_s,
        checkpoint_interval_s=checkpoint_interval_s,
        usage_milli=default_usage_milli(request),
        priority_class=qos.name,
        kind=pod.qos or "unknown",
    )


def openb_jobs(
    pods: Sequence[TracePod],
    *,
    teams: int = DEFAULT_TEAMS,
    limit: int | None = None,
    grace_s: float = 30.0,
    checkpoint_interval_s: float | None = None,
    compression: float = 1.0,
) -> list[SimJob]:
    """The first `limit` pods of the list (in file order) as jobs.

    `compression` divides every arrival time and keeps runtimes, multiplying the offered load: on its own
    timestamps the default list never holds more than ~66 of the 6,212 GPUs at once (it is a sample of the
    cluster's pods), so contention, queues and preemption only appear with compression.
    """
    if compression <= 0:
        raise ValueError("compression must be positive")
    chosen = pods if limit is None else pods[:limit]
    return [
        pod_job(
            p,
            teams=teams,
            grace_s=grace_s,
            checkpoint_interval_s=checkpoint_interval_s,
            compression=compression,
        )
        for p in chosen
    ]


def openb_quotas(nodes: Sequence[Node], teams: int) -> dict[str, Quota]:
    """Equal guarantees: each team is guaranteed 1/teams of the GPU capacity and may borrow the rest."""
    capacity_milli = sum(len(n.gpus) for n in nodes) * WHOLE_GPU_MILLI
    share = capacity_milli // teams
    return {f"team-{i}": Quota(team=f"team-{i}", guaranteed_compute_milli=share) for i in range(teams)}


@dataclass(frozen=True, slots=True)
class DynamicRun:
    policy: str
    result: SimResult
    jobs: int
    teams: int
    nodes: int


def run_dynamic(
    *,
    nodes_csv: str | Path,
    pods_csv: str | Path,
    policies: Sequence[str],
    teams: int = DEFAULT_TEAMS,
    limit: int | None = None,
    config: SimConfig | None = None,
    checkpoint_interval_s: float | None = None,
    compression: float = 1.0,
) -> list[DynamicRun]:
    """Replay one pod list under each named engine profile."""
    if teams < 1:
        raise ValueError("teams must be at least 1")
    nodes = tuple(build_node(n) for n in load_nodes(nodes_csv))
    jobs = openb_jobs(
        load_pods(pods_csv),
        teams=teams,
        limit=limit,
        checkpoint_interval_s=checkpoint_interval_s,
        compression=compression,
    )
    quotas = openb_quotas(nodes, teams)
    runs = []
    cfg = config or SimConfig()
    if cfg.horizon_s is None:
        # One more cycle after the last arrival, so the last pods get their chance to be placed.
        cfg = replace(cfg, horizon_s=max(1.0, arrival_span_s(jobs) + 2 * cfg.cycle_interval_s))
    for name in policies:
        profile = get_profile(name)
        result = simulate(nodes=nodes, jobs=jobs, profile=profile, quotas=quotas, config=cfg)
        runs.append(DynamicRun(name, result, len(jobs), teams, len(nodes)))
    return runs


def arrival_span_s(jobs: Sequence[SimJob]) -> float:
    """The window the trace covers: from 0 to the last arrival (jobs running past it are cut there)."""
    return max((j.submit_time_s for j in jobs), default=0.0)
