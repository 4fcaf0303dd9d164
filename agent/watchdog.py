"""Memory-slice watchdog for time-sliced GPUs: stops the job whose processes hold more than its slice.

Time-slicing shares a GPU with no memory fence, so a job growing past its slice would push its neighbours
out of memory. Each sample, per-process memory (from the backend) is attributed to jobs through the process's
session/group (every job is its own session), summed per job and GPU, and an offender is stopped
(SIGTERM, a short grace, SIGKILL). Each stop is recorded as a prevented neighbour interference.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from agent import procfs
from agent.backends.base import Sample
from agent.executor import Executor
from agent.placement import RUNNING


@dataclass(frozen=True)
class InterferenceEvent:
    kind: str  # always "prevented_neighbour_interference"
    job_id: str
    attempt: int
    gpu_uuid: str
    used_mib: int
    limit_mib: int
    pids: tuple[int, ...]
    at: float

    def to_dict(self) -> dict:
        return asdict(self)


class MemoryWatchdog:
    def __init__(
        self,
        executor: Executor,
        *,
        tolerance_mib: int = 0,
        grace_s: float = 5.0,
        proc_root: Path = procfs.PROC,
    ) -> None:
        self.executor = executor
        self.tolerance_mib = tolerance_mib
        self.grace_s = grace_s
        self.proc_root = proc_root

    def check(self, sample: Sample) -> list[InterferenceEvent]:
        running = [h for h in self.executor.active() if h.state == RUNNING]
        # A job's processes: its group (pgid = its first process) and its supervisor's session.
        by_group = {h.pgid: h for h in running if h.pgid is not None}
        by_group.update({h.pid: h for h in running if h.pid is not None})
        if not by_group:
            return []
        events: list[InterferenceEvent] = []
        for gpu in sample.gpus:
            usage: dict[str, tuple[int, list[int]]] = {}
            for proc in gpu.processes:
                if proc.used_mib is None:
                    continue
                handle = by_group.get(proc.pid)
                if handle is None:
                    st = procfs.read_stat(proc.pid, self.proc_root)
                    if st is None:
                        continue
                    handle = by_group.get(st.session) or by_group.get(st.pgrp)
                if handle is None:
                    continue
                used, pids = usage.get(handle.key, (0, []))
                usage[handle.key] = (used + proc.used_mib, [*pids, proc.pid])
            for key, (used, pids) in usage.items():
                handle = self.executor.handle(key)
                if handle is None or handle.state != RUNNING:
                    continue
                gslice = next((g for g in handle.spec.gpus if g.uuid == gpu.uuid), None)
                if gslice is None or gslice.sharing != "timeslice" or gslice.memory_mib is None:
                    continue
                if used > gslice.memory_mib + self.tolerance_mib:
                    self.executor.stop(
                        key, reason="memory_slice_exceeded", grace_s=min(self.grace_s, handle.spec.grace_s)
                    )
                    events.append(
                        InterferenceEvent(
                            kind="prevented_neighbour_interference",
                            job_id=handle.spec.job_id,
                            attempt=handle.spec.attempt,
                            gpu_uuid=gpu.uuid,
                            used_mib=used,
                            limit_mib=gslice.memory_mib,
                            pids=tuple(pids),
                            at=time.time(),
                        )
                    )
        return events
