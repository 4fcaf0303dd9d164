"""Helpers the tests and the benchmarks share: waiting with a deadline, ports for servers, percentiles."""

from __future__ import annotations

import asyncio
import inspect
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


async def wait_for_async(
    what: str, predicate: Callable[[], Any], *, timeout_s: float = 10.0, interval_s: float = 0.05
) -> Any:
    """As wait_for, inside an event loop (which runs on meanwhile); `predicate` may return an awaitable."""
    timeout_s *= TIMEOUT_SCALE
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(interval_s)


def holds_for(what: str, predicate: Callable[[], Any], *, for_s: float, interval_s: float = 0.1) -> None:
    """Check that `predicate` stays true for `for_s` seconds, failing at the first time it is not. For what must
    not happen during a span the scenario itself sets (an outage, a fence), not for a guess at how long
    something takes: that is wait_for's."""
    end = time.monotonic() + for_s
    while True:
        assert predicate(), f"{what}: no longer so {for_s - (end - time.monotonic()):.1f} s in"
        if time.monotonic() >= end:
            return
        time.sleep(min(interval_s, max(0.0, end - time.monotonic())))


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


# Debian's Chromium, driven by Playwright (never `playwright install`). Without the background-networking flags
# it keeps dialling out of this closed network; the rest is what headless runs in a container want.
CHROMIUM = os.environ.get("TESSERA_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def launch_chromium(playwright: Any) -> Any:
    """A headless Chromium from a `sync_playwright()` handle."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))


def sign_in(page: Any, username: str, password: str | None = None, *, landing: str = "/jobs/") -> Any:
    """Sign `page` in through the portal's form (password: `<username>-pw`, the test users'), landing on
    `landing`."""
    page.goto(f"/login/?next={landing}")
    page.fill("#id_username", username)
    page.fill("#id_password", password or f"{username}-pw")
    page.click("button[type=submit]")
    page.wait_for_url(f"**{landing}")
    return page
