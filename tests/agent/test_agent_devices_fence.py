"""GPUs fenced by the kernel for bare-process jobs: as root, with cgroup v1's devices controller, a job may open its
own /dev/nvidiaN and not another card's. Device nodes of the NVIDIA major made here stand in for the cards: with no
driver, opening an allowed one fails with ENXIO (no such device), a fenced one with EPERM (the cgroup). Skips, with
the reason, where the kernel or the user cannot."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest
from agent_test_helpers import wait_for

from agent.executor import Executor
from agent.isolation import NVIDIA_MAJOR, Isolation, device_rules, devices_root
from agent.jobspec import GpuSlice, JobSpec

PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
POOL = (61010, 61019)

PROBE = """
import errno, json, os, sys
out = {}
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        out[path] = "opened"
    except OSError as e:
        out[path] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(out))
"""


def test_the_rules_allow_only_the_jobs_own_cards_and_the_drivers_control_devices(tmp_path):
    proc_devices = tmp_path / "devices"
    proc_devices.write_text(
        "Character devices:\n  1 mem\n195 nvidia-frontend\n236 nvidia-uvm\n239 nvidia-caps\n\n"
        "Block devices:\n  8 sd\n236 nvidia-uvm\n"
    )
    rules = device_rules([2, 0], proc_devices)
    assert f"c {NVIDIA_MAJOR}:0 rwm" in rules and f"c {NVIDIA_MAJOR}:2 rwm" in rules
    assert f"c {NVIDIA_MAJOR}:1 rwm" not in rules and f"c {NVIDIA_MAJOR}:* rwm" not in rules
    assert "c 236:* rwm" in rules and "c 239:* rwm" in rules and "c 195:255 rwm" in rules  # uvm, caps, ctl
    assert rules.count("c 236:* rwm") == 1  # the block device of that number is not a char device


@pytest.mark.skipif(os.geteuid() != 0, reason="the devices fence needs root (CI runs as root)")
def test_a_job_opens_its_own_card_and_is_refused_another():
    if devices_root() is None:
        pytest.skip(
            "this host has no cgroup v1 devices controller (a cgroup-v2-only host needs a BPF program)"
        )
    work = Path(tempfile.mkdtemp(prefix="tessera-devices-", dir="/tmp"))
    try:
        os.chmod(work, 0o711)
        cards = work / "dev"
        cards.mkdir()
        os.chmod(cards, 0o755)
        for index in (0, 1):
            try:
                os.mknod(cards / f"nvidia{index}", 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, index))
            except PermissionError as exc:
                pytest.skip(f"cannot make device nodes here: {exc}")
            os.chmod(cards / f"nvidia{index}", 0o666)  # as the driver's are: the fence, not the mode, decides
        ex = Executor(work, isolation=Isolation(mode="pool", uid_pool=POOL))
        os.chmod(ex.jobs_dir, 0o711)
        spec = JobSpec(
            job_id="fence-1",
            attempt=1,
            command=(PYTHON, "-c", PROBE, str(cards / "nvidia0"), str(cards / "nvidia1"), "/dev/null"),
            gpus=(GpuSlice(uuid="GPU-zero", index=0),),
        )
        handle = ex.start(spec)
        try:
            lines = wait_for("the probe's answer", lambda: ex.tail_log(handle.key, "stdout"))
        except AssertionError:
            raise AssertionError(f"no output; stderr: {ex.tail_log(handle.key, 'stderr')}") from None
        seen = json.loads(lines[0])
        assert seen[str(cards / "nvidia0")] == "ENXIO"  # allowed through the fence: no driver behind it
        assert seen[str(cards / "nvidia1")] == "EPERM"  # another card: refused by the cgroup
        assert seen["/dev/null"] == "opened"
        ex.wait(handle.key, 10)
        run = json.loads((handle.dir / "run.json").read_text())
        fence = [d for d in run["cgroup"]["dirs"] if "/devices/" in d]
        assert fence and not any(os.path.exists(d) for d in fence)  # gone with the job
    finally:
        shutil.rmtree(work, ignore_errors=True)
