"""The containers' healthchecks (`python -m portal.health`) against the real processes: daphne, a Celery worker
and beat; and each says so when its process is not there."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

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
