"""Simulated GPU backend: GPUs described in a YAML file, readings synthesised from the jobs the agent runs.

YAML shape (see docs/agent.md):
    node: sim-a100-01            # optional, names the UUIDs
    gpus:
      - {model: NVIDIA A100-SXM4-80GB, count: 4, memory_mib: 81920, compute_capability: "8.0",
         numa_node: 0, sharing: mps}
    nvlink:                      # optional: [gpu_a, gpu_b, links] or {group: [0, 1, 2, 3], links: 12}
      - [0, 1, 12]
    pcie: SYS                    # path between GPUs without NVLink (default: NODE within a NUMA node, else SYS)
Jobs state their synthetic load in their env: TESSERA_SIM_UTIL_PCT and TESSERA_SIM_MEMORY_MIB (defaults:
100 % of their compute share, their whole memory slice).
"""

from __future__ import annotations

import threading
import time
import uuid as uuidlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from agent.backends.base import (
    GpuInfo,
    GpuLink,
    GpuSample,
    Inventory,
    JobUsageHint,
    ProcessUsage,
    Sample,
    sharing_mode,
)

_IDLE_POWER_FRACTION = 0.12


class SimBackend:
    name = "sim"

    def __init__(self, spec: dict[str, Any], *, node_name: str | None = None) -> None:
        self.node = str(spec.get("node") or node_name or "sim-node")
        self._gpus: list[GpuInfo] = []
        self._power_limit_w: list[float] = []
        for group in spec.get("gpus", []):
            for _ in range(int(group.get("count", 1))):
                index = len(self._gpus)
                try:
                    sharing = sharing_mode(str(group.get("sharing", "exclusive")))
                except ValueError as exc:
                    raise ValueError(f"gpu {index}: {exc}") from None
                numa = group.get("numa_node")
                self._gpus.append(
                    GpuInfo(
                        index=index,
                        uuid=f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'tessera-sim/{self.node}/{index}')}",
                        name=str(group.get("model", "Simulated GPU")),
                        memory_total_mib=int(group["memory_mib"]),
                        compute_capability=str(group.get("compute_capability", "8.0")),
                        pci_bus_id=f"00000000:{0x10 + index:02X}:00.0",
                        numa_node=int(numa) if numa is not None else None,
                        cpu_affinity=group.get("cpu_affinity"),
                        mig_mode_current=sharing == "mig",
                        mig_mode_pending=sharing == "mig",
                        power_limit_w=float(group.get("power_limit_w", 400)),
                        ecc_enabled=True,
                        compute_mode=0,
                        sharing_mode=sharing,
                    )
                )
                self._power_limit_w.append(float(group.get("power_limit_w", 400)))
        if not self._gpus:
            raise ValueError("the simulated node describes no GPUs")
        self._links = self._build_links(spec)
        self._lock = threading.Lock()
        self._jobs: list[JobUsageHint] = []

    @classmethod
    def from_file(cls, path: str | Path, *, node_name: str | None = None) -> SimBackend:
        return cls(yaml.safe_load(Path(path).read_text()) or {}, node_name=node_name)

    def _build_links(self, spec: dict[str, Any]) -> list[GpuLink]:
        counts: dict[tuple[int, int], int] = {}
        for entry in spec.get("nvlink", []) or []:
            if isinstance(entry, dict):
                members = [int(m) for m in entry["group"]]
                for ai, a in enumerate(members):
                    for b in members[ai + 1 :]:
                        counts[(min(a, b), max(a, b))] = int(entry.get("links", 1))
            else:
                a, b, n = (int(x) for x in entry)
                counts[(min(a, b), max(a, b))] = n
        pcie = spec.get("pcie")
        links = []
        for a in range(len(self._gpus)):
            for b in range(a + 1, len(self._gpus)):
                n = counts.get((a, b), 0)
                ga, gb = self._gpus[a], self._gpus[b]
                same_numa = ga.numa_node is not None and ga.numa_node == gb.numa_node
                path = f"NV{n}" if n else (pcie or ("NODE" if same_numa else "SYS"))
                links.append(GpuLink(ga.uuid, gb.uuid, n, path, p2p_supported=bool(n) or path != "SYS"))
        return links

    def inventory(self) -> Inventory:
        return Inventory(
            backend=self.name,
            gpus=[
                GpuInfo(
                    **{**g.__dict__, "mig_profiles": list(g.mig_profiles), "mig_devices": list(g.mig_devices)}
                )
                for g in self._gpus
            ],
            links=list(self._links),
            driver_version="sim",
            cuda_driver_version=None,
            nvml_version=None,
        )

    def note_jobs(self, jobs: Sequence[JobUsageHint]) -> None:
        with self._lock:
            self._jobs = list(jobs)

    def sample(self) -> Sample:
        with self._lock:
            jobs = list(self._jobs)
        out = []
        for gpu, limit_w in zip(self._gpus, self._power_limit_w, strict=True):
            on_gpu = [j for j in jobs if gpu.uuid in j.gpu_uuids]
            util = min(100.0, sum(j.util_pct for j in on_gpu))
            # A job that states no memory and has no slice holds half the card.
            procs = [
                ProcessUsage(
                    pid=j.pid,
                    used_mib=m
                    if (m := int(j.memory_mib.get(gpu.uuid, 0))) >= 0
                    else gpu.memory_total_mib // 2,
                )
                for j in on_gpu
            ]
            used = min(gpu.memory_total_mib, sum(p.used_mib or 0 for p in procs))
            out.append(
                GpuSample(
                    index=gpu.index,
                    uuid=gpu.uuid,
                    util_pct=round(util),
                    mem_util_pct=round(util * 0.3),
                    memory_used_mib=used,
                    memory_total_mib=gpu.memory_total_mib,
                    power_w=round(
                        limit_w * (_IDLE_POWER_FRACTION + (1 - _IDLE_POWER_FRACTION) * util / 100), 1
                    ),
                    temperature_c=round(30 + 0.4 * util),
                    sm_clock_mhz=1410 if util else 210,
                    ecc_uncorrected_volatile=0,
                    processes=procs,
                )
            )
        return Sample(sampled_at=time.time(), gpus=out)

    def close(self) -> None:
        return None
