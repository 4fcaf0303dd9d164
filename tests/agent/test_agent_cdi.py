"""A job in an image gets its cards by CDI name, as the host's CDI spec (`nvidia-ctk cdi generate`) names them:
driven by the recorded H200's NVML answers (the card's index and UUID as NVML gives them), without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import containers
from agent.backends.nvml import NvmlBackend
from agent.containers import Podman, cdi_gpu_devices
from agent.jobspec import GpuSlice, JobSpec
from agent.launch import LaunchError, in_image
from agent.placement import JobHandle

# What nvidia-ctk writes for a host whose one card is the recorded H200 (names by index and by UUID, and "all").
CDI_SPEC = """---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "{index}"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia{index}
- name: {uuid}
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia{index}
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia{index}
containerEdits:
  deviceNodes:
  - path: /dev/nvidiactl
"""


def _run(tmp_path: Path) -> dict:
    return {
        "argv": ["/bin/sh", "-c", "nvidia-smi"],
        "env": {"CUDA_VISIBLE_DEVICES": "x"},
        "cwd": str(tmp_path),
        "user": None,
        "cgroup": {},
    }


def test_the_placements_cards_are_given_by_their_cdi_names(fake_nvml, tmp_path, monkeypatch):
    card = NvmlBackend().inventory().gpus[0]
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.yaml").write_text(CDI_SPEC.format(index=card.index, uuid=card.uuid))
    (cdi / "other.yaml").write_text('cdiVersion: 0.5.0\nkind: vendor.example/fpga\ndevices:\n- name: "7"\n')
    monkeypatch.setattr(containers, "CDI_DIRS", (cdi,))
    assert cdi_gpu_devices() == {str(card.index), card.uuid, "all"}  # the FPGA's "7" is not a GPU

    spec = JobSpec(
        job_id="9",
        attempt=1,
        image="nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
        command="nvidia-smi",
        gpus=(GpuSlice(uuid=card.uuid, index=card.index),),
    )
    handle = JobHandle(spec=spec, dir=tmp_path)
    run = in_image(
        spec, handle, _run(tmp_path), runtime=Podman("/usr/bin/podman"), pull_policy="if-not-present"
    )
    argv = run["argv"]
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "--device"]
    assert devices == [f"nvidia.com/gpu={card.index}"]  # its own card, and no other device
    assert "--env" in argv and "CUDA_VISIBLE_DEVICES" in argv  # its selection, by UUID, goes in by name

    other = JobSpec(
        **{**spec.__dict__, "job_id": "10", "gpus": (GpuSlice(uuid="GPU-not-here", index=card.index + 1),)}
    )
    with pytest.raises(LaunchError, match=f"names no nvidia.com/gpu={card.index + 1}"):
        in_image(
            other,
            JobHandle(spec=other, dir=tmp_path),
            _run(tmp_path),
            runtime=Podman("/usr/bin/podman"),
            pull_policy="if-not-present",
        )


def test_a_gpu_host_without_a_cdi_spec_refuses_the_job_rather_than_run_it_without_its_cards(
    fake_nvml, tmp_path, monkeypatch
):
    card = NvmlBackend().inventory().gpus[0]
    monkeypatch.setattr(containers, "CDI_DIRS", (tmp_path / "none",))
    spec = JobSpec(
        job_id="9", attempt=1, image="img", command="true", gpus=(GpuSlice(uuid=card.uuid, index=card.index),)
    )
    monkeypatch.setattr("agent.launch.DRIVER_DEVICE", tmp_path / "nvidiactl")
    (tmp_path / "nvidiactl").touch()  # a host with the driver loaded
    with pytest.raises(LaunchError, match="no CDI spec for its GPUs"):
        in_image(
            spec,
            JobHandle(spec=spec, dir=tmp_path),
            _run(tmp_path),
            runtime=Podman("/usr/bin/podman"),
            pull_policy="if-not-present",
        )
