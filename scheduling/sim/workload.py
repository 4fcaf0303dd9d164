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
