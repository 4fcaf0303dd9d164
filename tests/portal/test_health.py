"""Beat's healthcheck: healthy only while beat's periodic cycle requests keep being published."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from celery.signals import before_task_publish
from django.conf import settings

from scheduling import coordination

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def redis():
    if not settings.REDIS_URL:
        pytest.skip("needs Redis: set REDIS_URL")
    import portal.celery  # noqa: F401 - connects the publish hook, as every Celery process does
    from scheduling.coordination import redis_client

    r = redis_client()
    r.delete(coordination.BEAT_MARK_KEY)
    yield r
    r.delete(coordination.BEAT_MARK_KEY)


def _beat_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "portal.health", "beat", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "REDIS_URL": settings.REDIS_URL},
        timeout=60,
    )


def test_beat_is_unhealthy_until_it_publishes_its_tick_and_again_once_it_stops(redis):
    never = _beat_check()
    assert never.returncode == 1 and "has not sent its periodic cycle request yet" in never.stderr
    # Another task published (as web and workers do) is not beat's tick.
    before_task_publish.send(sender="scheduling.tasks.run_cycle_task")
    assert _beat_check().returncode == 1
    before_task_publish.send(sender=coordination.BEAT_TICK_TASK)
    fresh = _beat_check("--max-age-s", "5")
    assert (fresh.returncode, fresh.stdout.strip()) == (0, "ok"), fresh.stderr
    redis.set(coordination.BEAT_MARK_KEY, repr(time.time() - 60))
    stale = _beat_check("--max-age-s", "30")
    assert stale.returncode == 1 and "more than 30 s" in stale.stderr


def _agent_check(work_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run(
        [sys.executable, "-m", "portal.health", "agent", "--work-dir", str(work_dir), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )


def test_an_agent_is_healthy_while_its_lease_is_fresh_and_unhealthy_once_it_is_stale(tmp_path):
    from agent.executor import Executor

    missing = _agent_check(tmp_path / "nothing-here")
    assert missing.returncode == 1 and "has not started" in missing.stderr
    executor = Executor(
        tmp_path
    )  # writes the lease as the running agent does, renewed on each acked heartbeat
    executor.renew_lease()
    fresh = _agent_check(tmp_path, "--max-age-s", "30")
    assert (fresh.returncode, fresh.stdout.strip()) == (0, "ok"), fresh.stderr
    lease = json.loads((tmp_path / "lease.json").read_text())
    lease["renewed_mono"] -= 120
    (tmp_path / "lease.json").write_text(json.dumps(lease))
    stale = _agent_check(tmp_path, "--max-age-s", "30")
    assert stale.returncode == 1 and "last renewed 120 s ago (more than 30 s)" in stale.stderr
