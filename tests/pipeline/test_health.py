"""The containers' healthchecks (`python -m portal.health`) against the real processes: daphne, a Celery worker
and beat; and each says so when its process is not there."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.pipeline.harness import REPO


def _health(pipe, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "portal.health", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **pipe.env},
        timeout=60,
    )


@pytest.mark.timeout(120, func_only=True)  # 15-40 s on a loaded machine
def test_web_worker_and_beat_are_healthy_while_they_run(pipe):
    checks = {
        "web": ["web", "--url", f"http://127.0.0.1:{pipe.port}/healthz"],
        "worker": ["worker", "--node", f"worker@{socket.gethostname()}"],
        "beat": ["beat"],
    }
    results = {name: _health(pipe, *args) for name, args in checks.items()}
    assert {name: (r.returncode, r.stdout.strip()) for name, r in results.items()} == {
        name: (0, "ok") for name in checks
    }, {name: r.stderr for name, r in results.items()}


def test_a_missing_web_or_worker_is_unhealthy_and_says_why(pipe):
    web = _health(pipe, "web", "--url", "http://127.0.0.1:9/healthz", "--timeout-s", "2")
    worker = _health(pipe, "worker", "--node", f"nobody@{socket.gethostname()}", "--timeout-s", "1")
    assert web.returncode == 1 and "unhealthy: http://127.0.0.1:9/healthz" in web.stderr
    assert worker.returncode == 1 and f"worker nobody@{socket.gethostname()} did not answer" in worker.stderr


@pytest.mark.timeout(120, func_only=True)  # 20-30 s
def test_readyz_is_ready_while_all_runs_and_says_the_scheduler_stopped_when_the_worker_does(pipe):
    import requests

    from tests.pipeline.harness import wait_for

    url = f"http://127.0.0.1:{pipe.port}/readyz"
    ready = requests.get(url, timeout=10)
    assert ready.status_code == 200, ready.text
    assert {name: c["ok"] for name, c in ready.json()["checks"].items()} == {
        "database": True,
        "redis": True,
        "cycle": True,
        "beat": True,
    }
    pipe.procs["worker"].stop()
    try:
        # Cycles every second here: three intervals (+10 s) without one and the portal is not ready.
        wait_for(
            "/readyz to say the scheduler stopped",
            lambda: requests.get(url, timeout=10).status_code == 503,
            timeout_s=40,
        )
        answer = requests.get(url, timeout=10).json()
        assert answer["ready"] is False and answer["checks"]["database"]["ok"]
        assert "the scheduler is not running" in answer["checks"]["cycle"]["detail"]
        web = _health(pipe, "web", "--url", url, "--timeout-s", "5")
        assert web.returncode == 1 and "cycle: No scheduling cycle for" in web.stderr
        assert requests.get(f"http://127.0.0.1:{pipe.port}/healthz", timeout=10).status_code == 200  # alive
    finally:
        pipe.start_worker()
    wait_for(
        "/readyz to be ready again", lambda: requests.get(url, timeout=10).status_code == 200, timeout_s=40
    )
