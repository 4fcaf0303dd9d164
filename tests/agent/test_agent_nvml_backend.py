"""The NVML backend, real code on a fake pynvml that answers from the recorded H200."""

from __future__ import annotations

import json
import sys

import pytest

from agent.backends.nvml import NvmlBackend
from agent.testing import fake_pynvml

MIB = 1024 * 1024


def _snapshot(d):
    return json.loads((d / "nvml_snapshot.json").read_text())["devices"][0]


def _trace(d):
    return json.loads((d / "nvml_trace_under_load.json").read_text())


def test_inventory_reports_the_recorded_h200(fake_nvml, h200_dir):
    snap = _snapshot(h200_dir)
    inv = NvmlBackend().inventory()
    assert len(inv.gpus) == 1
    gpu = inv.gpus[0]
    assert gpu.name == snap["name"]
    assert gpu.uuid == snap["uuid"]
    assert gpu.memory_total_mib == snap["memory"]["total"] // MIB == 143771
    assert gpu.compute_capability == "{}.{}".format(*snap["cuda_cc"])
    assert gpu.mig_mode_current is False and gpu.mig_mode_pending is False
    assert gpu.pci_bus_id == snap["pci"]["busId"]
    assert gpu.ecc_enabled is True
    assert gpu.power_limit_w == snap["power_limit_mw"] / 1000
    assert gpu.cpu_affinity == "0-15"  # topo.txt
    assert inv.driver_version == "580.159.04"
    assert inv.cuda_driver_version == "13.0"


def test_inventory_lists_exactly_the_mig_profiles_the_driver_answered(fake_nvml, h200_dir):
    recorded = {
        (p["id"], p["name"], p["memorySizeMB"], p["sliceCount"])
        for p in _snapshot(h200_dir)["gpu_instance_profiles"].values()
        if isinstance(p, dict)
    }
    gpu = NvmlBackend().inventory().gpus[0]
    got = {(p.profile_id, p.name, p.memory_mib, p.slice_count) for p in gpu.mig_profiles}
    assert got == recorded
    assert {p.name for p in gpu.mig_profiles} >= {"MIG 1g.18gb", "MIG 3g.71gb", "MIG 7g.141gb"}


def test_not_supported_queries_become_none_and_are_named(fake_nvml):
    inv = NvmlBackend().inventory()
    gpu = inv.gpus[0]
    assert gpu.numa_node is None  # driver: NotSupported, and no sysfs entry for the recorded bus id
    assert gpu.unsupported["numa_node"] == "NVMLError_NotSupported"
    assert gpu.unsupported["nvlink"] == "NVMLError_NotSupported"
    assert inv.links == []


def test_a_refused_sample_field_is_none_and_the_rest_is_read(fake_nvml):
    def refuse(handle):
        raise fake_nvml.NVMLError(fake_nvml.NVML_ERROR_NOT_SUPPORTED)

    fake_nvml.nvmlDeviceGetPowerUsage = refuse
    fake_nvml.control.set_time(9.0)
    s = NvmlBackend().sample().gpus[0]
    assert s.power_w is None
    assert s.errors == {"power": "NVMLError_NotSupported"}
    assert s.util_pct == 99 and s.memory_used_mib == 21977


@pytest.mark.parametrize("t", [0.0, 6.2, 8.2, 11.2, 13.95])
def test_samples_follow_the_recorded_trace(fake_nvml, h200_dir, t):
    trace = _trace(h200_dir)
    expected = max((s for s in trace if s["t"] <= t), key=lambda s: s["t"])
    fake_nvml.control.set_time(t)
    s = NvmlBackend().sample().gpus[0]
    assert s.util_pct == expected["gpu_util"]
    assert s.mem_util_pct == expected["mem_util"]
    assert s.memory_used_mib == expected["mem_used_mib"]
    assert s.power_w == expected["power_mw"] / 1000
    assert s.sm_clock_mhz == expected["sm_clock_mhz"]
    assert [(p.pid, p.used_mib) for p in s.processes] == [
        (p["pid"], p["used_mib"]) for p in expected["processes"]
    ]
    assert s.temperature_c == 32 and s.ecc_uncorrected_volatile == 0 and s.health == "ok"


def test_the_load_phase_shows_in_successive_samples(fake_nvml):
    backend = NvmlBackend()
    readings = []
    for t in range(14):
        fake_nvml.control.set_time(float(t))
        readings.append(backend.sample().gpus[0])
    assert readings[0].util_pct == 0 and readings[0].processes == []
    assert max(r.util_pct for r in readings) >= 99
    assert any(r.processes and r.processes[0].used_mib > 20000 for r in readings)


def test_replicated_gpus_keep_unique_uuids_and_nvlinks_are_counted(h200_dir, monkeypatch):
    mod = fake_pynvml.build(h200_dir, gpu_count=4, nvlink_pairs=[(0, 1, 4), (2, 3, 2)])
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    inv = NvmlBackend().inventory()
    assert len({g.uuid for g in inv.gpus}) == 4
    links = {
        (inv.gpus.index(inv.gpu_by_uuid(link.gpu_a)), inv.gpus.index(inv.gpu_by_uuid(link.gpu_b))): link
        for link in inv.links
    }
    assert links[(0, 1)].nvlink_count == 4 and links[(0, 1)].path == "NV4" and links[(0, 1)].p2p_supported
    assert links[(2, 3)].path == "NV2"
    assert links[(0, 2)].nvlink_count == 0 and links[(0, 2)].path is None


def test_calls_before_init_fail_like_the_real_library(fake_nvml):
    with pytest.raises(fake_nvml.NVMLError_Uninitialized):
        fake_nvml.nvmlDeviceGetCount()
    with pytest.raises(fake_nvml.NVMLError_FunctionNotFound):
        fake_nvml.nvmlDeviceGetSomethingNew(None)


def test_xid_events_mark_the_gpu_degraded_for_that_sample(fake_nvml):
    backend = NvmlBackend()
    fake_nvml.control.set_time(0.0)
    fake_nvml.control.inject_xid(0, 79)
    first = backend.sample().gpus[0]
    assert first.xid_events == [79] and first.health == "degraded"
    assert backend.sample().gpus[0].xid_events == []


def test_a_gpu_that_fell_off_the_bus_reads_as_lost(fake_nvml):
    def lost(*args):
        raise fake_nvml.NVMLError(fake_nvml.NVML_ERROR_GPU_IS_LOST)

    backend = NvmlBackend()
    fake_nvml.nvmlDeviceGetUtilizationRates = lost
    fake_nvml.nvmlDeviceGetMemoryInfo = lost
    s = backend.sample().gpus[0]
    assert s.health == "lost" and s.util_pct is None and s.memory_used_mib is None
    assert s.memory_total_mib == 143771  # known from the inventory


def test_gpus_behind_an_nvswitch_are_all_linked_to_each_other(h200_dir, monkeypatch):
    mod = fake_pynvml.build(h200_dir, gpu_count=4, nvswitch_links=18)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    inv = NvmlBackend().inventory()
    assert len(inv.links) == 6
    assert {(link.nvlink_count, link.path, link.p2p_supported) for link in inv.links} == {(18, "NV18", True)}


def test_mig_instances_of_a_mig_enabled_gpu_are_listed_and_placeable(h200_dir, monkeypatch, tmp_path):
    from agent.executor import Executor
    from agent.runtime import Agent

    mod = fake_pynvml.build(h200_dir, gpu_count=2, mig_instances={1: [16384, 33280]})
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    inv = NvmlBackend().inventory()
    assert inv.gpus[0].mig_mode_current is False and inv.gpus[0].mig_devices == []
    gpu = inv.gpus[1]
    assert gpu.mig_mode_current is True and gpu.sharing_mode == "mig"
    assert [(m.memory_mib, m.gpu_instance_id) for m in gpu.mig_devices] == [(16384, 1), (33280, 2)]
    assert all(m.uuid.startswith("MIG-") for m in gpu.mig_devices)
    agent = Agent(node_name="n", backend=NvmlBackend(), executor=Executor(tmp_path))
    assert gpu.mig_devices[0].uuid in agent.reconciler.known_gpu_uuids
