"""`tessera-agent check` tries, as a pool uid, what a job can do on this host: use its own tree, open the GPUs'
device nodes, reach the portal's services; each line says what to do about it. Real uids: these run as root (CI
does) and skip with the reason elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agent.check import as_user, gpu_fence_row, job_tree_row, reach_rows, reach_targets
from agent.isolation import Identity, Isolation
from tests.support import listening_socket, refusing_address

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="the check runs its tries as a pool uid, which needs root; CI runs these as root",
)

POOL = (61200, 61209)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def isolation() -> Isolation:
    return Isolation(mode="pool", uid_pool=POOL)


@pytest.fixture
def scratch():
    """A directory under /tmp (pytest's tmp_path sits under one only root may enter), mode 700 as mkdtemp makes
    it."""
    path = Path(tempfile.mkdtemp(prefix="tessera-check-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_check_says_a_pool_uid_uses_its_home_tmpdir_and_hostfile_and_leaves_nothing_behind(
    isolation, scratch
):
    work_dir = scratch / "agent"
    work_dir.mkdir()
    os.chmod(scratch, 0o711)
    row = job_tree_row(isolation, work_dir=work_dir)
    assert row["enforced"] is True, row
    assert row["detail"].startswith(f"uid {POOL[1]} wrote its home and TMPDIR, read its hostfile")
    assert "could not read the agent's records or another job's home" in row["detail"]
    assert os.listdir(work_dir / "jobs") == []  # its throwaway tree is gone


def test_check_names_the_directory_a_pool_uid_cannot_pass_and_what_to_do(isolation, scratch):
    work_dir = scratch / "agent"  # scratch stays 700: no job reaches anything under it
    work_dir.mkdir()
    row = job_tree_row(isolation, work_dir=work_dir)
    assert row["enforced"] is False
    assert f"uid {POOL[1]} could not write its home (Permission denied)" in row["detail"]
    assert f"it cannot pass {scratch} (Permission denied)" in row["detail"]
    assert "chmod o+x" in row["detail"]
    assert os.listdir(work_dir / "jobs") == []


def _device_nodes(d: Path, modes: dict[str, int]) -> Path:
    os.chmod(d, 0o711)
    for name, mode in modes.items():
        (d / name).touch()
        os.chmod(d / name, mode)
    return d


@pytest.fixture
def unfenced() -> Isolation:
    """A host whose kernel gives the agent no devices controller (a cgroup root with no hierarchies)."""
    return Isolation(mode="pool", uid_pool=POOL, cgroup_root=Path("/nonexistent-cgroup-root"))


def test_check_says_cuda_visible_devices_is_no_fence_and_which_gpus_a_job_can_open(unfenced, scratch):
    dev = _device_nodes(scratch, {"nvidia0": 0o666, "nvidia1": 0o666, "nvidia2": 0o600, "nvidiactl": 0o666})
    row = gpu_fence_row(unfenced, dev_dir=dev)
    assert row["enforced"] is False
    assert "CUDA_VISIBLE_DEVICES selects a job's GPUs, it does not fence them" in row["detail"]
    assert "the agent sets no devices cgroup" in row["detail"]
    assert f"uid {POOL[1]} can open {dev}/nvidia0, {dev}/nvidia1 (2 of 3)" in row["detail"]
    assert "a job can open any /dev/nvidia*" in row["detail"] and "devices cgroup" in row["detail"]


def test_check_says_when_device_permissions_keep_jobs_off_every_gpu(unfenced, scratch):
    dev = _device_nodes(scratch, {"nvidia0": 0o660, "nvidia1": 0o600})
    row = gpu_fence_row(unfenced, dev_dir=dev)
    assert row["enforced"] is False
    assert row["detail"].startswith(f"uid {POOL[1]} can open none of {dev}/nvidia0, {dev}/nvidia1")
    assert "their own too" in row["detail"]


def test_check_says_each_job_is_fenced_to_its_own_cards_where_the_agent_sets_a_devices_cgroup(
    isolation, scratch
):
    if isolation.devices is None:
        pytest.skip("this host gives the agent no cgroup v1 devices controller")
    dev = _device_nodes(scratch, {"nvidia0": 0o666, "nvidia1": 0o666})
    row = gpu_fence_row(isolation, dev_dir=dev)
    assert row["enforced"] is True
    assert row["detail"] == "each job's devices cgroup allows only its own /dev/nvidiaN (2 card(s) here)"


def test_check_says_a_job_reaches_a_listening_port_and_how_to_firewall_it(isolation):
    listener = listening_socket()
    closed, closed_at = refusing_address()
    port = listener.getsockname()[1]
    try:
        targets = reach_targets(
            [("127.0.0.1", port), ("127.0.0.1", int(closed_at.split(":")[1]))], environ={}
        )
        rows = {row["what"]: row for row in reach_rows(isolation, targets)}
    finally:
        listener.close()
        closed.close()
    row = rows[f"network 127.0.0.1:{port}"]
    assert row["enforced"] is False
    assert row["detail"] == (
        f"jobs can reach 127.0.0.1:{port} (a service answered a job's uid, {POOL[1]}): put jobs in a network"
        " namespace or firewall the portal's services from the job pool's uids (iptables -A OUTPUT -m owner"
        f" --uid-owner {POOL[0]}-{POOL[1]} -d 127.0.0.1 -p tcp --dport {port} -j REJECT)"
    )
    assert rows[f"network {closed_at}"] == {
        "what": f"network {closed_at}",
        "enforced": None,
        "detail": "nothing answers there (Connection refused): not tried",
    }


def test_the_portals_database_and_redis_are_tried_on_loopback_and_as_the_environment_names_them():
    targets = reach_targets(
        [("10.1.2.3", 5432)],
        environ={
            "DATABASE_URL": "postgres://u:p@db.example:6543/x",
            "REDIS_URL": "redis://127.0.0.1:6379/13",
        },
    )
    assert targets == [
        ("127.0.0.1", 5432, "PostgreSQL", False),
        ("127.0.0.1", 6379, "Redis", True),
        ("db.example", 6543, "PostgreSQL", True),
        ("10.1.2.3", 5432, "PostgreSQL", True),
    ]


def test_a_try_as_a_uid_that_outlasts_its_timeout_is_reported_not_waited_for():
    t0 = time.monotonic()
    seen = as_user(Identity(POOL[1], POOL[1], "probe"), lambda: time.sleep(60), timeout_s=0.5)
    assert seen == {"error": "no answer within 0.5 s"}
    assert time.monotonic() - t0 < 30


def test_tessera_agent_check_prints_the_job_lines(scratch):
    os.chmod(scratch, 0o711)
    listener = listening_socket()
    port = listener.getsockname()[1]
    env = {
        "PATH": "/usr/bin:/bin",
        "TESSERA_AGENT_UID_POOL": f"{POOL[0]}-{POOL[1]}",
        "DATABASE_URL": "",
        "REDIS_URL": "",
    }
    argv = [sys.executable, "-m", "agent.cli", "check", "--backend", "sim"]
    argv += ["--sim-config", str(REPO / "agent/examples/sim-node.yaml"), "--work-dir", str(scratch / "agent")]
    argv += ["--reach", f"127.0.0.1:{port}"]
    try:
        human = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        machine = subprocess.run(
            [*argv, "--json"], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
        )
    finally:
        listener.close()
    assert human.returncode == 0, human.stderr
    assert "isolation: a job's home, TMPDIR and hostfile: yes: uid 61209 wrote its home" in human.stdout
    fenced = Isolation(mode="pool", uid_pool=POOL).devices is not None
    assert ("isolation: GPU fence: yes: " if fenced else "isolation: GPU fence: NO: ") in human.stdout
    assert f"isolation: network 127.0.0.1:{port}: NO: jobs can reach 127.0.0.1:{port}" in human.stdout
    rows = {row["what"]: row for row in json.loads(machine.stdout)["isolation"]}
    assert rows["a job's home, TMPDIR and hostfile"]["enforced"] is True
    assert rows[f"network 127.0.0.1:{port}"]["enforced"] is False
