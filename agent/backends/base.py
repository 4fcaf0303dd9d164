"""Types every GPU backend returns: the node's inventory (static facts) and one sample (live readings)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable

# The portal's words (scheduling.choices.SharingMode). `time_sliced`, the agent's earlier word for time-slicing,
# is still read as `timeslice` (a host's flags or config, a portal not yet upgraded).
SHARING_MODES = ("exclusive", "mps", "timeslice", "mig")
_SHARING_ALIASES = {"time_sliced": "timeslice"}


def sharing_mode(name: str) -> str:
    """`name` in the vocabulary above (an alias read as its mode); a ValueError names the modes otherwise."""
    mode = _SHARING_ALIASES.get(name, name)
    if mode not in SHARING_MODES:
        raise ValueError(f"sharing mode {name!r} is not one of {', '.join(SHARING_MODES)}")
    return mode


@dataclass(frozen=True)
class MigProfile:
    profile_id: int
    name: str
    slice_count: int
    instance_count: int
    multiprocessor_count: int
    memory_mib: int


@dataclass(frozen=True)
class MigDevice:
    """A MIG instance that exists now on a MIG-enabled GPU; jobs address it by its MIG- UUID."""

    uuid: str
    memory_mib: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_total_mib: int
    compute_capability: str | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = None  # Linux cpulist form, e.g. "0-15,32-47"
    mig_mode_current: bool | None = None
    mig_mode_pending: bool | None = None
    mig_profiles: list[MigProfile] = field(default_factory=list)
    mig_devices: list[MigDevice] = field(default_factory=list)
    power_limit_w: float | None = None
    ecc_enabled: bool | None = None
    compute_mode: int | None = None
    sharing_mode: str = "exclusive"
    # Queries the driver refused ("NotSupported" etc.): field name -> NVML error name.
    unsupported: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuLink:
    """How two GPUs of the node reach each other."""

    gpu_a: str  # uuid
    gpu_b: str  # uuid
    nvlink_count: int  # active NVLinks between the pair (0 when none or unknown)
    path: str | None  # NV# / PIX / PXB / PHB / NODE / SYS, None when the driver would not say
    p2p_supported: bool | None = None


@dataclass
class Inventory:
    backend: str
    gpus: list[GpuInfo]
    links: list[GpuLink] = field(default_factory=list)
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nvml_version: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def gpu_by_uuid(self, uuid: str) -> GpuInfo | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def device_uuids(self) -> set[str]:
        """Every UUID a job may be placed on: GPUs and their current MIG instances."""
        return {g.uuid for g in self.gpus} | {m.uuid for g in self.gpus for m in g.mig_devices}


@dataclass(frozen=True)
class ProcessUsage:
    pid: int
    used_mib: int | None  # None when the driver cannot attribute memory (WDDM, some containers)


@dataclass
class GpuSample:
    index: int
    uuid: str
    util_pct: int | None = None
    mem_util_pct: int | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    power_w: float | None = None
    temperature_c: int | None = None
    sm_clock_mhz: int | None = None
    ecc_uncorrected_volatile: int | None = None
    xid_events: list[int] = field(default_factory=list)
    processes: list[ProcessUsage] = field(default_factory=list)
    health: str = "ok"  # ok | degraded (ECC/XID seen) | lost (GPU fell off the bus)
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class Sample:
    sampled_at: float  # unix seconds
    gpus: list[GpuSample]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class JobUsageHint:
    """What a running job says about itself; only the simulated backend uses it to synthesise readings."""

    pid: int
    gpu_uuids: tuple[str, ...]
    util_pct: float
    memory_mib: dict[str, int]  # per GPU uuid


@runtime_checkable
class GpuBackend(Protocol):
    name: str

    def inventory(self) -> Inventory: ...

    def sample(self) -> Sample: ...

    def note_jobs(self, jobs: Sequence[JobUsageHint]) -> None: ...

    def close(self) -> None: ...


def cpulist(cpus: Sequence[int]) -> str:
    """Format CPU ids in the Linux cpulist form ("0-15,32-47")."""
    ranges: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        ranges.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(ranges)


def parse_cpulist(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return cpus
