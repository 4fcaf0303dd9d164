"""What the portal asks a node to run: one placement of one job (job id + attempt) on GPU slices."""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.backends.base import SHARING_MODES


@dataclass(frozen=True)
class GpuSlice:
    uuid: str
    index: int
    memory_mib: int | None = None  # the job's memory slice on this GPU (None: the whole card)
    compute_pct: int | None = None  # the job's compute share (None: the whole card)
    sharing: str = "exclusive"  # exclusive | mps | time_sliced | mig

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuSlice:
        sharing = str(data.get("sharing") or "exclusive")
        if sharing not in SHARING_MODES:
            raise ValueError(f"sharing must be one of {SHARING_MODES}, not {sharing!r}")
        mem, pct = data.get("memory_mib"), data.get("compute_pct")
        return cls(
            uuid=str(data["uuid"]),
            index=int(data["index"]),
            memory_mib=int(mem) if mem is not None else None,
            compute_pct=int(pct) if pct is not None else None,
            sharing=sharing,
        )


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    attempt: int  # placement epoch: a requeued job comes back with a higher attempt
    command: tuple[str, ...] | str  # argv, or a shell line run with /bin/sh -c
    env: dict[str, str] = field(default_factory=dict)
    gpus: tuple[GpuSlice, ...] = ()
    max_runtime_s: float | None = None
    grace_s: float = 30.0
    cwd: str | None = None
    # Stop the job once the portal has not heard from this node for this long (None: the agent's default). The
    # portal re-places the job elsewhere only after this plus the grace has passed.
    fence_after_s: float | None = None

    @property
    def key(self) -> str:
        return f"{self.job_id}:{self.attempt}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        command = data["command"]
        if isinstance(command, list):
            if not command or not all(isinstance(a, str) for a in command):
                raise ValueError("command must be a non-empty list of strings or a string")
            command = tuple(command)
        elif not isinstance(command, str) or not command.strip():
            raise ValueError("command must be a non-empty list of strings or a string")
        attempt = data.get("attempt", data.get("placement_epoch"))
        if attempt is None:
            raise ValueError("a job needs an attempt (placement epoch)")
        max_rt = data.get("max_runtime_s")
        fence = data.get("fence_after_s")
        return cls(
            job_id=str(data["job_id"]),
            attempt=int(attempt),
            command=command,
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
            gpus=tuple(GpuSlice.from_dict(g) for g in data.get("gpus") or []),
            max_runtime_s=float(max_rt) if max_rt is not None else None,
            grace_s=float(data.get("grace_s", 30.0)),
            cwd=data.get("cwd"),
            fence_after_s=float(fence) if fence is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["command"] = list(self.command) if isinstance(self.command, tuple) else self.command
        out["gpus"] = [asdict(g) for g in self.gpus]
        return out


_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def safe_name(text: str) -> str:
    """A directory name for an id; ids that needed cleaning get a hash so two ids never share a name."""
    cleaned = _SAFE.sub("_", text)[:80]
    if cleaned == text and cleaned not in (".", ".."):
        return cleaned
    return f"{cleaned}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"
