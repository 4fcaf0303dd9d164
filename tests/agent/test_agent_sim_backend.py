"""The simulated backend: GPUs from YAML, readings from the jobs the agent runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent.backends import make_backend
from agent.backends.sim import SimBackend
from agent.executor import Executor
from agent.runtime import Agent

EXAMPLE = Path(__file__).resolve().parents[2] / "agent/examples/sim-node.yaml"


def test_the_example_node_has_its_gpus_links_and_numa_nodes():
    inv = make_backend("sim", sim_config=EXAMPLE).inventory()
    assert [g.name for g in inv.gpus] == ["NVIDIA A100-SXM4-80GB"] * 4 + ["NVIDIA L4"] * 2
    assert [g.sharing_mode for g in inv.gpus][-2:] == ["mps", "mps"]
    assert len({g.uuid for g in inv.gpus}) == 6
    paths = {
        (inv.gpus.index(inv.gpu_by_uuid(x.gpu_a)), inv.gpus.index(inv.gpu_by_uuid(x.gpu_b))): x.path
        for x in inv.links
    }
    assert paths[(0, 3)] == "NV12" and paths[(4, 5)] == "NODE" and paths[(0, 4)] == "SYS"
    # UUIDs are stable across restarts of the same node
    assert make_backend("sim", sim_config=EXAMPLE).inventory().gpus[0].uuid == inv.gpus[0].uuid


def test_an_unknown_sharing_mode_or_no_gpus_is_refused():
    with pytest.raises(ValueError):
        SimBackend({"gpus": [{"memory_mib": 1, "sharing": "shared"}]})
    with pytest.raises(ValueError):
        SimBackend({"gpus": []})


def test_readings_come_from_the_jobs_the_agent_runs(tmp_path):
    backend = SimBackend({"node": "s", "gpus": [{"model": "Sim", "count": 2, "memory_mib": 40960}]})
    agent = Agent(node_name="s", backend=backend, executor=Executor(tmp_path))
    g0, g1 = agent.inventory.gpus
    job = {
        "job_id": "load",
        "attempt": 1,
        "command": [sys.executable, "-c", "import time; time.sleep(60)"],
        "env": {"TESSERA_SIM_UTIL_PCT": "70", "TESSERA_SIM_MEMORY_MIB": "12000"},
        "gpus": [{"uuid": g0.uuid, "index": 0, "sharing": "exclusive"}],
    }
    agent.apply_desired({"version": 1, "jobs": [job]})
    agent.tick()  # starts the job and tells the backend
    s = backend.sample()
    pid = agent.executor.handle("load:1").job_pid
    assert (s.gpus[0].util_pct, s.gpus[0].memory_used_mib) == (70, 12000)
    assert [(p.pid, p.used_mib) for p in s.gpus[0].processes] == [(pid, 12000)]
    assert s.gpus[1].util_pct == 0 and s.gpus[1].processes == []
    assert s.gpus[0].power_w > s.gpus[1].power_w
    agent.apply_desired({"version": 2, "jobs": []})
    agent.tick()
    agent.executor.wait("load:1", 10)
    agent.tick()
    assert backend.sample().gpus[0].util_pct == 0
