"""GPU backend on NVML through nvidia-ml-py (`pynvml`): inventory once, then cheap per-second samples.

Every field is queried on its own: a query the driver refuses (NotSupported on a one-GPU VM, NoPermission in
a container) leaves that field None and is listed in `unsupported`/`errors`, it never fails the whole reading.
`pynvml` is imported when the backend is built, so a fake module placed in sys.modules runs under this code.
"""

from __future__ import annotations

import importlib
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent.backends.base import (
    GpuInfo,
    GpuLink,
    GpuSample,
    Inventory,
    JobUsageHint,
    MigDevice,
    MigProfile,
    ProcessUsage,
    Sample,
    cpulist,
)

_MIB = 1024 * 1024

# nvmlDeviceGetTopologyCommonAncestor levels, named as `nvidia-smi topo -m` names them.
_TOPOLOGY_NAMES = {0: "SAME_BOARD", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    name = "nvml"

    def __init__(
        self,
        *,
        sharing_mode: str = "exclusive",
        sharing_overrides: dict[int, str] | None = None,
        sysfs_root: str | Path = "/sys",
        watch_xid: bool = True,
    ) -> None:
        self.nvml = importlib.import_module("pynvml")
        self.nvml.nvmlInit()
        self._sharing_mode = sharing_mode
        self._sharing_overrides = dict(sharing_overrides or {})
        self._sysfs_root = Path(sysfs_root)
        self._handles = [
            self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.nvml.nvmlDeviceGetCount())
        ]
        self._uuids = [_text(self.nvml.nvmlDeviceGetUUID(h)) for h in self._handles]
        self._totals_mib: list[int | None] = [self._total_mib(h) for h in self._handles]
        self._event_set = self._register_xid_events() if watch_xid else None
        self._closed = False

    # -- helpers -------------------------------------------------------------------------------------------
    def _total_mib(self, handle: Any) -> int | None:
        # Kept so a GPU whose memory query starts failing (fell off the bus) still reports its size.
        try:
            return int(self.nvml.nvmlDeviceGetMemoryInfo(handle).total // _MIB)
        except self.nvml.NVMLError:
            return None

    def _err_name(self, exc: Exception) -> str:
        return type(exc).__name__

    def _try(self, errors: dict[str, str], key: str, fn: Callable[[], Any]) -> Any:
        """Run one NVML query; a refusal becomes None plus a note, so one field never sinks the rest."""
        try:
            return fn()
        except self.nvml.NVMLError as exc:
            errors[key] = self._err_name(exc)
            return None

    def _register_xid_events(self) -> Any:
        nv = self.nvml
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            return None
        registered = 0
        for handle in self._handles:
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
                registered += 1
            except nv.NVMLError:
                pass  # XID events are not offered on this GPU (vGPU, some MIG setups)
        return event_set if registered else None

    # -- inventory -------------------------------------------------------------------------------------------
    def inventory(self) -> Inventory:
        nv = self.nvml
        top: dict[str, str] = {}
        gpus = [self._gpu_info(i, h) for i, h in enumerate(self._handles)]
        cuda = self._try(top, "cuda_driver_version", nv.nvmlSystemGetCudaDriverVersion)
        return Inventory(
            backend=self.name,
            gpus=gpus,
            links=self._links(gpus),
            driver_version=_opt_text(self._try(top, "driver_version", nv.nvmlSystemGetDriverVersion)),
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
            nvml_version=_opt_text(self._try(top, "nvml_version", nv.nvmlSystemGetNVMLVersion)),
        )

    def _gpu_info(self, index: int, h: Any) -> GpuInfo:
        nv = self.nvml
        err: dict[str, str] = {}
        mem = self._try(err, "memory", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        total_mib = int(mem.total // _MIB) if mem is not None else 0
        self._totals_mib[index] = total_mib or None
        cc = self._try(err, "compute_capability", lambda: nv.nvmlDeviceGetCudaComputeCapability(h))
        pci = self._try(err, "pci", lambda: nv.nvmlDeviceGetPciInfo(h))
        bus_id = _text(pci.busId) if pci is not None else None
        mig = self._try(err, "mig_mode", lambda: nv.nvmlDeviceGetMigMode(h))
        limit_mw = self._try(err, "power_limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
        ecc = self._try(err, "ecc_mode", lambda: nv.nvmlDeviceGetEccMode(h))
        numa = self._try(err, "numa_node", lambda: nv.nvmlDeviceGetNumaNodeId(h))
        if numa is None and bus_id:
            numa = self._sysfs_numa(bus_id)
        mig_current = bool(mig[0] == nv.NVML_DEVICE_MIG_ENABLE) if mig is not None else None
        sharing = self._sharing_overrides.get(index, "mig" if mig_current else self._sharing_mode)
        return GpuInfo(
            index=index,
            uuid=self._uuids[index],
            name=_text(self._try(err, "name", lambda: nv.nvmlDeviceGetName(h)) or "unknown"),
            memory_total_mib=total_mib,
            compute_capability=f"{cc[0]}.{cc[1]}" if cc is not None else None,
            pci_bus_id=bus_id,
            numa_node=numa if numa is None or numa >= 0 else None,
            cpu_affinity=self._cpu_affinity(err, h),
            mig_mode_current=mig_current,
            mig_mode_pending=bool(mig[1] == nv.NVML_DEVICE_MIG_ENABLE) if mig is not None else None,
            mig_profiles=self._mig_profiles(h),
            mig_devices=self._mig_devices(h) if mig_current else [],
            power_limit_w=limit_mw / 1000 if limit_mw is not None else None,
            ecc_enabled=bool(ecc[0]) if ecc is not None else None,
            compute_mode=self._try(err, "compute_mode", lambda: nv.nvmlDeviceGetComputeMode(h)),
            sharing_mode=sharing,
            unsupported=err,
        )

    def _cpu_affinity(self, err: dict[str, str], h: Any) -> str | None:
        words = max(1, math.ceil((os.cpu_count() or 1) / 64))
        mask = self._try(err, "cpu_affinity", lambda: self.nvml.nvmlDeviceGetCpuAffinity(h, words))
        if mask is None:
            return None
        cpus = [w * 64 + bit for w in range(len(mask)) for bit in range(64) if (int(mask[w]) >> bit) & 1]
        return cpulist(cpus) or None

    def _sysfs_numa(self, bus_id: str) -> int | None:
        # NVML reports the PCI domain with 8 hex digits, sysfs with 4.
        domain, rest = bus_id.split(":", 1)
        path = self._sysfs_root / "bus/pci/devices" / f"{int(domain, 16):04x}:{rest}".lower() / "numa_node"
        try:
            value = int(path.read_text().strip())
        except (OSError, ValueError):
            return None
        return value if value >= 0 else None

    def _mig_profiles(self, h: Any) -> list[MigProfile]:
        nv = self.nvml
        profiles: list[MigProfile] = []
        count = getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 15)
        for profile in range(count):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, profile)
            except nv.NVMLError:
                continue  # this profile does not exist on this GPU (or no MIG at all)
            profiles.append(
                MigProfile(
                    profile_id=int(info.id),
                    name=_text(info.name),
                    slice_count=int(info.sliceCount),
                    instance_count=int(info.instanceCount),
                    multiprocessor_count=int(info.multiprocessorCount),
                    memory_mib=int(info.memorySizeMB),
                )
            )
        return profiles

    def _mig_devices(self, h: Any) -> list[MigDevice]:
        nv = self.nvml
        try:
            count = nv.nvmlDeviceGetMaxMigDeviceCount(h)
        except nv.NVMLError:
            return []
        devices = []
        for i in range(count):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except nv.NVMLError:
                continue  # no instance in this slot
            err: dict[str, str] = {}
            mem = self._try(err, "memory", lambda m=mig: nv.nvmlDeviceGetMemoryInfo(m))
            devices.append(
                MigDevice(
                    uuid=_text(nv.nvmlDeviceGetUUID(mig)),
                    memory_mib=int(mem.total // _MIB) if mem is not None else 0,
                    gpu_instance_id=self._try(err, "gi", lambda m=mig: nv.nvmlDeviceGetGpuInstanceId(m)),
                    compute_instance_id=self._try(
                        err, "ci", lambda m=mig: nv.nvmlDeviceGetComputeInstanceId(m)
                    ),
                )
            )
        return devices

    def _links(self, gpus: list[GpuInfo]) -> list[GpuLink]:
        nv = self.nvml
        by_bus = {g.pci_bus_id.lower(): g.uuid for g in gpus if g.pci_bus_id}
        nvlinks: dict[tuple[str, str], int] = {}
        switch_links: dict[int, int] = {}
        for i, h in enumerate(self._handles):
            refusals: set[str] = set()
            answered = False
            for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    active = nv.nvmlDeviceGetNvLinkState(h, link) == nv.NVML_FEATURE_ENABLED
                    answered = True
                    peer_bus = (
                        _text(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).lower() if active else ""
                    )
                except nv.NVMLError as exc:
                    refusals.add(self._err_name(exc))
                    continue
                peer = by_bus.get(peer_bus)
                if peer and peer != self._uuids[i]:
                    pair = tuple(sorted((self._uuids[i], peer)))
                    nvlinks[pair] = nvlinks.get(pair, 0) + 1  # each end counts the link once
                elif active and peer_bus:
                    # The far end is no GPU of this host: an NVSwitch (HGX boards), reaching every GPU.
                    switch_links[i] = switch_links.get(i, 0) + 1
            if not answered and refusals:
                # No link answered at all: say why once for the GPU (NotSupported on PCIe-only machines).
                preferred = "NVMLError_NotSupported"
                gpus[i].unsupported["nvlink"] = preferred if preferred in refusals else sorted(refusals)[0]
        links: list[GpuLink] = []
        for a in range(len(self._handles)):
            for b in range(a + 1, len(self._handles)):
                ua, ub = self._uuids[a], self._uuids[b]
                count = nvlinks.get(tuple(sorted((ua, ub))), 0) // 2
                if not count and switch_links.get(a) and switch_links.get(b):
                    count = min(switch_links[a], switch_links[b])
                err: dict[str, str] = {}
                level = self._try(
                    err,
                    "topology",
                    lambda a=a, b=b: nv.nvmlDeviceGetTopologyCommonAncestor(
                        self._handles[a], self._handles[b]
                    ),
                )
                p2p = self._try(
                    err,
                    "p2p",
                    lambda a=a, b=b: nv.nvmlDeviceGetP2PStatus(
                        self._handles[a], self._handles[b], nv.NVML_P2P_CAPS_INDEX_READ
                    ),
                )
                path = f"NV{count}" if count else _TOPOLOGY_NAMES.get(level) if level is not None else None
                links.append(
                    GpuLink(
                        gpu_a=ua,
                        gpu_b=ub,
                        nvlink_count=count,
                        path=path,
                        p2p_supported=(p2p == nv.NVML_P2P_STATUS_OK) if p2p is not None else None,
                    )
                )
        return links

    # -- sampling --------------------------------------------------------------------------------------------
    def sample(self) -> Sample:
        xids = self._drain_xid_events()
        gpus = [self._sample_gpu(i, h, xids.get(i, [])) for i, h in enumerate(self._handles)]
        return Sample(sampled_at=time.time(), gpus=gpus)

    def _drain_xid_events(self) -> dict[int, list[int]]:
        nv = self.nvml
        found: dict[int, list[int]] = {}
        if self._event_set is None:
            return found
        for _ in range(64):  # bounded: a storm of events must not stall the sampling loop
            try:
                data = nv.nvmlEventSetWait(self._event_set, 0)
            except nv.NVMLError:
                break  # Timeout: nothing pending
            try:
                uuid = _text(nv.nvmlDeviceGetUUID(data.device))
                index = self._uuids.index(uuid)
            except (nv.NVMLError, ValueError):
                continue
            found.setdefault(index, []).append(int(data.eventData))
        return found

    def _sample_gpu(self, index: int, h: Any, xids: list[int]) -> GpuSample:
        nv = self.nvml
        err: dict[str, str] = {}
        util = self._try(err, "utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        mem = self._try(err, "memory", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        procs = self._try(err, "processes", lambda: nv.nvmlDeviceGetComputeRunningProcesses(h))
        power = self._try(err, "power", lambda: nv.nvmlDeviceGetPowerUsage(h))
        temp = self._try(err, "temperature", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        clock = self._try(err, "sm_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        ecc = self._try(
            err,
            "ecc_uncorrected",
            lambda: nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
            ),
        )
        lost = any(name in ("NVMLError_GpuIsLost", "NVMLError_Unknown") for name in err.values())
        health = "lost" if lost else "degraded" if (xids or (ecc or 0) > 0) else "ok"
        return GpuSample(
            index=index,
            uuid=self._uuids[index],
            util_pct=int(util.gpu) if util is not None else None,
            mem_util_pct=int(util.memory) if util is not None else None,
            memory_used_mib=int(mem.used // _MIB) if mem is not None else None,
            memory_total_mib=int(mem.total // _MIB) if mem is not None else self._totals_mib[index],
            power_w=power / 1000 if power is not None else None,
            temperature_c=temp,
            sm_clock_mhz=clock,
            ecc_uncorrected_volatile=ecc,
            xid_events=xids,
            processes=[
                ProcessUsage(
                    pid=int(p.pid),
                    used_mib=int(p.usedGpuMemory // _MIB) if p.usedGpuMemory is not None else None,
                )
                for p in procs or []
            ],
            health=health,
            errors=err,
        )

    def note_jobs(self, jobs: Sequence[JobUsageHint]) -> None:
        """NVML reads the truth from the driver; what jobs claim about themselves is not needed."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._event_set is not None:
            try:
                self.nvml.nvmlEventSetFree(self._event_set)
            except self.nvml.NVMLError:
                pass
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


def _opt_text(value: Any) -> str | None:
    return None if value is None else _text(value)
