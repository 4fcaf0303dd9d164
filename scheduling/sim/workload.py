"""What the simulator replays: its jobs (`SimJob`, one job as a workload describes it; not the portal's job spec)
and the node failures a scenario lists."""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.engine.types import WHOLE_GPU_MILLI, Request


@dataclass(frozen=True, slots=True)
class SimJob:
    """One job as the workload describes it: what it asks for, when it arrives and how much work it carries."""

    id: str
    team: str
    request: Request
    submit_time_s: float
    runtime_s: float  # work at full speed, seconds
    priority: int = 0
    preemptible: bool = True
    grace_s: float = 30.0
    max_runtime_s: float | None = None
    # Progress is saved every this many seconds of work; None: never (an eviction loses all progress).
    checkpoint_interval_s: float | None = None
    # Useful compute per GPU the job really drives, milli-GPU (a 4 GiB inference server may drive 100 of 1000).
    usage_milli: int = WHOLE_GPU_MILLI
    priority_class: str = ""
    kind: str = ""  # a label for reports ("training", "inference", a qos class...)
    # Use over time (a notebook): busy for `busy_s` at the start of every `busy_every_s` of its run, idle (0%) the
    # rest; None: busy all along at usage_milli.
    busy_s: float | None = None
    busy_every_s: float | None = None
    # Its class's idle timeout: a run idle this long is stopped, as a session is (scheduling/cycle/idle.py);
    # None: never.
    idle_timeout_s: float | None = None

    def idle_s_between(self, run_start_s: float, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] (within a run that started at run_start_s) its cards sat idle."""
        if self.busy_s is None or not self.busy_every_s or t1 <= t0:
            return 0.0
        every, busy = self.busy_every_s, min(self.busy_s, self.busy_every_s)

        def idle_until(t: float) -> float:  # idle seconds in [run_start_s, t]
            whole, part = divmod(max(0.0, t - run_start_s), every)
            return whole * (every - busy) + max(0.0, part - busy)

        return idle_until(t1) - idle_until(t0)

    def idle_stop_after_s(self) -> float | None:
        """How long after a start its run is stopped for idleness (its first idle spell reaching the timeout);
        None: never."""
        if self.idle_timeout_s is None or self.busy_s is None or not self.busy_every_s:
            return None
        if self.busy_every_s - self.busy_s < self.idle_timeout_s:
            return None
        return self.busy_s + self.idle_timeout_s


@dataclass(frozen=True, slots=True)
class NodeFailure:
    node: str
    time_s: float
    repair_s: float | None = None  # back to ready after this long; None: stays lost


def default_usage_milli(request: Request) -> int:
    """A slice drives its compute share (or its memory share when it names no compute); whole GPUs saturate."""
    if request.gpus > 0:
        return WHOLE_GPU_MILLI
    if request.gpu_compute_milli > 0:
        return request.gpu_compute_milli
    return 0 if not request.is_slice else WHOLE_GPU_MILLI
