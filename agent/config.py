"""Agent configuration from flags, then environment variables, then defaults (the token also from a file)."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent.backends.base import sharing_mode
from agent.containers import PULL_POLICIES


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class AgentConfig:
    node_name: str
    work_dir: Path
    portal_url: str | None = None
    token: str | None = field(default=None, repr=False)
    backend: str = "nvml"
    sim_config: Path | None = None
    heartbeat_s: float = 5.0
    sample_s: float = 1.0
    sharing: str = "exclusive"
    sharing_overrides: dict[int, str] = field(default_factory=dict)
    mps_control: str | None = None
    watchdog_tolerance_mib: int = 0
    watchdog_grace_s: float = 5.0
    log_level: str = "INFO"
    log_format: str = "text"  # text | json (agent/logformat.py)
    fence_after_s: float | None = None
    address: str | None = (
        None  # where the other members of a gang reach this host (None: the portal uses the name)
    )
    job_users: str | None = (
        None  # pool | account | agent (agent/isolation.py); None: pool as root, else agent
    )
    uid_pool: tuple[int, int] = (60000, 60999)
    token_file: Path | None = None
    # Jobs in images (agent/containers.py): which runtime (auto | podman | apptainer | none), Podman's OCI runtime
    # (None: its own default), and when an image is pulled.
    container_runtime: str = "auto"
    oci_runtime: str | None = None
    pull_policy: str = "if-not-present"

    def containers(self):
        """The runtime jobs with an image run with (None: this node runs none)."""
        from agent.containers import ContainerError, runtime_for

        try:
            return runtime_for(self.container_runtime, oci_runtime=self.oci_runtime)
        except ContainerError as exc:
            raise ConfigError(str(exc)) from exc

    def require_portal(self) -> None:
        if not self.portal_url:
            raise ConfigError("no portal URL: --portal or TESSERA_PORTAL_URL")
        if not self.token:
            raise ConfigError("no node token: --token-file, TESSERA_AGENT_TOKEN_FILE or TESSERA_AGENT_TOKEN")


def default_work_dir(environ: Mapping[str, str] = os.environ) -> Path:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/tessera-agent")
    state = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local/state")
    return Path(state) / "tessera-agent"


def parse_sharing(text: str) -> tuple[str, dict[int, str]]:
    """'mps' or 'timeslice,0=mps,1=exclusive': a default mode and per-GPU-index overrides."""
    default, overrides = "exclusive", {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        index, sep, mode = item.partition("=")
        try:
            mode = sharing_mode(mode if sep else index)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if sep:
            overrides[int(index)] = mode
        else:
            default = mode
    return default, overrides


def _uid_pool(text: str) -> tuple[int, int]:
    first, sep, last = text.partition("-")
    try:
        low, high = int(first), int(last if sep else first)
    except ValueError:
        raise ConfigError(
            f"TESSERA_AGENT_UID_POOL must be FIRST-LAST, e.g. 60000-60999 (got {text!r})"
        ) from None
    if not 0 < low <= high:
        raise ConfigError(f"TESSERA_AGENT_UID_POOL must be FIRST-LAST with 0 < FIRST <= LAST (got {text!r})")
    return low, high


def add_arguments(parser: argparse.ArgumentParser, *, connection: bool = True) -> None:
    if connection:
        parser.add_argument(
            "--portal", help="portal URL, e.g. https://portal.example.org [TESSERA_PORTAL_URL]"
        )
        parser.add_argument(
            "--token", help="node token (visible in ps: prefer --token-file) [TESSERA_AGENT_TOKEN]"
        )
        parser.add_argument("--token-file", help="file holding the node token [TESSERA_AGENT_TOKEN_FILE]")
        parser.add_argument(
            "--heartbeat-s", type=float, help="heartbeat interval [TESSERA_AGENT_HEARTBEAT_S, 5]"
        )
    parser.add_argument("--node", help="node name [TESSERA_NODE_NAME, the host name]")
    if connection:
        parser.add_argument(
            "--address",
            help="host name or IP address other nodes reach this one at, for multi-node jobs "
            "[TESSERA_AGENT_ADDRESS, the node name]",
        )
    parser.add_argument("--work-dir", help="logs and state [TESSERA_AGENT_WORK_DIR]")
    parser.add_argument(
        "--backend", choices=("nvml", "sim"), help="GPU backend [TESSERA_AGENT_BACKEND, nvml]"
    )
    parser.add_argument("--sim-config", help="YAML describing simulated GPUs [TESSERA_SIM_CONFIG]")
    parser.add_argument("--sample-s", type=float, help="sampling interval [TESSERA_AGENT_SAMPLE_S, 1]")
    parser.add_argument(
        "--sharing",
        help="GPU sharing mode(s): MODE or MODE,INDEX=MODE,... [TESSERA_AGENT_SHARING, exclusive]",
    )
    parser.add_argument(
        "--mps-control", help="path of nvidia-cuda-mps-control [TESSERA_MPS_CONTROL, from PATH]"
    )


def load_config(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> AgentConfig:
    def pick(attr: str, env: str, default=None):
        value = getattr(args, attr, None)
        if value is not None:
            return value
        return environ.get(env) or default

    token = getattr(args, "token", None)
    token_file = getattr(args, "token_file", None)
    if token is None and token_file is None:
        # Flags win over the environment; in the environment the token wins over its file.
        token = environ.get("TESSERA_AGENT_TOKEN") or None
        if token is None:
            token_file = environ.get("TESSERA_AGENT_TOKEN_FILE") or None
    if token is None and token_file:
        try:
            token = Path(token_file).read_text().strip() or None
        except OSError as exc:
            raise ConfigError(f"cannot read the token file {token_file}: {exc}") from exc
    sharing, overrides = parse_sharing(pick("sharing", "TESSERA_AGENT_SHARING", "exclusive"))
    sim = pick("sim_config", "TESSERA_SIM_CONFIG")
    backend = pick("backend", "TESSERA_AGENT_BACKEND", "nvml")
    if backend not in ("nvml", "sim"):
        raise ConfigError(f"backend must be nvml or sim, not {backend!r}")
    if backend == "sim" and not sim:
        raise ConfigError("the sim backend needs --sim-config or TESSERA_SIM_CONFIG")
    try:
        heartbeat_s = float(pick("heartbeat_s", "TESSERA_AGENT_HEARTBEAT_S", 5.0))
        sample_s = float(pick("sample_s", "TESSERA_AGENT_SAMPLE_S", 1.0))
        uid_pool = _uid_pool(environ.get("TESSERA_AGENT_UID_POOL") or "60000-60999")
        fence = pick("fence_after_s", "TESSERA_AGENT_FENCE_AFTER_S")
        fence_after_s = float(fence) if fence not in (None, "", "0") else None
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if heartbeat_s <= 0 or sample_s <= 0:
        raise ConfigError("intervals must be positive")
    address = pick("address", "TESSERA_AGENT_ADDRESS")
    if address is not None and (not address.strip() or any(c.isspace() for c in address.strip())):
        raise ConfigError(f"the address must be one host name or IP address, not {address!r}")
    pull_policy = environ.get("TESSERA_AGENT_PULL_POLICY") or "if-not-present"
    if pull_policy not in PULL_POLICIES:
        raise ConfigError(
            f"TESSERA_AGENT_PULL_POLICY must be one of {', '.join(PULL_POLICIES)} (got {pull_policy!r})"
        )
    return AgentConfig(
        container_runtime=environ.get("TESSERA_AGENT_CONTAINER_RUNTIME") or "auto",
        oci_runtime=environ.get("TESSERA_AGENT_OCI_RUNTIME") or None,
        pull_policy=pull_policy,
        node_name=pick("node", "TESSERA_NODE_NAME", socket.gethostname()),
        work_dir=Path(pick("work_dir", "TESSERA_AGENT_WORK_DIR", None) or default_work_dir(environ)),
        portal_url=pick("portal", "TESSERA_PORTAL_URL"),
        token=token,
        backend=backend,
        sim_config=Path(sim) if sim else None,
        heartbeat_s=heartbeat_s,
        sample_s=sample_s,
        sharing=sharing,
        sharing_overrides=overrides,
        mps_control=pick("mps_control", "TESSERA_MPS_CONTROL"),
        log_level=environ.get("TESSERA_AGENT_LOG_LEVEL", "INFO"),
        log_format=environ.get("TESSERA_AGENT_LOG_FORMAT") or environ.get("LOG_FORMAT") or "text",
        fence_after_s=fence_after_s,
        job_users=environ.get("TESSERA_AGENT_JOB_USERS") or None,
        uid_pool=uid_pool,
        token_file=Path(token_file) if token_file else None,
        address=address.strip() if address else None,
    )
