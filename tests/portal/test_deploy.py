"""The agent's systemd unit (deploy/systemd/tessera-agent.service): systemd accepts it, restarting it stops no job
(KillMode=process: the jobs' supervisors stay), and its command uses only flags tessera-agent has."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.portal.test_compose import flag_problems

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "tessera-agent.service"
ENV_FILE = UNIT.with_suffix(".env")


def _service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string(UNIT.read_text())
    return parser["Service"]


def test_restarting_the_agent_leaves_its_jobs_supervisors_running():
    service = _service()
    assert service["KillMode"] == "process"
    assert service["Restart"] == "always"
    assert service["User"] == "root"  # jobs as users of their own, with cgroup limits
    assert service["StateDirectory"] == "tessera-agent"
    # Sandboxing would be inherited by every job (they are the agent's descendants).
    assert not {"ProtectSystem", "ProtectHome", "PrivateTmp", "NoNewPrivileges"} & set(service)


def test_the_unit_runs_the_agent_with_flags_it_has_and_settings_it_reads():
    argv = shlex.split(_service()["ExecStart"])
    assert argv[0] == "/opt/tessera/bin/tessera-agent"
    assert flag_problems(["tessera-agent", *argv[1:]]) == []
    assert _flag(argv, "--work-dir") == "/var/lib/tessera-agent"
    settings = {line.split("=", 1)[0] for line in ENV_FILE.read_text().splitlines() if "=" in line}
    assert {"TESSERA_PORTAL_URL", "TESSERA_NODE_NAME"} <= {s.lstrip("#") for s in settings}


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_systemd_accepts_the_unit(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # The paths it checks for existence, made this machine's.
    text = (
        UNIT.read_text()
        .replace("/opt/tessera/bin/tessera-agent", str(Path(sys.executable).parent / "tessera-agent"))
        .replace("EnvironmentFile=/etc/tessera/agent.env", f"EnvironmentFile={ENV_FILE}")
    )
    unit = tmp_path / UNIT.name
    unit.write_text(text)
    verified = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0 and not verified.stderr.strip(), verified.stderr
