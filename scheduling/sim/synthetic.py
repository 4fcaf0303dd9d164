"""Synthetic workloads: job streams with an arrival process and a runtime distribution, drawn deterministically.

A stream's draws depend only on the run seed and the stream's name, so adding a stream never changes another's jobs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from scheduling.engine.types import WHOLE_GPU_MILLI, Request, TopologyNeed
from scheduling.sim.workload import SimJob, default_usage_milli

ARRIVAL_PROCESSES = ("at", "uniform", "random", "poisson")
RUNTIME_DISTRIBUTIONS = ("fixed", "uniform", "exponential", "lognormal")


@dataclass(frozen=True, slots=True)
class Arrival:
    """When a stream's jobs arrive.

    at: all at `start_s`; uniform: evenly spaced over [start_s, end_s); random: uniformly at random over it;
    poisson: a Poisson process of `rate_per_h` from `start_s` (stopping at `end_s` if set, or after `count` jobs).
    """

    process: str = "at"
    start_s: float = 0.0
    end_s: float | None = None
    rate_per_h: float | None = None


@dataclass(frozen=True, slots=True)
class Runtime:
    """How much work each job carries, seconds at full speed. Draws are clipped to [min_s, max_s] when set."""

    dist: str = "fixed"
    value_s: float = 3600.0  # fixed; the mean (exponential) or median (lognormal)
    low_s: float = 0.0  # uniform
    high_s: float = 0.0
    sigma: float = 0.5  # lognormal shape
    min_s: float | None = None
    max_s: float | None = None


@dataclass(frozen=True, slots=True)
class Stream:
    name: str
    team: str
    count: int
    request: Request
    arrival: Arrival = field(default_factory=Arrival)
    runtime: Runtime = field(default_factory=Runtime)
    priority: int = 0
    preemptible: bool = True
    grace_s: float = 30.0
    checkpoint_interval_s: float | None = None
    max_runtime_s: float | None = None
    usage_milli: int | None = None  # None: the request's own share (slices) or a whole card
    priority_class: str = ""
    kind: str = ""
    busy_s: float | None = None  # busy this long of every busy_every_s (a notebook); None: all along
    busy_every_s: float | None = None
    idle_timeout_s: float | None = None  # its class's: stopped after this long idle


def arrival_times(arrival: Arrival, count: int, rng: random.Random) -> list[float]:
    p = arrival.process
    if p == "at":
        return [arrival.start_s] * count
    if p in ("uniform", "random"):
        end = arrival.end_s if arrival.end_s is not None else arrival.start_s
        span = max(0.0, end - arrival.start_s)
        if p == "uniform":
            return [arrival.start_s + span * i / count for i in range(count)]
        return sorted(arrival.start_s + rng.random() * span for _ in range(count))
    if p == "poisson":
        if not arrival.rate_per_h or arrival.rate_per_h <= 0:
            raise ValueError("a poisson arrival needs a positive rate_per_h")
        rate_per_s = arrival.rate_per_h / 3600.0
        out, t = [], arrival.start_s
        while len(out) < count:
            t += rng.expovariate(rate_per_s)
            if arrival.end_s is not None and t >= arrival.end_s:
                break
            out.append(t)
        return out
    raise ValueError(f"unknown arrival process {p!r} (one of {', '.join(ARRIVAL_PROCESSES)})")


def draw_runtime(runtime: Runtime, rng: random.Random) -> float:
    d = runtime.dist
    if d == "fixed":
        x = runtime.value_s
    elif d == "uniform":
        x = rng.uniform(runtime.low_s, runtime.high_s)
    elif d == "exponential":
        x = rng.expovariate(1.0 / runtime.value_s)
    elif d == "lognormal":
        x = runtime.value_s * math.exp(rng.gauss(0.0, runtime.sigma))
    else:
        raise ValueError(f"unknown runtime distribution {d!r} (one of {', '.join(RUNTIME_DISTRIBUTIONS)})")
    if runtime.min_s is not None:
        x = max(x, runtime.min_s)
    if runtime.max_s is not None:
        x = min(x, runtime.max_s)
    return max(1.0, x)


def stream_jobs(stream: Stream, seed: int) -> list[SimJob]:
    """The jobs of one stream, a pure function of (stream, seed)."""
    rng = random.Random(f"tessera-synthetic:{seed}:{stream.name}")
    times = arrival_times(stream.arrival, stream.count, rng)
    usage = stream.usage_milli if stream.usage_milli is not None else default_usage_milli(stream.request)
    width = max(3, len(str(max(0, stream.count - 1))))
    return [
        SimJob(
            id=f"{stream.name}-{i:0{width}d}",
            team=stream.team,
            request=stream.request,
            submit_time_s=t,
            runtime_s=draw_runtime(stream.runtime, rng),
            priority=stream.priority,
            preemptible=stream.preemptible,
            grace_s=stream.grace_s,
            max_runtime_s=stream.max_runtime_s,
            checkpoint_interval_s=stream.checkpoint_interval_s,
            usage_milli=usage,
            priority_class=stream.priority_class,
            kind=stream.kind or stream.name,
            busy_s=stream.busy_s,
            busy_every_s=stream.busy_every_s,
            idle_timeout_s=stream.idle_timeout_s,
        )
        for i, t in enumerate(times)
    ]


def generate(streams: Iterable[Stream], seed: int) -> list[SimJob]:
    """All streams' jobs, in submit order (ties by id)."""
    jobs = [job for s in streams for job in stream_jobs(s, seed)]
    jobs.sort(key=lambda j: (j.submit_time_s, j.id))
    return jobs


def mixed_streams(
    *,
    teams: Sequence[str],
    jobs_per_hour: float,
    duration_s: float,
    card_memory_mib: int = 81920,
    shares: tuple[float, float, float] = (0.5, 0.4, 0.1),
) -> list[Stream]:
    """A ready-made mixed workload per team: inference slices, 1-2 GPU jobs and 8-GPU NVLink training.

    `shares` splits each team's `jobs_per_hour / len(teams)` between the three kinds. Slices ask for an eighth of
    a card; whole-GPU jobs saturate their cards. The streams are ordinary `Stream`s, so the result is as
    deterministic as any other.
    """
    per_team = jobs_per_hour / max(1, len(teams))
    slice_mib = card_memory_mib // 8
    out: list[Stream] = []
    kinds = (
        (
            "inference",
            Request(gpu_memory_mib=slice_mib, gpu_compute_milli=WHOLE_GPU_MILLI // 8),
            Runtime("lognormal", 1800, sigma=0.8),
            50,
        ),
        ("batch", Request(gpus=1), Runtime("lognormal", 3600, sigma=0.7), 10),
        (
            "training",
            Request(gpus=8, topology=TopologyNeed.NVLINK),
            Runtime("lognormal", 4 * 3600, sigma=0.5),
            100,
        ),
    )
    for team in teams:
        for (kind, request, runtime, priority), share in zip(kinds, shares, strict=True):
            rate = per_team * share
            if rate <= 0:
                continue
            out.append(
                Stream(
                    name=f"{team.replace('/', '-')}-{kind}",
                    team=team,
                    count=max(1, math.ceil(rate * duration_s / 3600 * 2)),
                    request=request,
                    arrival=Arrival("poisson", 0.0, duration_s, rate),
                    runtime=runtime,
                    priority=priority,
                    preemptible=kind != "training",
                    checkpoint_interval_s=1800.0 if kind != "inference" else None,
                    priority_class=kind,
                    kind=kind,
                )
            )
    return out


def with_whole_cards(job: SimJob) -> SimJob:
    """The same job asking for a whole card instead of a slice (what a scheduler without slicing gives it).

    Its real usage does not change: a 4 GiB inference server still drives the same compute on a whole card.
    """
    req = job.request
    if not req.is_slice:
        return job
    whole = replace(
        req,
        gpus=1,
        gpu_memory_mib=0,
        gpu_compute_milli=0,
        min_gpu_memory_mib=max(req.min_gpu_memory_mib, req.gpu_memory_mib),
    )
    return replace(job, request=whole)
