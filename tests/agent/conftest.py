"""Fixtures for the node agent's tests: the recorded H200 NVML fixture behind a fake pynvml, job helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from agent.testing import fake_pynvml

REPO = Path(__file__).resolve().parents[2]


def fixture_dir() -> Path:
    return Path(os.environ.get(fake_pynvml.ENV_FIXTURE) or REPO / "../shared/fixtures/nvml-h200")


@pytest.fixture
def h200_dir() -> Path:
    d = fixture_dir()
    if not (d / "nvml_snapshot.json").exists():
        pytest.skip(f"NVML fixture not found at {d} (set {fake_pynvml.ENV_FIXTURE} to its directory)")
    return d


@pytest.fixture
def fake_nvml(h200_dir, monkeypatch):
    """The fake pynvml in sys.modules['pynvml'] for the duration of a test."""
    mod = fake_pynvml.build(h200_dir)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod
