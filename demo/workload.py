"""The demo cluster's workload: what its teams submit each minute, from a seed and the clock.

One mix serves the demo's generated past (`demo.history`) and its living present (`DemoSubmitter`, run by
`manage.py run_demo`): inference slices, single cards, sweeps, a multi-GPU training now and then, idle notebooks,
at a rate that follows the working day and a 40-minute wave, so the queue rises and falls. A minute's submissions
depend only on the seed and that minute (`submissions`): two demos with one seed submit the same work at the same
clock times, and a demo left running keeps submitting for as long as it runs.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.contrib.auth import get_user_model

from quotas.models import Team
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.submit import job_submit

log = logging.getLogger("tessera.demo")

GIB = 1024
DEFAULT_SEED = 7
STEP_S = 5  # the demo's stand-in scripts print a step every 5 s (demo.management.commands.run_demo)


@dataclass(frozen=True)
class Kind:
    """A kind of job one person of a team submits: its request, how long it runs (minutes) and how often."""

    team: str
    user: str
    name: str
    command: str
    weight: float
    minutes: tuple[int, int]
    gpus: int = 0
    gpu_memory_gib: int = 0
    compute_pct: int = 0
    models: tuple[str, ...] = ()  # the GPU models it asks for; () any
    idle: bool = False  # holds its cards without using them (a notebook left open)
    live: bool = (
        True  # submitted by the living demo too (alice's own work is left to whoever signs in as her)
    )


KINDS = (
    Kind(
        "ai-lab/inference",
        "bob",
        "llm-serve",
        "python serve.py",
        5,
        (5, 30),
        gpu_memory_gib=8,
        compute_pct=15,
    ),
    Kind(
        "ai-lab/inference",
        "bob",
        "embed-batch",
        "python embed.py",
        3,
        (3, 15),
        gpu_memory_gib=10,
        compute_pct=25,
    ),
    Kind("ai-lab/research", "dave", "sweep-lr", "python sweep.py", 3, (8, 25), gpus=1),
    Kind("ai-lab/research", "dave", "ablation", "python ablate.py", 1, (15, 40), gpus=2),
    Kind(
        "ai-lab/research",
        "dave",
        "vit-train",
        "python train.py",
        0.3,
        (30, 60),
        gpus=4,
        models=("H100-80GB",),
    ),
    Kind("ai-lab/research", "dave", "notebook", "jupyter lab", 0.5, (20, 45), gpus=1, idle=True),
    Kind(
        "ai-lab/training", "carol", "eval", "python eval.py", 2, (10, 30), gpus=1, models=("T4", "H100-80GB")
    ),
    Kind("ai-lab/training", "carol", "finetune", "python train.py", 0.7, (30, 75), gpus=2),
    Kind("ai-lab/training", "alice", "bert-finetune", "python train.py", 1.5, (30, 120), gpus=2, live=False),
    Kind("ai-lab/training", "alice", "llama-lora", "python train.py", 0.5, (60, 180), gpus=4, live=False),
)
# Jobs submitted a minute, on average over a day: about 20 GPUs busy, research and training near their limits at
# the day's and the wave's peaks, so their queues rise and drain.
MEAN_PER_MINUTE = 0.3
# The living demo runs the same mix faster: three times the jobs, each a third as long (the same GPUs busy on
# average), so a visitor sees work come, wait and go within minutes.
LIVE_SPEED = 3


@dataclass(frozen=True)
class Submission:
    at: datetime  # the minute it is submitted in
    kind: Kind
    name: str
    runtime_s: int  # how long it runs once started

    def spec(self) -> JobSpec:
        k = self.kind
        steps = max(1, self.runtime_s // STEP_S)
        return JobSpec(
            name=self.name,
            command=k.command,
            env={"TESSERA_DEMO_STEPS": str(steps)},
            gpus=k.gpus,
            gpu_models=k.models,
            gpu_memory_mib=k.gpu_memory_gib * GIB,
            compute_pct=k.compute_pct,
            # A runtime limit with room to spare: the estimates have something to go by.
            max_runtime_s=max(600, round(self.runtime_s * 1.5, -2)),
        )


def load(at: datetime) -> float:
    """How busy the teams are at a moment, 0.2-1.8 around 1: the working day (UTC), quieter at weekends, with a
    40-minute wave on top (the queue rises and falls within a demo's hour)."""
    hour = at.hour + at.minute / 60
    day = 1 + 0.45 * math.sin(2 * math.pi * (hour - 9) / 24)
    wave = 1 + 0.5 * math.sin(2 * math.pi * (at.timestamp() / 60) / 40)
    weekend = 0.6 if at.weekday() >= 5 else 1.0
    return max(0.2, day * wave * weekend)


def submissions(*, seed: int, minute: datetime, live: bool = False) -> list[Submission]:
    """What the teams submit in one minute (UTC), the same for the same seed and minute. `live`: the living demo's
    (only the kinds it submits, at LIVE_SPEED)."""
    minute = minute.astimezone(UTC).replace(second=0, microsecond=0)
    stamp = int(minute.timestamp() // 60)
    rng = random.Random(f"{seed}:{stamp}{':live' if live else ''}")
    speed = LIVE_SPEED if live else 1
    rate = MEAN_PER_MINUTE * load(minute) * speed
    # Poisson draws: the number of arrivals in a minute at this rate.
    count, threshold, p = 0, math.exp(-rate), rng.random()
    while p > threshold:
        count += 1
        p *= rng.random()
    kinds = [k for k in KINDS if k.live or not live]
    out = []
    for n in range(count):
        k = rng.choices(KINDS, weights=[k.weight for k in KINDS])[0]
        runtime_s = max(60, rng.randint(k.minutes[0], k.minutes[1]) * 60 // speed)
        if k not in kinds:
            continue
        out.append(Submission(minute, k, f"{k.name}-{stamp % 10000:04d}{n}", runtime_s))
    return out


class DemoSubmitter:
    """Submits the demo teams' work as the clock passes: each minute's `submissions` once, in order, from the minute
    it starts (the minutes before are the generated past's, `demo.history`)."""

    def __init__(self, *, seed: int = DEFAULT_SEED, catch_up_minutes: int = 10):
        self.seed = seed
        self.catch_up_minutes = catch_up_minutes
        self.done_until: datetime | None = None  # the last minute submitted
        self.submitted = 0

    def step(self, *, now: datetime | None = None) -> int:
        """Submit every minute's work up to now's minute not yet submitted. Returns the jobs submitted."""
        minute = (now or datetime.now(UTC)).astimezone(UTC).replace(second=0, microsecond=0)
        if self.done_until is None:
            self.done_until = minute - timedelta(minutes=1)
        # A demo paused for long (a laptop asleep) does not flood the queue with what it missed.
        first = max(self.done_until + timedelta(minutes=1), minute - timedelta(minutes=self.catch_up_minutes))
        teams = {t.slug: t for t in Team.objects.filter(slug__in={k.team for k in KINDS})}
        users = {u.username: u for u in get_user_model().objects.filter(username__in={k.user for k in KINDS})}
        n = 0
        at = first
        while at <= minute:
            for s in submissions(seed=self.seed, minute=at, live=True):
                team, user = teams.get(s.kind.team), users.get(s.kind.user)
                if team is None or user is None:
                    continue
                try:
                    job_submit(submitter=user, team=team, spec=s.spec())
                    n += 1
                except Exception as exc:  # a refusal (the quota was edited) is the demo's news, not its end
                    log.info("demo workload: %s of %s not submitted: %s", s.name, s.kind.team, exc)
            at += timedelta(minutes=1)
        self.done_until = minute
        self.submitted += n
        return n
