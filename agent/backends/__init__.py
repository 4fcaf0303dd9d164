"""GPU backends behind one Protocol (`GpuBackend`): NVML for real hosts, a YAML-described simulation."""

from __future__ import annotations

from pathlib import Path

from agent.backends.base import GpuBackend, GpuInfo, GpuLink, GpuSample, Inventory, JobUsageHint, Sample

__all__ = [
    "GpuBackend",
    "GpuInfo",
    "GpuLink",
    "GpuSample",
    "Inventory",
    "JobUsageHint",
    "Sample",
    "make_backend",
]


def make_backend(
    kind: str,
    *,
    sim_config: str | Path | None = None,
    node_name: str | None = None,
    sharing_mode: str = "exclusive",
    sharing_overrides: dict[int, str] | None = None,
) -> GpuBackend:
    """Build the configured backend. With $TESSERA_FAKE_NVML set, `nvml` runs on the recorded fixture."""
    if kind == "nvml":
        import os

        if os.environ.get("TESSERA_FAKE_NVML"):
            from agent.testing import fake_pynvml

            fake_pynvml.install(os.environ["TESSERA_FAKE_NVML"])
        from agent.backends.nvml import NvmlBackend

        return NvmlBackend(sharing_mode=sharing_mode, sharing_overrides=sharing_overrides)
    if kind == "sim":
        from agent.backends.sim import SimBackend

        if sim_config is None:
            raise ValueError("the sim backend needs a YAML file describing its GPUs (--sim-config)")
        return SimBackend.from_file(sim_config, node_name=node_name)
    raise ValueError(f"unknown backend {kind!r} (nvml or sim)")
