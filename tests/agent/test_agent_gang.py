"""A gang member's environment and hostfile: what torchrun, DeepSpeed and MPI read, written by the executor."""

from __future__ import annotations

import argparse
import json
import os

import pytest
from agent_test_helpers import py

from agent.backends.sim import SimBackend
from agent.config import ConfigError, add_arguments, load_config
from agent.executor import Executor
from agent.jobspec import Gang, GangMember, GpuSlice, JobSpec
from agent.reconcile import DesiredState
from agent.runtime import Agent

GANG_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "NODE_RANK",
    "LOCAL_WORLD_SIZE",
    "TESSERA_NUM_NODES",
    "TESSERA_NODELIST",
    "TESSERA_HOSTFILE",
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_NPROC_PER_NODE",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)
PRINT_VARS = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {GANG_VARS!r}}}))"
PRINT_GANG = PRINT_VARS + "; print(open(os.environ['TESSERA_HOSTFILE']).read(), end='')"

THREE_NODES = Gang(
    rank=1,
    master_port=29517,
    members=(
        GangMember(node="gpu-01", address="10.0.0.1", slots=4),
        GangMember(node="gpu-02", address="10.0.0.2", slots=4),
        GangMember(node="gpu-03", address="gpu-03.lab", slots=4),
    ),
)
GPUS = tuple(GpuSlice(uuid=f"GPU-{i}", index=i) for i in range(4))


def test_a_gang_member_gets_the_rendezvous_variables_and_a_hostfile_in_its_directory(tmp_path):
    ex = Executor(tmp_path, base_env={"PATH": os.environ["PATH"], "MASTER_PORT": "1", "WORLD_SIZE": "99"})
    spec = JobSpec(
        job_id="7",
        attempt=2,
        command=py(PRINT_GANG),
        gpus=GPUS,
        env={"NODE_RANK": "5"},  # the placement's values win over the agent's and the job's
        gang=THREE_NODES,
    )
    done = ex.wait(ex.start(spec).key, 10)
    assert done.outcome == "exited" and done.exit_code == 0
    out = ex.tail_log(done.key, "stdout", lines=10)
    env = json.loads(out[0])
    hostfile = ex.job_dir(spec) / "hostfile"
    assert env == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29517",
        "WORLD_SIZE": "12",  # processes: 3 nodes x 4 GPUs, as torchrun counts them
        "NODE_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "TESSERA_NUM_NODES": "3",
        "TESSERA_NODELIST": "gpu-01,gpu-02,gpu-03",
        "TESSERA_HOSTFILE": str(hostfile),
        "PET_NNODES": "3",
        "PET_NODE_RANK": "1",
        "PET_NPROC_PER_NODE": "4",
        "PET_MASTER_ADDR": "10.0.0.1",
        "PET_MASTER_PORT": "29517",
    }
    assert out[1:] == ["10.0.0.1 slots=4", "10.0.0.2 slots=4", "gpu-03.lab slots=4"]
    assert hostfile.read_text() == "10.0.0.1 slots=4\n10.0.0.2 slots=4\ngpu-03.lab slots=4\n"


def test_a_job_of_one_node_gets_no_gang_variables_and_no_hostfile(tmp_path):
    ex = Executor(tmp_path, base_env={"PATH": os.environ["PATH"]})
    spec = JobSpec(job_id="8", attempt=1, command=py(PRINT_VARS))
    done = ex.wait(ex.start(spec).key, 10)
    assert done.exit_code == 0
    assert set(json.loads(ex.tail_log(done.key, "stdout")[0]).values()) == {None}
    assert not (ex.job_dir(spec) / "hostfile").exists()


def test_the_gang_survives_the_desired_state_round_trip_and_a_restart_re_reads_it(tmp_path):
    payload = {
        "version": 3,
        "jobs": [
            {
                "job_id": "7",
                "attempt": 1,
                "command": ["sleep", "0"],
                "gang": {
                    "rank": 1,
                    "master_port": 29517,
                    "members": [
                        {"node": "gpu-01", "address": "10.0.0.1", "slots": 4},
                        {"node": "gpu-02", "address": "10.0.0.2", "slots": 4},
                        {"node": "gpu-03", "address": "gpu-03.lab", "slots": 4},
                    ],
                },
            }
        ],
    }
    desired = DesiredState.from_payload(payload)
    assert desired.jobs[0].gang == THREE_NODES
    assert DesiredState.from_payload(json.loads(json.dumps(desired.to_payload()))) == desired
    assert "gang" not in JobSpec(job_id="1", attempt=1, command="true").to_dict()


@pytest.mark.parametrize(
    "gang, why",
    [
        ({"rank": 2, "master_port": 29500, "members": [{"node": "a", "address": "a", "slots": 1}]}, "rank"),
        ({"rank": 0, "master_port": 70000, "members": [{"node": "a", "address": "a", "slots": 1}]}, "port"),
        (
            {"rank": 0, "master_port": 29500, "members": [{"node": "a", "address": "a b", "slots": 1}]},
            "address",
        ),
        ({"rank": 0, "master_port": 29500, "members": [{"node": "a", "address": "a", "slots": 0}]}, "slot"),
    ],
)
def test_a_malformed_gang_refuses_the_desired_state(gang, why):
    with pytest.raises(ValueError, match=why):
        JobSpec.from_dict({"job_id": "1", "attempt": 1, "command": "true", "gang": gang})


def run_parser(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_the_address_comes_from_the_flag_or_the_environment_and_goes_into_hello(tmp_path):
    args = run_parser(["--node", "n1", "--work-dir", str(tmp_path), "--address", "10.1.2.3"])
    assert load_config(args, environ={}).address == "10.1.2.3"
    args = run_parser(["--node", "n1", "--work-dir", str(tmp_path)])
    assert load_config(args, environ={"TESSERA_AGENT_ADDRESS": "gpu-01.lab"}).address == "gpu-01.lab"
    assert load_config(args, environ={}).address is None
    with pytest.raises(ConfigError, match="one host name"):
        load_config(run_parser(["--node", "n1", "--address", "a b"]), environ={})

    sim = tmp_path / "sim.yaml"
    sim.write_text("gpus:\n  - {model: NVIDIA L4, count: 1, memory_mib: 23034}\n")
    agent = Agent(
        node_name="n1", backend=SimBackend.from_file(sim), executor=Executor(tmp_path), address="10.1.2.3"
    )
    assert agent.hello()["payload"]["address"] == "10.1.2.3"
