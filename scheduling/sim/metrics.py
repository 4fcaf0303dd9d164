"""Figures from one simulated run: allocation, utilization, fragmentation, waits, JCT, preemptions, guarantees
and fairness."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable

from scheduling.engine.types import Request
from scheduling.sim.des import JobRecord, JobState, SimResult
from scheduling.sim.guarantees import GuaranteeFigures, OwedJob, jain_index

_GPU_MILLI_S_PER_H = 1000 * 3600


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank-interpolated percentile (q in 0..100); None for no values."""
    if not values:
        return None
    vs = sorted(values)
    if len(vs) == 1:
        return vs[0]
    k = (len(vs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return vs[lo] + (vs[hi] - vs[lo]) * (k - lo)


def wait_stats(records: Iterable[JobRecord]) -> dict:
    """p50/p95/max of queue wait (first start minus submit) over started jobs, and how many never started."""
    started, never = [], 0
    for r in records:
        if r.wait_s is None:
            never += 1
        else:
            started.append(r.wait_s)
    return {
        "jobs": len(started) + never,
        "started": len(started),
        "never_started": never,
        "wait_p50_s": _round(percentile(started, 50)),
        "wait_p95_s": _round(percentile(started, 95)),
        "wait_max_s": _round(max(started) if started else None),
        "wait_mean_s": _round(statistics.fmean(started) if started else None),
    }


def _round(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def episode_stats(durations_s: Iterable[float], open_at_end: int = 0) -> dict:
    """Count, p50, p95 and max of episode lengths (seconds); `open_at_end` of them were still open."""
    ds = list(durations_s)
    return {
        "episodes": len(ds),
        "open_at_end": open_at_end,
        "p50_s": _round(percentile(ds, 50)),
        "p95_s": _round(percentile(ds, 95)),
        "max_s": _round(max(ds) if ds else None),
    }


SHAPES = ("slice", "1 card", "2-7 cards", "whole node", "multi-node gang")


def shape_of(request: Request) -> str:
    """The request's shape, as the figures split waits: a slice, one card, 2-7 cards on one node, a whole node
    (8 or more cards), a gang of several nodes; "cpu" for work with no GPU."""
    if request.nodes > 1 and request.uses_gpu:
        return "multi-node gang"
    if request.is_slice:
        return "slice"
    if request.gpus == 1:
        return "1 card"
    if 2 <= request.gpus < 8:
        return "2-7 cards"
    if request.gpus >= 8:
        return "whole node"
    return "cpu"


def owed_stats(jobs: list[OwedJob]) -> dict:
    """How long jobs waited while owed (within their team's guarantee) before they started: p50, p95 and max over
    every time a job was owed (a job still owed at the end counts its wait so far), and how many never started."""
    waits = [j.owed_s for j in jobs]
    return {
        "jobs": len(jobs),
        "never_started": sum(1 for j in jobs if not j.started),
        "p50_s": _round(percentile(waits, 50)),
        "p95_s": _round(percentile(waits, 95)),
        "max_s": _round(max(waits) if waits else None),
    }


def owed_figures(result: SimResult) -> dict:
    """Time owed before starting, by team and by request shape, and the owed jobs that never started."""
    g = result.guarantees
    if g is None:
        return {}
    specs = {r.spec.id: r.spec for r in result.jobs}
    by_team: dict[str, list[OwedJob]] = defaultdict(list)
    by_shape: dict[str, list[OwedJob]] = defaultdict(list)
    for j in g.owed_jobs:
        by_team[j.team].append(j)
        by_shape[shape_of(specs[j.job_id].request)].append(j)
    never = sorted({j.job_id for j in g.owed_jobs if not j.started})
    return {
        "time_owed_by_team": {k: owed_stats(v) for k, v in sorted(by_team.items())},
        "time_owed_by_shape": {k: owed_stats(by_shape[k]) for k in SHAPES if k in by_shape},
        "owed_never_started": {
            "jobs": len(never),
            "by_kind": dict(sorted(Counter(specs[j].kind or "" for j in never).items())),
            "ids": never[:20],
        },
    }


def time_to_guarantee(g: GuaranteeFigures) -> dict:
    """Per reclaim episode (a team waiting for work its guarantee owes it), how long until it all ran."""
    teams = {name: t for name, t in g.teams.items() if t.episodes_s}
    overall = episode_stats(
        [d for t in teams.values() for d in t.episodes_s], sum(t.open_episodes for t in teams.values())
    )
    overall["by_team"] = {name: episode_stats(t.episodes_s, t.open_episodes) for name, t in teams.items()}
    return overall


def share_ratios(g: GuaranteeFigures) -> dict[str, float]:
    """Per team, the compute it held over its weighted max-min fair share, both integrated over the window
    (teams with a fair share at some time)."""
    return {name: t.held_milli_s / t.fair_milli_s for name, t in g.teams.items() if t.fair_milli_s > 0}


def guarantee_figures(g: GuaranteeFigures) -> dict:
    """The guarantee and fairness figures of a run (docs/simulator.md, Metrics)."""
    ratios = share_ratios(g)
    jain = jain_index(ratios.values())
    return {
        "time_to_guarantee": time_to_guarantee(g),
        "within_guarantee_evictions_by_other_teams": g.within_guarantee_evictions_by_other_teams,
        "within_guarantee_evictions_by_team": {
            name: t.within_guarantee_evictions for name, t in g.teams.items() if t.within_guarantee_evictions
        },
        "evictions_cross_team": g.evictions_cross_team,
        "evictions_within_team": g.evictions_within_team,
        "priority_inversions": g.priority_inversions,
        "priority_inversions_by_team": {
            name: t.priority_inversions for name, t in g.teams.items() if t.priority_inversions
        },
        "borrowed_share_error": round(g.share_error_s / g.borrowed_s, 4) if g.borrowed_s > 0 else None,
        "borrowed_time_s": round(g.borrowed_s, 3),
        "fair_share_ratio": {name: round(x, 4) for name, x in ratios.items()},
        "jain_index": _round(jain, 4),
    }


def lost_figures(jobs: Iterable[JobRecord], allocated_milli_s: float) -> dict:
    """GPU-hours of work thrown away (by preemption and by node failure) and their share of GPU-hours delivered."""
    lost_s = failure_s = 0.0
    for r in jobs:
        lost_s += r.lost_gpu_s
        failure_s += r.lost_gpu_failure_s
    delivered_h = allocated_milli_s / _GPU_MILLI_S_PER_H
    return {
        "lost_gpu_h": round(lost_s / 3600, 4),
        "lost_gpu_h_preemption": round((lost_s - failure_s) / 3600, 4),
        "lost_gpu_h_failure": round(failure_s / 3600, 4),
        "delivered_gpu_h": round(delivered_h, 4),
        "lost_pct_of_delivered": round(100 * lost_s / 3600 / delivered_h, 4) if delivered_h > 0 else None,
    }


def summarize(result: SimResult) -> dict:
    """The headline figures of a run, JSON-ready. Time averages are over [start_s, end_s]."""
    span = max(1e-9, result.end_s - result.start_s)
    cap = max(1, result.capacity_milli)
    jobs = result.jobs
    arrived = [r for r in jobs if r.spec.submit_time_s <= result.end_s]
    done = [r for r in arrived if r.state is JobState.DONE]
    jcts = [r.jct_s for r in done if r.jct_s is not None]
    by_priority: dict[str, list[JobRecord]] = defaultdict(list)
    by_team: dict[str, list[JobRecord]] = defaultdict(list)
    by_kind: dict[str, list[JobRecord]] = defaultdict(list)
    by_shape: dict[str, list[JobRecord]] = defaultdict(list)
    for r in arrived:
        by_priority[r.spec.priority_class or str(r.spec.priority)].append(r)
        by_team[r.spec.team].append(r)
        by_shape[shape_of(r.spec.request)].append(r)
        if r.spec.kind:
            by_kind[r.spec.kind].append(r)
    team_mean_waits = [
        statistics.fmean(ws)
        for ws in ([r.wait_s for r in rs if r.wait_s is not None] for rs in by_team.values())
        if ws
    ]
    quota = {}
    for team, (t_s, integral) in sorted(result.quota_satisfaction.items()):
        quota[team] = None if t_s <= 0 else round(integral / t_s, 4)
    rated = [v for v in quota.values() if v is not None]
    return {
        "duration_s": round(span, 3),
        "capacity_gpus": result.capacity_milli / 1000,
        "allocation": round(result.allocated_milli_s / (cap * span), 4),
        "utilization": round(result.used_milli_s / (cap * span), 4),
        "fragmentation": round(result.fragment_milli_s / (cap * span), 4),
        "mean_queue_len": round(result.queue_len_s / span, 3),
        "jobs_arrived": len(arrived),
        "jobs_completed": len(done),
        "jobs_timed_out": sum(1 for r in arrived if r.state is JobState.TIMED_OUT),
        "wait": wait_stats(arrived),
        "wait_by_priority": {k: wait_stats(v) for k, v in sorted(by_priority.items())},
        "wait_by_team": {k: wait_stats(v) for k, v in sorted(by_team.items())},
        "wait_by_kind": {k: wait_stats(v) for k, v in sorted(by_kind.items())},
        "wait_by_shape": {k: wait_stats(by_shape[k]) for k in (*SHAPES, "cpu") if k in by_shape},
        "jct_p50_s": _round(percentile(jcts, 50)),
        "jct_p95_s": _round(percentile(jcts, 95)),
        "jct_mean_s": _round(statistics.fmean(jcts) if jcts else None),
        "preemptions": sum(r.preemptions for r in jobs),
        "failure_requeues": sum(r.failures for r in jobs),
        "node_failures": result.node_failures,
        "lost_work_s": round(sum(r.lost_work_s for r in jobs), 3),
        "lost_gpu_s": round(sum(r.lost_gpu_s for r in jobs), 3),
        **lost_figures(jobs, result.allocated_milli_s),
        "moves": sum(r.moves for r in jobs),
        "lost_gpu_h_moves": round(sum(r.lost_gpu_move_s for r in jobs) / 3600, 4),
        "whole_nvlink_nodes": result.nvlink_nodes,
        "whole_nvlink_nodes_free_mean": round(result.whole_nvlink_free_s / span, 3),
        "whole_nvlink_nodes_free_min": min((p.whole_nvlink_free for p in result.series), default=0),
        "reservations": {
            **result.reservations,
            "broken": result.reservations.get("moved", 0) + result.reservations.get("dropped", 0),
        },
        **owed_figures(result),
        "quota_satisfaction": quota,
        "quota_satisfaction_rate": round(statistics.fmean(rated), 4) if rated else None,
        **(guarantee_figures(result.guarantees) if result.guarantees is not None else {}),
        # The seed's fairness figure: how unequal teams' mean waits are (seconds squared; its root alongside).
        "team_wait_variance_s2": round(statistics.pvariance(team_mean_waits), 3)
        if len(team_mean_waits) > 1
        else 0.0,
        "team_wait_sd_s": round(statistics.pstdev(team_mean_waits), 3) if len(team_mean_waits) > 1 else 0.0,
        "cycles": result.cycles,
        "cycle_wall_s": round(result.cycle_wall_s, 3),
        "idle": idle_figures(arrived),
    }


def idle_figures(arrived: list[JobRecord]) -> dict:
    """Idle GPUs held and given back: the jobs whose usage leaves their cards idle part of the time (notebooks),
    the card-hours they held idle, the card-hours stopping them idle gave back before their natural end, and how
    long everyone else waited."""
    patterned = [r for r in arrived if r.spec.busy_s is not None]
    others = [r for r in arrived if r.spec.busy_s is None]
    return {
        "jobs": len(patterned),
        "stopped_idle": sum(1 for r in patterned if r.state is JobState.IDLE_STOPPED),
        "gpu_hours_held_idle": round(sum(r.idle_gpu_s for r in patterned) / 3600, 3),
        "gpu_hours_reclaimed": round(sum(r.idle_reclaimed_gpu_s for r in patterned) / 3600, 3),
        "others_wait": wait_stats(others),
    }


def job_rows(result: SimResult) -> list[dict]:
    """One row per job for the CSV report."""
    rows = []
    for r in result.jobs:
        s = r.spec
        rows.append(
            {
                "job": s.id,
                "team": s.team,
                "kind": s.kind,
                "priority_class": s.priority_class,
                "priority": s.priority,
                "gpus": s.request.gpus * max(1, s.request.nodes),
                "slice_memory_mib": s.request.gpu_memory_mib,
                "slice_compute_milli": s.request.gpu_compute_milli,
                "submit_s": s.submit_time_s,
                "first_start_s": r.first_start_s,
                "finish_s": r.finish_s,
                "wait_s": r.wait_s,
                "jct_s": r.jct_s,
                "state": r.state.name.lower(),
                "preemptions": r.preemptions,
                "failure_requeues": r.failures,
                "lost_work_s": round(r.lost_work_s, 3),
            }
        )
    return rows


def series_rows(result: SimResult) -> list[dict]:
    """The time series as CSV rows, shares of capacity."""
    cap = max(1, result.capacity_milli)
    return [
        {
            "time_s": p.time_s,
            "allocation": round(p.allocated_milli / cap, 5),
            "utilization": round(p.used_milli / cap, 5),
            "fragmentation": round(p.fragment_milli / cap, 5),
            "queue_len": p.queue_len,
            "running": p.running,
            "whole_nvlink_free": p.whole_nvlink_free,
        }
        for p in result.series
    ]
