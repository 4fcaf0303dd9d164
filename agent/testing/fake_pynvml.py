"""A fake `pynvml` that answers from a recorded NVML fixture (../shared/fixtures/nvml-h200), so the real NVML
backend code runs without a GPU.

Static facts come from nvml_snapshot.json; live readings step through nvml_trace_under_load.json by a clock
(looping); calls the driver refused when the fixture was recorded ("ERR NVMLError_NotSupported: ...") raise
the same NVMLError subclass the real module raises. Constants and exception classes are the real module's.
Install with `install(fixture_dir)` (puts the module in sys.modules["pynvml"]); drive it through `.control`.
Readings the fixture does not hold (temperature over time, CPU affinity, links between replicated GPUs) are
stated below where they are made up.
"""

from __future__ import annotations

import bisect
import importlib
import json
import os
import re
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ENV_FIXTURE = "TESSERA_FAKE_NVML"
ENV_GPUS = "TESSERA_FAKE_NVML_GPUS"
_MIB = 1024 * 1024
_ERR = re.compile(r"^ERR (NVMLError_\w+)")


def default_fixture_dir() -> Path:
    """The H200 fixture beside the repository (../shared/fixtures/nvml-h200), or $TESSERA_FAKE_NVML."""
    if os.environ.get(ENV_FIXTURE):
        return Path(os.environ[ENV_FIXTURE])
    return Path(__file__).resolve().parents[2] / "../shared/fixtures/nvml-h200"


def _real_pynvml() -> types.ModuleType:
    current = sys.modules.get("pynvml")
    if current is not None and getattr(current, "TESSERA_FAKE", False):
        return current._real
    return importlib.import_module("pynvml")


class FakeControl:
    """Knobs for tests: the trace clock and extra per-process GPU memory attributed to real pids."""

    def __init__(self, trace_end_s: float) -> None:
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._fixed_t: float | None = None
        self._trace_end_s = trace_end_s
        self.extra_processes: dict[int, dict[int, int]] = {}  # gpu index -> pid -> used MiB
        self.pending_xids: list[tuple[int, int]] = []  # (gpu index, xid) waiting in the event set
        self.calls = 0

    def set_time(self, t_s: float | None) -> None:
        """Freeze the trace clock at t_s seconds (None: follow wall time again, looping over the trace)."""
        with self._lock:
            self._fixed_t = t_s

    def advance(self, dt_s: float) -> None:
        with self._lock:
            self._fixed_t = (self._fixed_t or 0.0) + dt_s

    def trace_time(self) -> float:
        with self._lock:
            t = self._fixed_t if self._fixed_t is not None else time.monotonic() - self._start
        return t % self._trace_end_s

    def set_process_memory(self, gpu_index: int, pid: int, used_mib: int | None) -> None:
        """Make NVML report `pid` holding used_mib on the GPU (None removes it)."""
        with self._lock:
            procs = self.extra_processes.setdefault(gpu_index, {})
            if used_mib is None:
                procs.pop(pid, None)
            else:
                procs[pid] = used_mib

    def inject_xid(self, gpu_index: int, xid: int) -> None:
        """Queue an XID critical-error event (the recording saw none; tests make them up)."""
        with self._lock:
            self.pending_xids.append((gpu_index, xid))

    def pop_xid(self) -> tuple[int, int] | None:
        with self._lock:
            return self.pending_xids.pop(0) if self.pending_xids else None

    def processes(self, gpu_index: int) -> dict[int, int]:
        with self._lock:
            return dict(self.extra_processes.get(gpu_index, {}))


class _Device:
    def __init__(self, index: int, facts: dict[str, Any]) -> None:
        self.index = index
        self.facts = facts


def build(
    fixture_dir: str | Path | None = None,
    *,
    gpu_count: int | None = None,
    nvlink_pairs: Iterable[tuple[int, int, int]] = (),
    nvswitch_links: int = 0,
    mig_instances: dict[int, list[int]] | None = None,
) -> types.ModuleType:
    """Build the fake module. gpu_count > recorded devices replicates the recorded GPU (new UUIDs and bus
    ids); nvlink_pairs [(a, b, links)] makes up NVLinks between replicas, nvswitch_links N links from every
    GPU to an NVSwitch (an HGX board), to exercise the topology code. mig_instances {gpu: [memory MiB, ...]}
    turns MIG on for that GPU with those instances (the recording had MIG off)."""
    real = _real_pynvml()
    fixture = Path(fixture_dir) if fixture_dir is not None else default_fixture_dir()
    snapshot = json.loads((fixture / "nvml_snapshot.json").read_text())
    trace = json.loads((fixture / "nvml_trace_under_load.json").read_text())
    affinity = _affinity_from_topo(fixture / "topo.txt")
    recorded = snapshot["devices"]
    count = gpu_count or int(os.environ.get(ENV_GPUS, "0") or 0) or len(recorded)
    devices = []
    for i in range(count):
        facts = json.loads(json.dumps(recorded[i % len(recorded)]))
        if i >= len(recorded):
            # Replica: keep everything but identity, which must stay unique per node.
            facts["uuid"] = facts["uuid"][:-4] + f"{i:04x}"
            facts["serial"] = f"{facts['serial']}-{i}"
            facts["pci"]["busId"] = f"00000000:{0x10 + i:02X}:00.0"
        facts["index"] = i
        device = _Device(i, facts)
        device.mig = []
        for slot, mib in enumerate((mig_instances or {}).get(i, [])):
            facts["mig_mode"] = [1, 1]
            facts["max_mig_devices"] = 7
            mig_facts = {
                "uuid": f"MIG-{facts['uuid'][4:-4]}{i:02x}{slot:02x}",
                "memory_mib": mib,
                "gi": slot + 1,
            }
            device.mig.append(_Device(i, mig_facts))
        devices.append(device)
    links: dict[int, list[int]] = {}
    for a, b, n in nvlink_pairs:
        links.setdefault(a, []).extend([b] * n)
        links.setdefault(b, []).extend([a] * n)
    switch = -1  # a link peer that is no GPU: an NVSwitch
    for i in range(count if nvswitch_links else 0):
        links.setdefault(i, []).extend([switch] * nvswitch_links)

    times = [s["t"] for s in trace]
    # The trace's samples are ~0.1 s apart; it loops after its last one.
    control = FakeControl(trace_end_s=times[-1] + (times[-1] - times[-2]))
    state = {"init": 0}
    mod = types.ModuleType("pynvml")
    mod.TESSERA_FAKE = True
    mod._real = real
    mod.control = control
    mod.fixture_dir = fixture
    for name in dir(real):
        if name.startswith(("NVML_", "NVMLError", "nvmlEventType", "nvmlFlag")) or name in (
            "NVMLError",
            "nvmlExceptionClass",
        ):
            setattr(mod, name, getattr(real, name))
    err_codes = {cls.__name__: code for code, cls in real.NVMLError._valClassMapping.items()}

    def fail(code: int) -> None:
        raise real.NVMLError(code)

    def recorded_value(value: Any) -> Any:
        if isinstance(value, str):
            m = _ERR.match(value)
            if m:
                fail(err_codes.get(m.group(1), real.NVML_ERROR_UNKNOWN))
        return value

    def dev(handle: Any) -> _Device:
        control.calls += 1
        if not state["init"]:
            fail(real.NVML_ERROR_UNINITIALIZED)
        if not isinstance(handle, _Device):
            fail(real.NVML_ERROR_INVALID_ARGUMENT)
        return handle

    def now(handle: Any) -> dict[str, Any]:
        dev(handle)
        i = bisect.bisect_right(times, control.trace_time()) - 1
        return trace[max(i, 0)]

    def api(fn: Callable) -> Callable:
        setattr(mod, fn.__name__, fn)
        return fn

    @api
    def nvmlInit() -> None:
        state["init"] += 1

    @api
    def nvmlInitWithFlags(flags: int) -> None:
        state["init"] += 1

    @api
    def nvmlShutdown() -> None:
        if not state["init"]:
            fail(real.NVML_ERROR_UNINITIALIZED)
        state["init"] -= 1

    @api
    def nvmlSystemGetDriverVersion() -> str:
        return snapshot["driver"]

    @api
    def nvmlSystemGetNVMLVersion() -> str:
        return snapshot["nvml"]

    @api
    def nvmlSystemGetCudaDriverVersion() -> int:
        return int(snapshot["cuda_driver"])

    @api
    def nvmlDeviceGetCount() -> int:
        if not state["init"]:
            fail(real.NVML_ERROR_UNINITIALIZED)
        return len(devices)

    @api
    def nvmlDeviceGetHandleByIndex(index: int) -> _Device:
        if not state["init"]:
            fail(real.NVML_ERROR_UNINITIALIZED)
        if not 0 <= index < len(devices):
            fail(real.NVML_ERROR_INVALID_ARGUMENT)
        return devices[index]

    def fact(name: str) -> Callable:
        def getter(handle: Any) -> Any:
            return recorded_value(dev(handle).facts[name])

        getter.__name__ = name
        return getter

    mod.nvmlDeviceGetName = fact("name")
    mod.nvmlDeviceGetUUID = fact("uuid")
    mod.nvmlDeviceGetSerial = fact("serial")
    mod.nvmlDeviceGetNumaNodeId = fact("numa_node")
    mod.nvmlDeviceGetComputeMode = fact("compute_mode")
    mod.nvmlDeviceGetPersistenceMode = fact("persistence_mode")
    mod.nvmlDeviceGetMaxMigDeviceCount = fact("max_mig_devices")
    mod.nvmlDeviceGetEnforcedPowerLimit = fact("power_limit_mw")
    mod.nvmlDeviceGetPowerManagementLimit = fact("power_limit_mw")

    @api
    def nvmlDeviceGetMigDeviceHandleByIndex(device: Any, index: int) -> _Device:
        d = dev(device)
        if index >= len(getattr(d, "mig", [])):
            fail(real.NVML_ERROR_NOT_FOUND)
        return d.mig[index]

    @api
    def nvmlDeviceGetGpuInstanceId(device: Any) -> int:
        return int(dev(device).facts["gi"])

    @api
    def nvmlDeviceGetComputeInstanceId(device: Any) -> int:
        dev(device)
        return 0

    @api
    def nvmlDeviceGetCudaComputeCapability(handle: Any) -> tuple[int, int]:
        major, minor = recorded_value(dev(handle).facts["cuda_cc"])
        return (major, minor)

    @api
    def nvmlDeviceGetMigMode(handle: Any) -> list[int]:
        return list(recorded_value(dev(handle).facts["mig_mode"]))

    @api
    def nvmlDeviceGetEccMode(handle: Any) -> list[int]:
        return list(recorded_value(dev(handle).facts["ecc_mode"]))

    @api
    def nvmlDeviceGetPciInfo(handle: Any) -> types.SimpleNamespace:
        return types.SimpleNamespace(**recorded_value(dev(handle).facts["pci"]))

    @api
    def nvmlDeviceGetGpuInstanceProfileInfo(handle: Any, profile: int, version: int = 2) -> Any:
        profiles = dev(handle).facts.get("gpu_instance_profiles", {})
        # A profile index absent from the recording did not exist for the recording module: NotSupported.
        info = recorded_value(profiles.get(str(profile), "ERR NVMLError_NotSupported: not recorded"))
        ns = types.SimpleNamespace(**info)
        ns.name = info["name"].encode()  # the real v2 struct holds a c_char array
        return ns

    @api
    def nvmlDeviceGetCpuAffinity(handle: Any, cpuSetSize: int) -> list[int]:
        dev(handle)
        # The snapshot stored only the ctypes repr; the mask is rebuilt from topo.txt's "CPU Affinity".
        words = [0] * cpuSetSize
        for cpu in affinity:
            if cpu // 64 < cpuSetSize:
                words[cpu // 64] |= 1 << (cpu % 64)
        return words

    @api
    def nvmlDeviceGetNvLinkState(handle: Any, link: int) -> int:
        d = dev(handle)
        peers = links.get(d.index)
        if peers is None:
            recorded = d.facts.get("nvlink_state", [])
            return recorded_value(
                recorded[link] if link < len(recorded) else "ERR NVMLError_InvalidArgument: x"
            )
        return real.NVML_FEATURE_ENABLED if link < len(peers) else real.NVML_FEATURE_DISABLED

    @api
    def nvmlDeviceGetNvLinkRemotePciInfo(handle: Any, link: int) -> types.SimpleNamespace:
        d = dev(handle)
        peers = links.get(d.index, [])
        if link >= len(peers):
            fail(real.NVML_ERROR_NOT_SUPPORTED)
        peer = peers[link]
        return types.SimpleNamespace(
            busId="00000000:FF:00.0" if peer == switch else devices[peer].facts["pci"]["busId"]
        )

    @api
    def nvmlDeviceGetTopologyCommonAncestor(device1: Any, device2: Any) -> int:
        a, b = dev(device1), dev(device2)
        # Not recorded (one GPU); made up only for replicas that were given NVLinks.
        if b.index in links.get(a.index, []) or switch in links.get(a.index, []):
            return real.NVML_TOPOLOGY_NODE
        fail(real.NVML_ERROR_NOT_SUPPORTED)

    @api
    def nvmlDeviceGetP2PStatus(device1: Any, device2: Any, p2pIndex: int) -> int:
        a, b = dev(device1), dev(device2)
        if b.index in links.get(a.index, []) or switch in links.get(a.index, []):
            return real.NVML_P2P_STATUS_OK
        fail(real.NVML_ERROR_NOT_SUPPORTED)

    @api
    def nvmlDeviceGetMemoryInfo(handle: Any, version: Any = None) -> types.SimpleNamespace:
        d = dev(handle)
        if "gi" in d.facts:  # a MIG instance: its own memory, idle
            total = d.facts["memory_mib"] * _MIB
            return types.SimpleNamespace(total=total, used=0, free=total)
        total = int(d.facts["memory"]["total"])
        used = (now(handle)["mem_used_mib"] + sum(control.processes(d.index).values())) * _MIB
        return types.SimpleNamespace(total=total, used=used, free=max(total - used, 0))

    @api
    def nvmlDeviceGetUtilizationRates(handle: Any) -> types.SimpleNamespace:
        s = now(handle)
        return types.SimpleNamespace(gpu=s["gpu_util"], memory=s["mem_util"])

    @api
    def nvmlDeviceGetComputeRunningProcesses(handle: Any) -> list[types.SimpleNamespace]:
        d = dev(handle)
        procs = {p["pid"]: p["used_mib"] for p in now(handle)["processes"]}
        procs.update(control.processes(d.index))
        return [
            types.SimpleNamespace(
                pid=pid, usedGpuMemory=mib * _MIB, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF
            )
            for pid, mib in procs.items()
        ]

    @api
    def nvmlDeviceGetPowerUsage(handle: Any) -> int:
        return int(now(handle)["power_mw"])

    @api
    def nvmlDeviceGetTemperature(handle: Any, sensor: int) -> int:
        # The trace holds no temperature; the snapshot's reading stands for the whole run.
        return int(recorded_value(dev(handle).facts["temperature_c"]))

    @api
    def nvmlDeviceGetClockInfo(handle: Any, type: int) -> int:
        if type != real.NVML_CLOCK_SM:
            fail(real.NVML_ERROR_NOT_SUPPORTED)
        return int(now(handle)["sm_clock_mhz"])

    @api
    def nvmlDeviceGetMaxClockInfo(handle: Any, type: int) -> int:
        if type != real.NVML_CLOCK_SM:
            fail(real.NVML_ERROR_NOT_SUPPORTED)
        return int(recorded_value(dev(handle).facts["max_sm_clock_mhz"]))

    @api
    def nvmlDeviceGetTotalEccErrors(handle: Any, errorType: int, counterType: int) -> int:
        d = dev(handle)
        if not recorded_value(d.facts["ecc_mode"])[0]:
            fail(real.NVML_ERROR_NOT_SUPPORTED)
        return int(d.facts.get("xid_ecc_dbe", 0))

    @api
    def nvmlEventSetCreate() -> object:
        return object()

    @api
    def nvmlDeviceRegisterEvents(handle: Any, eventTypes: int, eventSet: object) -> None:
        dev(handle)

    @api
    def nvmlEventSetWait(eventSet: object, timeoutms: int) -> types.SimpleNamespace:
        event = control.pop_xid()
        if event is None:
            fail(real.NVML_ERROR_TIMEOUT)  # nothing pending (the recording saw no XID events)
        gpu_index, xid = event
        return types.SimpleNamespace(
            device=devices[gpu_index],
            eventType=real.nvmlEventTypeXidCriticalError,
            eventData=xid,
            gpuInstanceId=0,
            computeInstanceId=0,
        )

    mod.nvmlEventSetWait_v2 = nvmlEventSetWait

    @api
    def nvmlEventSetFree(eventSet: object) -> None:
        return None

    def __getattr__(name: str) -> Any:
        if name.startswith("nvml"):
            # Like a driver without the symbol: the real module raises FunctionNotFound for these.
            def missing(*args: Any, **kwargs: Any) -> None:
                fail(real.NVML_ERROR_FUNCTION_NOT_FOUND)

            return missing
        raise AttributeError(name)

    mod.__getattr__ = __getattr__
    return mod


def install(fixture_dir: str | Path | None = None, **kwargs: Any) -> types.ModuleType:
    """Build the fake and put it in sys.modules["pynvml"]; returns it (its `.control` drives it)."""
    mod = build(fixture_dir, **kwargs)
    sys.modules["pynvml"] = mod
    return mod


def uninstall() -> None:
    current = sys.modules.get("pynvml")
    if current is not None and getattr(current, "TESSERA_FAKE", False):
        sys.modules["pynvml"] = current._real


def _affinity_from_topo(path: Path) -> list[int]:
    """CPU ids from the 'CPU Affinity' column of `nvidia-smi topo -m` (the GPU0 row)."""
    from agent.backends.base import parse_cpulist

    try:
        for line in path.read_text().splitlines():
            if line.startswith("GPU0"):
                cols = line.split("\t")
                return parse_cpulist(cols[2].strip())
    except (OSError, IndexError, ValueError):
        pass
    return []
