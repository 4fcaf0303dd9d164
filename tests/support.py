"""Helpers the tests and the benchmarks share: waiting with a deadline, ports for servers, a recording HTTP server,
percentiles."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

from scheduling.sim.metrics import percentile as _percentile

# Every wait_for gives up only after timeout_s x this: waits end as soon as their condition holds, so a slow
# machine costs time, not a false failure. TESSERA_TEST_TIMEOUT_SCALE=1 keeps the bare figures.
TIMEOUT_SCALE = float(os.environ.get("TESSERA_TEST_TIMEOUT_SCALE", "3"))


def wait_for(
    what: str,
    predicate: Callable[[], Any],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.05,
    scale: bool = True,
) -> Any:
    """Poll `predicate` until it returns something true, and return that; fail past the deadline (scaled by
    TIMEOUT_SCALE unless `scale` is false: a benchmark's own limits are its figures')."""
    if scale:
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


def listening_socket(host: str = "127.0.0.1") -> socket.socket:
    """A TCP socket bound to a port of the kernel's choosing and listening, for a server that takes an open socket
    (daphne --fd, uvicorn fd=, asyncio sock=; to a child process through Popen's pass_fds). Whoever holds it
    holds the port: nothing else can take it between a server's stop and its restart, and connections made while
    no server runs wait in its backlog (as under systemd's socket activation) instead of being refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # Its port can be listened on again once it is closed, while the connections a killed server had accepted
    # (which inherit the option) are still closing.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def refusing_address(host: str = "127.0.0.1") -> tuple[socket.socket, str]:
    """A socket bound to a port and not listening, with its `host:port`: connections there are refused for as long
    as the socket is held (a server that does not answer; no other process can start one there meanwhile)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    return sock, f"{host}:{sock.getsockname()[1]}"


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a program that takes only a port number (redis-server, Prometheus, the
    embedded demo). The kernel hands it out for an ephemeral bind and takes it back, so another process may take
    it before the program binds it: start the program with `start_on_free_port`, which tries again when so."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


ADDRESS_IN_USE = (
    "address already in use"  # how redis-server, Prometheus and twisted say EADDRINUSE (any case)
)


def start_on_free_port(
    what: str,
    start: Callable[[int], Any],
    up: Callable[[Any], bool],
    failed: Callable[[Any], str | None],
    *,
    port: int | None = None,
    timeout_s: float = 30.0,
    stop: Callable[[Any], object] | None = None,
) -> tuple[Any, int]:
    """Start a program that takes only a port number and wait until it answers: `start(port)` starts it, `up(it)`
    says whether it answers, `failed(it)` what it said if it has exited (None while it runs). If it exited because
    the port was taken meanwhile, it is started again: on another free port, or on `port` itself when the caller
    must keep that one (a restart others know the address of). Returns what `start` returned and the port; on
    failure, `stop(it)` ends the one still running."""
    keep = port is not None
    port = port if keep else free_port()
    timeout_s *= TIMEOUT_SCALE
    deadline = time.monotonic() + timeout_s
    started = start(port)
    while True:
        if up(started):
            return started, port
        said = failed(started)
        if said is not None:
            if ADDRESS_IN_USE not in said.lower():
                raise AssertionError(f"{what} exited:\n{said[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: port {port} stayed taken for {timeout_s:.0f} s")
            port = port if keep else free_port()
            started = start(port)
        elif time.monotonic() > deadline:
            if stop is not None:
                stop(started)
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} to answer")
        time.sleep(0.1)


@dataclass
class Demo:
    """The embedded demo started as `make demo` starts it: its process (its group's leader), URL, what load_demo
    printed, and where it writes its log."""

    process: subprocess.Popen
    url: str
    port: int
    loaded: str
    log: Path


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def demo_start(env: dict[str, str], cwd: Path, log: Path, *, timeout_s: float = 30.0) -> Demo:
    """migrate, load_demo, then run_demo on a free port (started again elsewhere if another process took it
    meanwhile) in a process group of its own, until /healthz answers; `env` says where its database lives. On
    failure the demo is stopped and the error says what it printed."""
    import requests

    manage = [sys.executable, "manage.py"]
    loaded = ""
    for step in (["migrate", "--noinput", "-v0"], ["load_demo"]):
        done = subprocess.run([*manage, *step], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"manage.py {step[0]}:\n{done.stdout}\n{done.stderr}"
        loaded = done.stdout

    def start(port: int) -> tuple[subprocess.Popen, int]:
        with log.open("w") as out:
            process = subprocess.Popen(
                [*manage, "run_demo", "--host", "127.0.0.1", "--port", str(port)],
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # As a terminal starts it: Ctrl-C (SIGINT) handled, even where this run ignores it (a shell's
                # background job does, and its children inherit that).
                preexec_fn=_sigint_default,
            )
        return process, port

    def answers(started: tuple[subprocess.Popen, int]) -> bool:
        try:  # a loaded machine answers its first requests late: waited for, with a clear failure
            return requests.get(f"http://127.0.0.1:{started[1]}/healthz", timeout=10).ok
        except requests.RequestException:
            return False

    def exited_saying(started: tuple[subprocess.Popen, int]) -> str | None:
        return None if started[0].poll() is None else log.read_text()

    def kill(started: tuple[subprocess.Popen, int]) -> None:
        if started[0].poll() is None:
            os.killpg(started[0].pid, signal.SIGKILL)
            started[0].wait()

    (process, port), _ = start_on_free_port(
        "the embedded demo", start, answers, exited_saying, timeout_s=timeout_s, stop=kill
    )
    return Demo(process=process, url=f"http://127.0.0.1:{port}", port=port, loaded=loaded, log=log)


# For tests in which people's passwords are no part of what is tried: new passwords are hashed with MD5 (the
# production hasher's deliberate slowness cost each user a fixture makes 0.7 s), passwords already stored with the
# production hasher still check.
FAST_PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.MD5PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]


class RecordingHttpServer:
    """A real HTTP server on 127.0.0.1, on a thread of this process, that records every request it is sent and
    answers `status` (with `location`, for a redirect). `requests`: (method, path) of each, whatever the method;
    `received`: the JSON bodies POSTed. `close()` stops it."""

    def __init__(self, status: int = 200, location: str = ""):
        self.status, self.location = status, location
        self.requests: list[tuple[str, str]] = []
        self.received: list[Any] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                server.requests.append((self.command, self.path))
                length = int(self.headers.get("Content-Length") or 0)
                if self.command == "POST" and length:
                    server.received.append(json.loads(self.rfile.read(length)))
                self.send_response(server.status)
                if server.location:
                    self.send_header("Location", server.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_PUT = _answer  # noqa: N815 - http.server's names

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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


def session_cookie(username: str, url: str) -> dict[str, str]:
    """A browser cookie of a session signed in as `username`, made as Django's test client's force_login makes one
    (in the database the servers share): for tests whose subject is not signing in, which the form's password
    check would cost most of a second each."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    name = settings.SESSION_COOKIE_NAME
    return {"name": name, "value": client.cookies[name].value, "url": url}


def sign_in(page: Any, username: str, password: str | None = None, *, landing: str = "/jobs/") -> Any:
    """Sign `page` in through the portal's form (password: `<username>-pw`, the test users'), landing on
    `landing`."""
    page.goto(f"/login/?next={landing}")
    page.fill("#id_username", username)
    page.fill("#id_password", password or f"{username}-pw")
    page.click("button[type=submit]")
    page.wait_for_url(f"**{landing}")
    return page


BUSYBOX_IMAGE = "localhost/tessera-test-busybox:1"


def busybox_image() -> str:
    """A container image made here, with no registry: Debian's static busybox with every applet linked in /bin
    (`podman import`). Skips the test where this host cannot make it."""
    import shutil
    import tarfile
    import tempfile

    import pytest

    if shutil.which("podman") is None or os.geteuid() != 0:
        pytest.skip(
            "jobs in images need rootful Podman: root and podman (.ci/run installs it; CI runs as root)"
        )
    if subprocess.run(["podman", "image", "exists", BUSYBOX_IMAGE], check=False).returncode == 0:
        return BUSYBOX_IMAGE
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        pytest.skip("no /bin/busybox (Debian's busybox-static) to build the test image from")
    applets = subprocess.run(
        [str(busybox), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = Path(tmp) / "rootfs.tar"
        with tarfile.open(tar_path, "w") as tar:
            for d in ("bin", "tmp", "etc", "proc", "sys", "dev"):
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
                tar.addfile(info)
            tar.add(busybox, arcname="bin/busybox")
            for applet in applets:
                if applet != "busybox":
                    link = tarfile.TarInfo(f"bin/{applet}")
                    link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                    tar.addfile(link)
        subprocess.run(
            ["podman", "import", "--change", "ENV PATH=/bin", str(tar_path), BUSYBOX_IMAGE],
            check=True,
            capture_output=True,
        )
    return BUSYBOX_IMAGE
