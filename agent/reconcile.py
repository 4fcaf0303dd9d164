"""Level-triggered convergence: make the node run exactly the placements of the desired state.

Start what is missing, stop what is not wanted, report what runs. A placement that already ran (finished)
is never started again: the same desired state applied twice does nothing the second time. A new placement
waits while a placement being stopped still holds one of its GPUs, so a preemptor never overlaps its victim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.executor import Executor
from agent.jobspec import JobSpec
from agent.placement import FINISHED, RUNNING


@dataclass(frozen=True)
class DesiredState:
    version: int
    jobs: tuple[JobSpec, ...] = ()

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> DesiredState:
        jobs = tuple(JobSpec.from_dict(j) for j in payload.get("jobs") or [])
        keys = [j.key for j in jobs]
        if len(keys) != len(set(keys)):
            raise ValueError("the desired state lists a placement twice")
        return cls(version=int(payload["version"]), jobs=jobs)

    def to_payload(self) -> dict[str, Any]:
        return {"version": self.version, "jobs": [j.to_dict() for j in self.jobs]}


@dataclass
class ReconcileResult:
    started: list[str] = field(default_factory=list)
    stopping: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)  # key -> why it is not started yet
    rejected: dict[str, str] = field(default_factory=dict)  # key -> why it will never start here
    running: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.started or self.stopping or self.rejected)


class Reconciler:
    def __init__(self, executor: Executor, *, known_gpu_uuids: set[str] | None = None) -> None:
        self.executor = executor
        self.known_gpu_uuids = known_gpu_uuids

    def converge(self, desired: DesiredState) -> ReconcileResult:
        result = ReconcileResult()
        wanted = {spec.key: spec for spec in desired.jobs}
        for handle in self.executor.active():
            if handle.key not in wanted and handle.state == RUNNING:
                self.executor.stop(handle.key, reason="not_desired")
                result.stopping.append(handle.key)
        # GPUs still held by placements on their way out.
        leaving = {g.uuid: h.key for h in self.executor.active() if h.key not in wanted for g in h.spec.gpus}
        for key, spec in wanted.items():
            handle = self.executor.handle(key)
            if handle is not None:
                if handle.state != FINISHED:
                    result.running.append(key)
                continue
            unknown = [
                g.uuid
                for g in spec.gpus
                if self.known_gpu_uuids is not None and g.uuid not in self.known_gpu_uuids
            ]
            if unknown:
                result.rejected[key] = f"GPU(s) not on this node: {', '.join(unknown)}"
                self.executor.reject(spec, result.rejected[key])
                continue
            blockers = sorted({leaving[g.uuid] for g in spec.gpus if g.uuid in leaving})
            if blockers:
                result.waiting[key] = f"waiting for {', '.join(blockers)} to stop"
                continue
            before = self.executor.launches
            handle = self.executor.start(spec)
            if self.executor.launches > before:
                result.started.append(key)
            if handle.state != FINISHED:
                result.running.append(key)
        return result
