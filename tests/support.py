"""Helpers the tests and the benchmarks share: waiting with a deadline, ports for servers, percentiles."""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

from scheduling.sim.metrics import percentile as _percentile

# Every wait_for gives up only after timeout_s x this: waits end as soon as their condition holds, so a slow
# machine costs time, not a false failure. TESSERA_TEST_TIMEOUT_SCALE=1 keeps the bare figures.
TIMEOUT_SCALE = float(os.environ.get("TESSERA_TEST_TIMEOUT_SCALE", "3"))


def wait_for(
    what: str, predicate: Callable[[], Any], *, timeout_s: float = 10.0, interval_s: float = 0.05
) -> Any:
    """Poll `predicate` until it returns something true, and return that; fail past the (scaled) deadline."""
    timeout_s *= TIMEOUT_SCALE
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a server that takes a port number (daphne, redis-server, Prometheus)
    and that a test may stop and start again at the same address. The kernel hands it out for an ephemeral bind
    and takes it back; the caller then waits for its own server to answer there."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def percentile(values: Iterable[float], pct: float) -> float:
    """The pct-th percentile (pct in 0..100, linear between ranks, as the simulator's figures); NaN for none."""
    value = _percentile(list(values), pct)
    return math.nan if value is None else value
