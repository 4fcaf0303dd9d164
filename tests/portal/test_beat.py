"""Two real beats against the real Redis: only the one holding the beat lock sends periodic tasks; the other
stands by and takes over once the first is gone (portal/beat.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from portal.beat import LOCK_KEY
from tests.support import holds_for, wait_for

REPO = Path(__file__).resolve().parents[2]
TTL_S = 3


@pytest.fixture
def broker():
    if not settings.REDIS_URL:
        pytest.skip("needs Redis: set REDIS_URL")
    from scheduling.coordination import redis_client

    r = redis_client()

    def clean():
        r.delete(LOCK_KEY, *r.keys("celery*"))

    clean()
    yield r
    clean()


def _senders(r) -> dict[int, int]:
    """pid -> periodic tasks it has published (Celery's `origin` header is gen<pid>@<host>)."""
    counts: dict[int, int] = {}
    for key in r.keys("celery*"):
        if r.type(key) != b"list":
            continue
        for raw in r.lrange(key, 0, -1):
            origin = json.loads(raw)["headers"].get("origin", "")
            if origin.startswith("gen") and "@" in origin:
                pid = int(origin[3 : origin.index("@")])
                counts[pid] = counts.get(pid, 0) + 1
    return counts


def _beat(tmp_path: Path, name: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "REDIS_URL": settings.REDIS_URL,
        "TESSERA_CYCLE_INTERVAL_S": "1",
        "TESSERA_BEAT_LOCK_TTL_S": str(TTL_S),
    }
    return subprocess.Popen(
        [
            str(Path(sys.executable).parent / "celery"),
            "-A",
            "portal",
            "beat",
            "-S",
            "portal.beat:SingleBeatScheduler",
            "-s",
            str(tmp_path / f"{name}-schedule"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / f"{name}.log", "w"),  # noqa: SIM115 - closed with the process
    )


@pytest.mark.timeout(120, func_only=True)
def test_a_second_beat_sends_nothing_while_the_first_holds_the_lock_and_takes_over_when_it_dies(
    broker, tmp_path
):
    first = _beat(tmp_path, "first")
    second = None
    try:
        wait_for("the first beat to send its ticks", lambda: _senders(broker).get(first.pid), timeout_s=60)
        second = _beat(tmp_path, "second")
        # Three lock lifetimes with both running: the second sends nothing, the first keeps sending.
        sent_before = _senders(broker)[first.pid]
        holds_for(
            "the second beat standing by", lambda: second.pid not in _senders(broker), for_s=3 * TTL_S + 3
        )
        assert second.poll() is None, (tmp_path / "second.log").read_text()[-2000:]
        assert _senders(broker)[first.pid] > sent_before
        assert f"pid {first.pid}".encode() in broker.get(LOCK_KEY)

        first.send_signal(signal.SIGKILL)  # no clean release: the lock must expire
        first.wait(timeout=30)
        wait_for(
            "the second beat to take over",
            lambda: _senders(broker).get(second.pid),
            timeout_s=TTL_S + 30,
        )
        assert f"pid {second.pid}".encode() in broker.get(LOCK_KEY)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
    # Stopped cleanly, the holder let the lock go at once.
    assert broker.get(LOCK_KEY) is None
