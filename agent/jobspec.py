"""What the portal asks a node to run: one placement of one job (job id + attempt) on GPU slices.

`JobSpec` is a job entry of the wire protocol's `desired_state` message (protocol version 1, agent/protocol.py;
docs/agent.md): its fields are exactly the keys the portal sends (scheduling/cycle/desired_state.py), which a
contract test holds the two sides to.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.backends.base import sharing_mode
from agent.containers import NETWORKS, Mount


@dataclass(frozen=True)
class GpuSlice:
    uuid: str
    index: int
    memory_mib: int | None = None  # the job's memory slice on this GPU (None: the whole card)
    compute_pct: int | None = None  # the job's compute share (None: the whole card)
    sharing: str = "exclusive"  # exclusive | mps | timeslice | mig

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuSlice:
        sharing = sharing_mode(str(data.get("sharing") or "exclusive"))
        mem, pct = data.get("memory_mib"), data.get("compute_pct")
        return cls(
            uuid=str(data["uuid"]),
            index=int(data["index"]),
            memory_mib=int(mem) if mem is not None else None,
            compute_pct=int(pct) if pct is not None else None,
            sharing=sharing,
        )


@dataclass(frozen=True)
class GangMember:
    node: str
    address: str  # where the other members reach this node (MASTER_ADDR when it is rank 0)
    slots: int  # processes it runs: its whole GPUs (LOCAL_WORLD_SIZE)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GangMember:
        address = str(data["address"])
        if not address or any(c.isspace() for c in address):
            raise ValueError(f"a gang member's address must be one word, not {address!r}")
        slots = int(data["slots"])
        if slots < 1:
            raise ValueError("a gang member needs at least one slot")
        return cls(node=str(data["node"]), address=address, slots=slots)


@dataclass(frozen=True)
class Gang:
    """The placement of a multi-node job as one member sees it: its rank among all members, in rank order."""

    rank: int
    master_port: int
    members: tuple[GangMember, ...]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Gang:
        members = tuple(GangMember.from_dict(m) for m in data["members"])
        rank, port = int(data["rank"]), int(data["master_port"])
        if not 0 <= rank < len(members):
            raise ValueError(f"gang rank {rank} is not one of its {len(members)} members")
        if not 0 < port < 65536:
            raise ValueError(f"master_port {port} is not a TCP port")
        return cls(rank=rank, master_port=port, members=members)


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    attempt: int  # placement epoch: a requeued job comes back with a higher attempt
    command: tuple[str, ...] | str  # argv, or a shell line run with /bin/sh -c
    name: str = ""  # the job's name, for the agent's own log lines
    env: dict[str, str] = field(default_factory=dict)
    gpus: tuple[GpuSlice, ...] = ()
    max_runtime_s: float | None = None
    grace_s: float = 30.0
    cwd: str | None = None
    # Stop the job once the portal has not heard from this node for this long (None: the agent's default). The
    # portal re-places the job elsewhere only after this plus the grace has passed.
    fence_after_s: float | None = None
    # Host resources the job asked for: limits where the agent can enforce them (agent/isolation.py).
    cpu_milli: int | None = None
    memory_mib: int | None = None
    user: str | None = None  # the submitter (a Unix account of that name, where jobs run as their submitters)
    gang: Gang | None = None  # a member of a multi-node job
    # Web ports it serves, ((name, port), ...): given to it as TESSERA_PORT_<NAME> (that port where it is free).
    ports: tuple[tuple[str, int], ...] = ()
    # A container image to run the command in (agent/containers.py), with the team's mounts it asked for and its
    # network (none | cluster | open); blank: a bare process on the host.
    image: str = ""
    mounts: tuple[Mount, ...] = ()
    network: str = "open"

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
            name=str(data.get("name") or ""),
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
            gpus=tuple(GpuSlice.from_dict(g) for g in data.get("gpus") or []),
            max_runtime_s=float(max_rt) if max_rt is not None else None,
            grace_s=float(data.get("grace_s", 30.0)),
            cwd=data.get("cwd"),
            fence_after_s=float(fence) if fence is not None else None,
            cpu_milli=_positive_int(data.get("cpu_milli")),
            memory_mib=_positive_int(data.get("memory_mib")),
            user=str(data["user"]) if data.get("user") else None,
            gang=Gang.from_dict(data["gang"]) if data.get("gang") else None,
            ports=tuple(_port(p) for p in data.get("ports") or ()),
            image=_image(data.get("image")),
            mounts=tuple(_mount(m) for m in data.get("mounts") or ()),
            network=_network(data.get("network")),
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["command"] = list(self.command) if isinstance(self.command, tuple) else self.command
        out["gpus"] = [asdict(g) for g in self.gpus]
        if not self.ports:
            del out["ports"]
        else:
            out["ports"] = [{"name": name, "port": port} for name, port in self.ports]
        if not self.image:
            for key in ("image", "mounts", "network"):
                del out[key]
        else:
            out["mounts"] = [asdict(m) for m in self.mounts]
        if self.gang is None:
            del out["gang"]
        else:
            out["gang"]["members"] = [asdict(m) for m in self.gang.members]
        return out


def _port(data: Any) -> tuple[str, int]:
    name, port = str(data["name"]), int(data["port"])
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", name) or not 1024 <= port <= 65535:
        raise ValueError(f"a web port is a name and a port from 1024 to 65535, not {name!r}: {port!r}")
    return name, port


def _image(value: Any) -> str:
    image = str(value or "")
    if image and (len(image) > 512 or any(c.isspace() or c == "\0" for c in image) or image.startswith("-")):
        raise ValueError(f"an image is one reference of at most 512 characters, not {image[:80]!r}")
    return image


def _mount(data: Any) -> Mount:
    host, inside = str(data["host_path"]), str(data["container_path"])
    for path in (host, inside):
        if not path.startswith("/") or ":" in path or "\0" in path or ".." in path.split("/"):
            raise ValueError(f"a mount's paths are absolute, without ':' or '..' (got {path!r})")
    return Mount(host_path=host, container_path=inside, read_only=bool(data.get("read_only", True)))


def _network(value: Any) -> str:
    network = str(value or "open")
    if network not in NETWORKS:
        raise ValueError(f"network must be one of {', '.join(NETWORKS)} (got {network!r})")
    return network


def _positive_int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    number = int(value)
    if number <= 0:
        raise ValueError(f"a host resource request must be positive (got {value!r})")
    return number


_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def safe_name(text: str) -> str:
    """A directory name for an id; ids that needed cleaning get a hash so two ids never share a name."""
    cleaned = _SAFE.sub("_", text)[:80]
    if cleaned == text and cleaned not in (".", ".."):
        return cleaned
    return f"{cleaned}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"
