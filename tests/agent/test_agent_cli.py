"""`tessera-agent` configuration and commands: check against the fake NVML, run against a websocket portal."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from websockets.asyncio.server import serve

from agent import protocol
from agent.config import ConfigError, add_arguments, load_config, parse_sharing
from tests.support import TIMEOUT_SCALE, wait_for_async

REPO = Path(__file__).resolve().parents[2]
SIM_YAML = REPO / "agent/examples/sim-node.yaml"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


# Jobs run as the agent's user here: as root the agent would give them users of their own, who may not enter
# pytest's temporary directories nor run this virtualenv's Python (tests/agent/test_agent_isolation.py covers that).
AS_AGENT_USER = {**os.environ, "TESSERA_AGENT_JOB_USERS": "agent"}


def _cli(*argv: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *argv],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_token_comes_from_the_flag_then_the_environment_then_its_file(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    env = {"TESSERA_AGENT_TOKEN_FILE": str(token_file)}
    assert load_config(_args(), env).token == "from-file"
    assert load_config(_args(), {**env, "TESSERA_AGENT_TOKEN": "from-env"}).token == "from-env"
    assert (
        load_config(_args("--token", "from-flag"), {**env, "TESSERA_AGENT_TOKEN": "from-env"}).token
        == "from-flag"
    )
    assert (
        load_config(_args("--token-file", str(token_file)), {"TESSERA_AGENT_TOKEN": "x"}).token == "from-file"
    )
    assert "from-file" not in repr(load_config(_args(), env))
    with pytest.raises(ConfigError):
        load_config(_args("--token-file", str(tmp_path / "missing")), {})


def test_configuration_reads_flags_and_environment(tmp_path):
    env = {
        "TESSERA_PORTAL_URL": "https://portal",
        "TESSERA_NODE_NAME": "gpu-07",
        "TESSERA_AGENT_WORK_DIR": str(tmp_path),
        "TESSERA_AGENT_BACKEND": "sim",
        "TESSERA_SIM_CONFIG": str(SIM_YAML),
        "TESSERA_AGENT_HEARTBEAT_S": "2.5",
    }
    config = load_config(_args("--node", "gpu-08", "--sharing", "timeslice,1=mps"), env)
    assert (config.portal_url, config.node_name, config.work_dir) == ("https://portal", "gpu-08", tmp_path)
    assert (config.backend, config.sim_config, config.heartbeat_s) == ("sim", SIM_YAML, 2.5)
    assert (config.sharing, config.sharing_overrides) == ("timeslice", {1: "mps"})
    # The agent's earlier word for time-slicing, on a host whose flags still say it, is read as the portal's.
    legacy = load_config(_args("--node", "gpu-08", "--sharing", "mps,0=time_sliced"), env)
    assert (legacy.sharing, legacy.sharing_overrides) == ("mps", {0: "timeslice"})
    with pytest.raises(ConfigError):
        load_config(_args("--backend", "sim"), {})
    with pytest.raises(ConfigError):
        parse_sharing("shared")
    with pytest.raises(ConfigError):
        load_config(_args(), {"TESSERA_AGENT_WORK_DIR": str(tmp_path)}).require_portal()


def test_check_prints_what_the_agent_sees_on_the_fake_h200(h200_dir, tmp_path):
    result = _cli(
        "check",
        "--backend",
        "nvml",
        "--json",
        "--mps-smoke",
        "--work-dir",
        str(tmp_path),
        env={"TESSERA_FAKE_NVML": str(h200_dir), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    snap = json.loads((h200_dir / "nvml_snapshot.json").read_text())["devices"][0]
    gpu = report["inventory"]["gpus"][0]
    assert (gpu["uuid"], gpu["name"], gpu["memory_total_mib"]) == (snap["uuid"], snap["name"], 143771)
    assert report["mig"][snap["uuid"]] == {"capable": True, "enabled": False, "profiles": 7}
    smoke = report["mps_smoke"]
    assert smoke["limits_received"] is True and smoke["exit_code"] == 0
    assert smoke["observed"]["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert smoke["observed"]["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    human = _cli("check", "--work-dir", str(tmp_path), env={"TESSERA_FAKE_NVML": str(h200_dir)})
    assert "NVIDIA H200" in human.stdout and "7g.141gb" in human.stdout and "nvlink" in human.stdout
    # What this host can isolate: as root, each job its own user; without root, nothing (and it says so).
    users = next(row for row in report["isolation"] if row["what"] == "job users")
    assert users["enforced"] is (os.geteuid() == 0)
    assert "isolation: job users: " + ("yes" if os.geteuid() == 0 else "NO") in human.stdout
    assert "isolation: host memory and CPU limits" in human.stdout


def test_run_needs_a_portal_and_a_token(tmp_path):
    result = _cli(
        "run",
        "--backend",
        "sim",
        "--sim-config",
        str(SIM_YAML),
        "--work-dir",
        str(tmp_path),
        env={"TESSERA_PORTAL_URL": "", "TESSERA_AGENT_TOKEN": ""},
    )
    assert result.returncode == 2 and "portal" in result.stderr


def test_the_agent_process_connects_reports_and_stops_on_sigterm(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("t0k3n")

    async def scenario():
        seen: list[dict] = []
        hello_seen = asyncio.Event()

        async def handler(ws):
            seen.append({"auth": ws.request.headers.get("Authorization")})
            async for text in ws:
                msg = protocol.decode(text)
                seen.append(msg)
                if msg["type"] == "hello":
                    await ws.send(protocol.encode(protocol.ack(msg["id"])))
                    await ws.send(
                        protocol.encode(protocol.message("desired_state", {"version": 1, "jobs": []}))
                    )
                if msg["type"] == "heartbeat":
                    hello_seen.set()

        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agent.cli", "run", "--portal", f"http://127.0.0.1:{port}",
                "--token-file", str(token_file), "--node", "sim-a100-01", "--backend", "sim",
                "--sim-config", str(SIM_YAML), "--work-dir", str(tmp_path / "wd"), cwd=str(REPO),
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            try:
                await asyncio.wait_for(hello_seen.wait(), 30)
            finally:
                proc.send_signal(signal.SIGTERM)
                _, err = await asyncio.wait_for(proc.communicate(), 30)
        return seen, proc.returncode, err.decode()

    seen, code, err = asyncio.run(scenario())
    assert code == 0, err
    assert seen[0] == {"auth": "Bearer t0k3n"}
    hello = next(m for m in seen[1:] if m["type"] == "hello")["payload"]
    assert hello["node"] == "sim-a100-01" and len(hello["inventory"]["gpus"]) == 6
    assert any(m.get("type") == "ack" and m["payload"]["desired_version"] == 1 for m in seen[1:])
    # Every line: UTC timestamp, level, logger and the node (agent/logformat.py, as the portal writes them).
    lines = (tmp_path / "wd/agent.log").read_text().splitlines()
    line_format = re.compile(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) tessera\.agent[\w.]* "
        r"\[node=sim-a100-01\]: \S"
    )
    assert lines and all(line_format.match(line) for line in lines), lines


def test_an_agent_killed_with_sigkill_and_restarted_adopts_its_job_and_never_runs_it_twice(tmp_path):
    from agent import procfs

    token_file = tmp_path / "token"
    token_file.write_text("t0k3n")
    work_dir = tmp_path / "wd"
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]

    async def scenario():
        sessions: list[list[dict]] = []
        started = asyncio.Event()
        readopted = asyncio.Event()
        gpu = {}

        async def handler(ws):
            got: list[dict] = []
            sessions.append(got)
            async for text in ws:
                msg = protocol.decode(text)
                got.append(msg)
                if msg["type"] in protocol.RELIABLE:
                    await ws.send(protocol.encode(protocol.ack(msg["id"])))
                if msg["type"] == "hello":
                    g = msg["payload"]["inventory"]["gpus"][0]
                    gpu.update(uuid=g["uuid"], index=g["index"])
                    job = {
                        "job_id": "long",
                        "attempt": 1,
                        "command": sleeper,
                        "gpus": [dict(gpu)],
                        "grace_s": 1,
                    }
                    await ws.send(
                        protocol.encode(protocol.message("desired_state", {"version": 5, "jobs": [job]}))
                    )
                    if len(sessions) == 2:
                        readopted.set()
                if msg["type"] == "job_status" and msg["payload"]["state"] == "started":
                    started.set()

        def agent_proc():
            return asyncio.create_subprocess_exec(
                sys.executable, "-m", "agent.cli", "run", "--portal", f"http://127.0.0.1:{port}",
                "--token-file", str(token_file), "--node", "sim-a100-01", "--backend", "sim",
                "--sim-config", str(SIM_YAML), "--work-dir", str(work_dir), "--sample-s", "0.2", cwd=str(REPO),
                stderr=asyncio.subprocess.DEVNULL, env=AS_AGENT_USER,
            )  # fmt: skip

        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            first = await agent_proc()
            await asyncio.wait_for(started.wait(), 30 * TIMEOUT_SCALE)
            first.kill()  # SIGKILL: no clean-up at all
            await first.wait()
            second = await agent_proc()
            try:
                await asyncio.wait_for(readopted.wait(), 30 * TIMEOUT_SCALE)
                # Several ticks of convergence on the same desired state: a sample goes out each second (every fifth
                # tick at --sample-s 0.2).
                await wait_for_async(
                    "two samples from the restarted agent",
                    lambda: sum(m["type"] == "metrics" for m in sessions[1]) >= 2,
                    timeout_s=30,
                )
            finally:
                second.send_signal(signal.SIGTERM)
                await second.wait()
        return sessions

    sessions = asyncio.run(scenario())
    supervisors = [
        p
        for p in procfs.find_by_env("TESSERA_PLACEMENT=long:1")
        if procfs.read_stat(p).session == p and any(str(work_dir) in a for a in procfs.read_cmdline(p) or [])
    ]
    try:
        hello2 = next(m for m in sessions[1] if m["type"] == "hello")["payload"]
        assert [(r["job_id"], r["adopted"]) for r in hello2["running"]] == [("long", True)]
        fresh_starts = [
            m
            for m in sessions[1]
            if m["type"] == "job_status"
            and m["payload"]["state"] == "started"
            and not m["payload"]["adopted"]
        ]
        assert fresh_starts == []
        assert len(supervisors) == 1
    finally:
        for pid in supervisors:  # the supervisor's session: it and the job it runs
            for member in [int(e) for e in os.listdir("/proc") if e.isdigit()]:
                st = procfs.read_stat(member)
                if st is not None and st.session == pid:
                    os.kill(member, signal.SIGKILL)


def test_log_format_json_makes_the_agent_write_one_json_object_per_line(tmp_path):
    import io
    import logging

    from agent import logformat

    assert load_config(_args(), {"LOG_FORMAT": "json"}).log_format == "json"
    assert (
        load_config(_args(), {"LOG_FORMAT": "json", "TESSERA_AGENT_LOG_FORMAT": "text"}).log_format == "text"
    )
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    buf = io.StringIO()
    try:
        logformat.configure(level="INFO", log_format="json", handlers=[logging.StreamHandler(buf)], node="n1")
        logging.getLogger("tessera.agent").info("job %s started", 5, extra={"job_id": 5})
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    line = json.loads(buf.getvalue())
    assert line["ts"].endswith("Z") and (line["level"], line["logger"]) == ("INFO", "tessera.agent")
    assert (line["message"], line["job_id"], line["node"]) == ("job 5 started", 5, "n1")
