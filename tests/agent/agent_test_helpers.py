"""Helpers shared by the agent's tests (a module of its own: `conftest` is not importable by name)."""

from __future__ import annotations

import sys
import time


def py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.02):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s} s")
