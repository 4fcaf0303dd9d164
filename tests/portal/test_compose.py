"""docker-compose.yml as an operator reads it: every process checked for health the way its failure should be acted
on (web's liveness on /healthz, each agent on its lease), one beat guarded by a lock, no GPU agent in a container,
metrics files per container, the image installed under the lock. And it names only flags its programs have: each
command of the compose file (its services' and healthchecks') runs here with `--help`, and every flag it uses must
be one the program lists.

`--help` alone would not do: argparse prints the help and exits 0 before it complains of an unknown flag (the GPU
agent's `--fence-after-s` passed that way); click (celery) refuses the unknown flag first. Docker itself is not
needed: the image's programs are this checkout's, installed in the virtual environment.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
IMAGE = "tessera:latest"
# An option as help texts list it: "-A", "--token-file", "--no-input" (also inside usage lines and examples).
_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def _compose_commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every exec-form command run from this project's image: services and healthchecks."""
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    found = []
    for name, service in services.items():
        if service.get("image") != IMAGE and "build" not in service:
            continue  # postgres and redis images: their programs are not ours to run here
        command = service.get("command")
        assert isinstance(command, list), f"service {name}: give the command in exec form (a list)"
        found.append((f"{name}: command", command))
        test = (service.get("healthcheck") or {}).get("test")
        if test is not None:
            assert test[0] == "CMD", f"service {name}: give the healthcheck in exec form ([CMD, ...])"
            found.append((f"{name}: healthcheck", test[1:]))
    return found


def _local(program: str) -> str:
    if program == "python":
        return sys.executable
    path = BIN / program
    assert path.exists(), f"{program} is not installed by this project (not in {BIN})"
    return str(path)


def _help(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_local(argv[0]), *argv[1:], "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings"},
        timeout=120,
    )


def flag_problems(argv: list[str]) -> list[str]:
    """What is wrong with the flags of `argv`: its `--help` failing, or each flag neither its help nor its
    program's own (celery's -A is the program's, not the subcommand's) lists."""
    run = _help(argv)
    if run.returncode != 0:
        return [f"{' '.join(argv)} --help exited {run.returncode}: {run.stderr.strip()[-500:]}"]
    top = _help(argv[:1]) if argv[0] != "python" else run
    offered = set(_OPTION.findall(run.stdout + run.stderr + top.stdout + top.stderr))
    used = [token.split("=", 1)[0] for token in argv[1:] if token.startswith("-") and token != "--"]
    return [f"{flag} is not an option of {' '.join(argv[:2])}" for flag in used if flag not in offered]


COMMANDS = _compose_commands()


SERVICES = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
DOCKERFILE = (REPO / "Dockerfile").read_text()


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _agents() -> dict[str, dict]:
    return {n: s for n, s in SERVICES.items() if (s.get("command") or [""])[0] == "tessera-agent"}


def test_the_compose_file_runs_every_tessera_process_and_checks_each_one():
    names = {where.split(":")[0] for where, _ in COMMANDS}
    assert {"migrate", "web", "worker", "beat", "agent-sim-01"} <= names
    checked = {where.split(":")[0] for where, _ in COMMANDS if where.endswith("healthcheck")}
    assert names - {"migrate"} <= checked


def test_web_s_healthcheck_is_liveness_on_healthz_never_readyz():
    test = SERVICES["web"]["healthcheck"]["test"]
    assert test[1:5] == ["python", "-m", "portal.health", "web"]
    assert _flag(test, "--url") == "http://localhost:8000/healthz"
    assert not any("readyz" in part for part in test)


def test_each_agent_is_checked_on_its_lease_in_the_work_dir_it_keeps_on_a_volume():
    assert _agents(), "no agent in the compose file"
    for name, service in _agents().items():
        work_dir = _flag(service["command"], "--work-dir")
        test = service["healthcheck"]["test"]
        assert test[1:5] == ["python", "-m", "portal.health", "agent"], name
        assert _flag(test, "--work-dir") == work_dir, name
        assert any(v.split(":")[1] == work_dir for v in service.get("volumes", [])), f"{name}: no volume"


def test_no_real_gpu_agent_runs_in_a_container_where_a_restart_would_kill_its_jobs():
    for name, service in _agents().items():
        assert _flag(service["command"], "--backend") == "sim", f"{name}: use deploy/systemd for real GPUs"
        assert "devices" not in str(service.get("deploy", {})), name
    unit = (REPO / "deploy" / "systemd" / "tessera-agent.service").read_text()
    assert "\nKillMode=process\n" in unit


def test_one_beat_and_a_lock_behind_it():
    beat = SERVICES["beat"]
    assert beat["deploy"]["replicas"] == 1
    assert _flag(beat["command"], "-S") == "portal.beat:SingleBeatScheduler"
    module, cls = _flag(beat["command"], "-S").split(":")
    assert getattr(__import__(module, fromlist=[cls]), cls).__name__ == cls


def test_web_and_worker_write_their_metrics_files_each_to_a_directory_of_its_own():
    shared = {SERVICES[n]["environment"].get("TESSERA_METRICS_SHARED_DIR") for n in ("web", "worker")}
    assert len(shared) == 1 and None not in shared
    (path,) = shared
    for name, service in SERVICES.items():
        env = service.get("environment") or {}
        # The entrypoint sets PROMETHEUS_MULTIPROC_DIR per container; set for all, web and worker (both pid 1)
        # would write the same files.
        assert "PROMETHEUS_MULTIPROC_DIR" not in env, name
        if name in ("web", "worker"):
            assert any(v.split(":")[1] == path for v in service["volumes"]), name
    assert 'ENTRYPOINT ["python", "-m", "scheduling.observability.metrics_dir", "--"]' in DOCKERFILE


def test_the_image_installs_its_dependencies_under_the_lock():
    assert re.search(r"^COPY [^\n]*\brequirements\.lock\b", DOCKERFILE, re.MULTILINE)
    installs = re.findall(r"pip install [^\n]*", DOCKERFILE)
    assert installs and all("-c requirements.lock" in line for line in installs), installs


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_every_compose_command_uses_only_flags_its_program_has(where, argv):
    assert flag_problems(argv) == [], where


@pytest.mark.parametrize(
    ("argv", "bad"),
    [
        (["tessera-agent", "run", "--node", "gpu-01", "--fence-after-s", "40"], "--fence-after-s"),
        (["celery", "-A", "portal", "worker", "--concurency", "2"], "--concurency"),
        (["daphne", "-b", "0.0.0.0", "--prot", "8000", "portal.asgi:application"], "--prot"),
        (["python", "manage.py", "migrate", "--no-inptu"], "--no-inptu"),
        (["python", "-m", "portal.health", "beat", "--max-age", "60"], "--max-age"),
    ],
)
def test_the_check_catches_a_flag_the_program_does_not_have(argv, bad):
    problems = flag_problems(argv)
    assert problems and bad in problems[0], problems


# Other programs' flags the agent docs name: what a gang's launcher inside the job (torchrun, deepspeed) is given,
# and iptables' owner match for firewalling the jobs' uids from the portal's services.
LAUNCHERS_FLAGS = {"--nproc-per-node", "--nnodes", "--node-rank", "--hostfile", "--uid-owner"}
# Apptainer's and nvidia-ctk's, for jobs in images (agent/containers.py; the CDI spec): not installed here, so
# named, not asked. Podman's are asked of the host's podman.
APPTAINER_FLAGS = {
    "--containall",
    "--cleanenv",
    "--no-home",
    "--nv",
    "--net",
    "--network",
    "--bind",
    "--pwd",
    "--env",
}
NVIDIA_CTK_FLAGS = {"--output"}


def test_every_flag_the_agent_docs_name_exists():
    text = (REPO / "docs" / "agent.md").read_text()
    programs = [
        ["tessera-agent", "run"],
        ["tessera-agent", "check"],
        ["python", "-m", "bench.agent_sampling"],
        ["daphne"],  # --websocket-max-message-size, the frame limit's origin
    ]
    offered: set[str] = set()
    for argv in programs:
        run = _help(argv)
        offered |= set(_OPTION.findall(run.stdout + run.stderr))
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))
    if not shutil.which("podman"):
        pytest.skip("podman is not installed: the flags docs/agent.md gives it cannot be checked")
    podman = subprocess.run(["podman", "run", "--help"], capture_output=True, text=True, timeout=60)
    offered |= set(_OPTION.findall(podman.stdout))
    assert named - offered - LAUNCHERS_FLAGS - APPTAINER_FLAGS - NVIDIA_CTK_FLAGS == set()
