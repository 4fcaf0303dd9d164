"""Helpers shared by the agent's tests (a module of its own: `conftest` is not importable by name)."""

from __future__ import annotations

import sys

from tests.support import wait_for  # noqa: F401 - the agent tests import it from here


def py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)
