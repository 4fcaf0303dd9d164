"""The CUDA MPS control daemon for the node's MPS GPUs, and the environment an MPS client is started with."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

_MAX_PIPE_DIR_CHARS = 80
_KNOWN_LOCATIONS = ("/usr/local/nvidia/bin/nvidia-cuda-mps-control", "/usr/bin/nvidia-cuda-mps-control")


@dataclass
class MpsStatus:
    available: bool  # the control binary exists
    running: bool  # a daemon answers on our pipe directory
    started_now: bool = False
    message: str = ""


def find_mps_control(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit if Path(explicit).exists() else None
    found = shutil.which("nvidia-cuda-mps-control")
    if found:
        return found
    return next((p for p in _KNOWN_LOCATIONS if Path(p).exists()), None)


class MpsController:
    """One MPS control daemon per agent, its pipe and log directories under the agent's work dir."""

    def __init__(
        self, work_dir: str | Path, *, control_path: str | None = None, timeout_s: float = 10.0
    ) -> None:
        base = Path(work_dir).resolve() / "mps"
        self.pipe_dir = base / "pipe"
        if len(str(self.pipe_dir)) > _MAX_PIPE_DIR_CHARS:
            # MPS keeps Unix sockets in the pipe directory and a socket path holds at most 107 bytes:
            # a deep work dir gets a short, stable pipe directory of its own instead.
            digest = hashlib.sha1(str(base).encode()).hexdigest()[:12]
            self.pipe_dir = Path(tempfile.gettempdir()) / f"tessera-mps-{digest}"
        self.log_dir = base / "log"
        self.binary = find_mps_control(control_path)
        self.timeout_s = timeout_s
        self._last: MpsStatus | None = None

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.pipe_dir)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(self.log_dir)
        # The daemon serves every GPU; clients choose theirs with CUDA_VISIBLE_DEVICES.
        env.pop("CUDA_VISIBLE_DEVICES", None)
        return env

    def _command(self, command: str) -> subprocess.CompletedProcess[str] | None:
        if self.binary is None:
            return None
        try:
            return subprocess.run(
                [self.binary],
                input=command + "\n",
                env=self._env(),
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None

    def is_running(self) -> bool:
        if self.binary is None or not (self.pipe_dir / "control").exists():
            return False
        result = self._command("get_server_list")
        return result is not None and result.returncode == 0

    def ensure_running(self) -> MpsStatus:
        if self.binary is None:
            self._last = MpsStatus(
                False, False, message="nvidia-cuda-mps-control not found; MPS limits are not enforced"
            )
            return self._last
        if self._last is not None and self._last.running and (self.pipe_dir / "control").exists():
            return MpsStatus(True, True, message="running")
        if self.is_running():
            self._last = MpsStatus(True, True, message="already running")
            return self._last
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            proc = subprocess.run(
                [self.binary, "-d"], env=self._env(), capture_output=True, text=True, timeout=self.timeout_s
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self._last = MpsStatus(True, False, message=f"cannot start the MPS daemon: {exc}")
            return self._last
        ok = proc.returncode == 0
        message = (
            "started" if ok else f"daemon start failed rc={proc.returncode}: {proc.stderr.strip()[:300]}"
        )
        self._last = MpsStatus(True, ok, started_now=ok, message=message)
        return self._last

    def quit(self) -> bool:
        result = self._command("quit")
        self._last = None
        return result is not None and result.returncode == 0

    def client_env(
        self, *, active_thread_pct: int | None, memory_limits_mib: list[int | None]
    ) -> dict[str, str]:
        """Environment for an MPS client. memory_limits_mib is per device in the client's CUDA_VISIBLE_DEVICES
        order: the limit names devices by the ordinal the client sees ("0=4096M,1=4096M")."""
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }
        if active_thread_pct is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(int(active_thread_pct))
        limits = [f"{ordinal}={mib}M" for ordinal, mib in enumerate(memory_limits_mib) if mib]
        if limits:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
        return env
