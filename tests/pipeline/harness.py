"""A real little cluster for end-to-end tests: daphne, a Celery worker and beat, and simulated node agents,
all as separate processes against the test database and Redis, so failures can be injected with kill -9."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import OperationalError, connection, transaction

from agent import procfs
from portal import database
from tests.support import (  # noqa: F401 - the pipeline tests import wait_for and TIMEOUT_SCALE from here
    TIMEOUT_SCALE,
    listening_socket,
    start_on_free_port,
    wait_for,
)

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# Short timeouts so failures show within seconds; the production defaults are in docs/operations.md. Agents
# heartbeat each second here, so a node is lost after ten missed heartbeats: short, yet not so short that a
# busy, throttled 2-core CI machine loses nodes that are only slow.
NODE_LOST_AFTER_S = 10.0
# A job's supervisor stops it this long after the portal last acknowledged its node; its placement elsewhere waits
# this plus the job's grace and the margin (production: 600 s and 30 s, docs/operations.md).
# TESSERA_TEST_FENCE_AFTER_S sets another, for measurements with longer outages (docs/operations.md).
FENCE_AFTER_S = float(os.environ.get("TESSERA_TEST_FENCE_AFTER_S", "20"))
FENCE_MARGIN_S = 2.0
# An agent's reconnect backoff starts afresh only after a session this long (agent/transport.py: run_agent's
# healthy_after_s); after shorter ones it doubles, up to the heartbeat interval (1 s here).
AGENT_HEALTHY_AFTER_S = 10.0
ENV = {
    "TESSERA_NODE_LOST_AFTER_S": str(NODE_LOST_AFTER_S),
    "TESSERA_AGENT_FENCE_AFTER_S": str(FENCE_AFTER_S),
    "TESSERA_FENCE_MARGIN_S": str(FENCE_MARGIN_S),
    # Jobs run as the agents' user: as root they would get users of their own, who may not enter pytest's
    # temporary directories (tests/agent/test_agent_isolation.py runs jobs isolated).
    "TESSERA_AGENT_JOB_USERS": "agent",
    "TESSERA_WATCHDOG_INTERVAL_S": "0.5",
    "TESSERA_CYCLE_INTERVAL_S": "1",
    "TESSERA_CYCLE_LOCK_TTL_S": "3",
    "TESSERA_CYCLE_DEBOUNCE_S": "0.02",
    # Preemption tests cannot wait the production minimum runtime (5 minutes) before a job may be evicted.
    "TESSERA_SCHEDULER_PARAMS": json.dumps({"min_runtime_s": 0}),
    # Every simulated node is this host: sessions' proxy goes to 127.0.0.1.
    "TESSERA_SESSION_ALLOW_LOOPBACK": "1",
    # The idle tests run the idle check themselves, when their scenario wants it: beat's would race them.
    "TESSERA_IDLE_CHECK_INTERVAL_S": "3600",
    "LOG_LEVEL": "INFO",
}

SIM_NODE = """\
node: {name}
gpus:
  - {{model: NVIDIA A100-SXM4-80GB, count: 2, memory_mib: 81920, compute_capability: "8.0", numa_node: 0,
     sharing: exclusive}}
  - {{model: NVIDIA L4, count: 1, memory_mib: 23034, compute_capability: "8.9", numa_node: 0, sharing: mps}}
nvlink:
  - {{group: [0, 1], links: 12}}
"""

# Other node layouts a cluster may ask for (`Cluster.layouts`): what the simulated agent reports, and the cards the
# inventory registers for it, (portal model name, agent model name, memory MiB, compute capability, sharing,
# count, NVLink-joined).
LAYOUTS = {
    "h100x8": ("H100-80GB", "NVIDIA H100 80GB HBM3", 81559, "9.0", "exclusive", 8, True),
    "l4x2": ("L4", "NVIDIA L4", 23034, "8.9", "exclusive", 2, False),
}


def _sim_layout(name: str, layout: str) -> str:
    _, agent_model, memory, cc, sharing, count, linked = LAYOUTS[layout]
    text = (
        f"node: {name}\ngpus:\n  - {{model: {agent_model}, count: {count}, memory_mib: {memory}, "
        f'compute_capability: "{cc}", numa_node: 0, sharing: {sharing}}}\n'
    )
    if linked:
        text += f"nvlink:\n  - {{group: [{', '.join(str(i) for i in range(count))}], links: 18}}\n"
    return text


def _redis_ping(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def database_url() -> str:
    d = connection.settings_dict
    auth = d["USER"] + (f":{d['PASSWORD']}" if d.get("PASSWORD") else "")
    return f"postgres://{auth}@{d['HOST'] or '127.0.0.1'}:{d['PORT'] or 5432}/{d['NAME']}"


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    pass_fds: tuple[int, ...] = ()  # open sockets it is handed (a listening one, for daphne's --fd)
    popen: subprocess.Popen | None = None
    log_from: int = 0  # where this start's output begins in its log

    def start(self) -> Proc:
        out = open(self.log, "ab")  # noqa: SIM115 - the child keeps it
        self.log_from = out.tell()
        self.popen = subprocess.Popen(
            self.argv,
            cwd=REPO,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=self.pass_fds,
        )
        return self

    def exited_saying(self) -> str | None:
        """What this start wrote before it exited; None while it runs."""
        if self.alive:
            return None
        with open(self.log, "rb") as f:
            f.seek(self.log_from)
            return f.read().decode(errors="replace")

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        if self.alive:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, timeout_s: float = 10) -> None:
        if not self.alive:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill9()

    def log_size(self) -> int:
        """Where the log ends now: `written_since(log_size())` later reads what came after."""
        try:
            return self.log.stat().st_size
        except FileNotFoundError:
            return 0

    def written_since(self, offset: int) -> str:
        try:
            with open(self.log, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


@dataclass
class Cluster:
    root: Path
    # The web's listening socket, held for the cluster's life and handed to every daphne it starts (--fd): no other
    # process can take its port between a web's kill and its restart, and while no web runs, connections wait in
    # its backlog (as under systemd's socket activation) rather than being refused.
    web_socket: socket.socket = field(default_factory=listening_socket)
    web_started_at: float = 0.0  # monotonic, the last start_web
    web_boot_s: float | None = None  # how long the last started daphne took to answer (wait_web_answers)
    procs: dict[str, Proc] = field(default_factory=dict)
    nodes: tuple[str, ...] = ("pipe-a", "pipe-b")
    # node -> a layout of LAYOUTS; the others have two NVLinked A100s and an MPS L4 (SIM_NODE).
    layouts: dict[str, str] = field(default_factory=dict)
    agent_sample_s: float = 0.2
    extra_env: dict[str, str] = field(default_factory=dict)
    redis_port: int | None = None  # a private redis-server (start_redis); None: settings.REDIS_URL
    redis: Proc | None = None  # the private redis-server running now (start_redis replaces it)
    restarted: list[str] = field(default_factory=list)  # Celery processes restart_exited_celery started again

    def __post_init__(self) -> None:
        self._web_port = self.web_socket.getsockname()[1]

    @property
    def port(self) -> int:
        return self._web_port

    def drop_web(self) -> None:
        """Kill daphne and stop listening: until start_web, connections to the portal are refused, as when a web
        host is down (without a socket held for it, they would wait in its backlog instead)."""
        self.procs["web"].kill9()
        self.web_socket.close()

    def web_answers(self) -> bool:
        """Whether the web answers HTTP now (GET /healthz); records how long its start took the first time."""
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as response:
                answered = response.status == 200
        except (OSError, urllib.error.URLError):
            return False
        if answered and self.web_boot_s is None:
            self.web_boot_s = time.monotonic() - self.web_started_at
        return answered

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0" if self.redis_port else settings.REDIS_URL

    def start_redis(self) -> Proc | None:
        """A Redis of our own (`self.redis`), so the tests may restart it; None where redis-server is not installed."""
        exe = shutil.which("redis-server")
        if exe is None:
            return None

        def start(port: int) -> Proc:
            self.redis_port = port
            argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            # The one a test killed is replaced: a later test's kill must stop this one (it killed the dead one
            # instead, so its outage never happened and its restart, finding the port taken, left this one running).
            self.redis = self._proc("redis", argv)
            return self.redis

        # redis-server takes only a port number: tried again if another process took it meanwhile. A restart keeps
        # the port every process of the cluster was given.
        start_on_free_port(
            "redis-server",
            start,
            lambda _: _redis_ping(self.redis_url),
            Proc.exited_saying,
            port=self.redis_port,
            timeout_s=10,
        )
        return self.redis

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        env.update(ENV)
        env.update(self.extra_env)
        env.update(
            {
                "DATABASE_URL": database_url(),
                "REDIS_URL": self.redis_url,
                "TESSERA_LOG_DIR": str(self.root / "portal-logs"),
                # Shared by daphne and the worker, as in production: /metrics sums both processes' counters.
                "PROMETHEUS_MULTIPROC_DIR": str(self._prometheus_dir()),
                "DJANGO_SETTINGS_MODULE": "portal.settings",
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    def _prometheus_dir(self) -> Path:
        path = self.root / "prometheus"
        path.mkdir(exist_ok=True)
        return path

    def _proc(self, name: str, argv: list[str], pass_fds: tuple[int, ...] = (), **extra: str) -> Proc:
        proc = Proc(name, argv, {**self.env, **extra}, self.root / f"{name}.log", pass_fds=pass_fds)
        self.procs[name] = proc
        return proc.start()

    def start_web(self) -> Proc:
        if self.web_socket.fileno() == -1:  # dropped: listen again on the port every process was given
            self.web_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.web_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.web_socket.bind(("127.0.0.1", self._web_port))
            self.web_socket.listen(128)
        self.web_started_at, self.web_boot_s = time.monotonic(), None
        fd = self.web_socket.fileno()
        return self._proc(
            "web", [str(BIN / "daphne"), "--fd", str(fd), "portal.asgi:application"], pass_fds=(fd,)
        )

    def start_worker(self, name: str = "worker", **extra: str) -> Proc:
        argv = [
            str(BIN / "celery"),
            "-A",
            "portal",
            "worker",
            "--pool",
            "solo",
            "-n",
            f"{name}@%h",
            "-l",
            "INFO",
        ]
        return self._proc(name, argv, **extra)

    def start_beat(self) -> Proc:
        argv = [
            str(BIN / "celery"),
            "-A",
            "portal",
            "beat",
            "-l",
            "INFO",
            "-s",
            str(self.root / "beat-schedule"),
        ]
        return self._proc("beat", argv)

    def restart_exited_celery(self) -> list[str]:
        """Start again the Celery worker or beat that has exited, as production's supervisor does (docker-compose:
        restart: unless-stopped): Celery may exit on losing its Redis broker (a kombu failure mode,
        celery/celery#7705 and kin). The names restarted, also kept in `restarted`."""
        restarted = [name for name in ("worker", "beat") if name in self.procs and not self.procs[name].alive]
        for name in restarted:
            self.start_worker() if name == "worker" else self.start_beat()
        self.restarted.extend(restarted)
        return restarted

    def supervised(self, predicate: Callable[[], object]) -> Callable[[], object]:
        """`predicate` for wait_for, checked after restarting whatever Celery process has exited."""

        def check() -> object:
            self.restart_exited_celery()
            return predicate()

        return check

    def nodes_ready(self, *, heard_since: datetime | None = None) -> bool:
        """Whether every node of the cluster is ready and its agent heard: since `heard_since` (it came back after
        an outage), or within half the time after which a node is lost. What a test should leave for the next."""
        from django.utils import timezone

        from scheduling.choices import NodeState
        from scheduling.inventory.models import Node

        since = heard_since or timezone.now() - timedelta(seconds=NODE_LOST_AFTER_S / 2)
        nodes = list(Node.objects.filter(name__in=self.nodes))
        return len(nodes) == len(self.nodes) and all(
            n.state == NodeState.READY and n.last_heartbeat_at is not None and n.last_heartbeat_at > since
            for n in nodes
        )

    def agents_settled(self) -> bool:
        """Whether every node is ready and its agent connected for long enough that its reconnect backoff starts
        afresh: a test that drops the web then silences each agent for the outage and a first retry, however short
        the sessions some earlier outage left it."""
        from django.utils import timezone

        from scheduling.cycle.models import NodeSync

        since = timezone.now() - timedelta(seconds=AGENT_HEALTHY_AFTER_S)
        syncs = list(NodeSync.objects.filter(node__name__in=self.nodes))
        return (
            self.nodes_ready()
            and len(syncs) == len(self.nodes)
            and all(s.connected_at is not None and s.connected_at <= since for s in syncs)
        )

    def work_dir(self, node: str) -> Path:
        return self.root / "agents" / node

    def start_agent(self, node: str) -> Proc:
        sim = self.root / f"{node}.yaml"
        if not sim.exists():
            layout = self.layouts.get(node)
            sim.write_text(_sim_layout(node, layout) if layout else SIM_NODE.format(name=node))
        argv = [
            str(BIN / "tessera-agent"),
            "run",
            "--backend",
            "sim",
            "--sim-config",
            str(sim),
            "--node",
            node,
            "--address",  # every simulated node is this host: gang members meet on loopback
            "127.0.0.1",
            "--portal",
            f"http://127.0.0.1:{self.port}",
            "--token-file",
            str(self.root / f"{node}.token"),
            "--work-dir",
            str(self.work_dir(node)),
            "--heartbeat-s",
            "1",
            "--sample-s",
            str(self.agent_sample_s),
        ]
        return self._proc(f"agent-{node}", argv)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.stop()

    def kill_job_processes(self) -> None:
        """Jobs and their supervisors outlive their agent by design; the tests' leftovers must not outlive the
        tests."""
        for launch in (self.root / "agents").glob("*/jobs/*/*/launch.json"):
            try:
                record = json.loads(launch.read_text())
                job = json.loads((launch.parent / "job.json").read_text())
                if procfs.is_same_process(int(record["pid"]), record.get("start_ticks")):
                    os.kill(int(record["pid"]), signal.SIGKILL)
                os.killpg(int(job["pgid"]), signal.SIGKILL)
            except (OSError, ValueError, KeyError, TypeError):
                pass

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.tail()}" for p in self.procs.values())

    # -- what the agents did, from their own records on disk ---------------------------------------------------
    def placements_on(self, node: str, job_id: int) -> dict[int, dict]:
        """attempt -> {"launches": n, "outcome": {...} or None} for one job on one node."""
        out = {}
        for attempt_dir in sorted((self.work_dir(node) / "jobs" / str(job_id)).glob("*")):
            if not attempt_dir.is_dir():
                continue
            outcome = attempt_dir / "outcome.json"
            out[int(attempt_dir.name)] = {
                "launched": (attempt_dir / "launch.json").exists(),
                "outcome": json.loads(outcome.read_text()) if outcome.exists() else None,
            }
        return out


def seed(cluster: Cluster) -> dict:
    """Two nodes (2 NVLinked A100s + 1 MPS L4 each) with agent tokens on disk, a team, two priority classes."""
    from django.contrib.auth import get_user_model

    from quotas.models import PriorityClass, Quota, TeamPriorityClass
    from quotas.services import membership_set, priority_class_grant_save, quota_save, team_create
    from scheduling.choices import LinkKind, SharingMode
    from scheduling.inventory.models import Gpu, GpuLink, GpuModel, Node
    from scheduling.inventory.services import node_issue_token

    a100 = GpuModel.objects.create(
        name="A100-80GB",
        memory_mib=81920,
        compute_capability=Decimal("8.0"),
        sharing_modes=["exclusive", "mps"],
    )
    l4 = GpuModel.objects.create(
        name="L4", memory_mib=23034, compute_capability=Decimal("8.9"), sharing_modes=["exclusive", "mps"]
    )
    for name in cluster.nodes:
        if name in cluster.layouts:
            _seed_layout(name, cluster.layouts[name], cluster.root)
            continue
        node = Node.objects.create(name=name, cpu_milli=64_000, memory_mib=512 * 1024)
        gpus = [
            Gpu.objects.create(
                node=node, index=i, uuid=f"unreported-{name}-{i}", model=a100, memory_mib=81920
            )
            for i in range(2)
        ]
        Gpu.objects.create(
            node=node,
            index=2,
            uuid=f"unreported-{name}-2",
            model=l4,
            memory_mib=23034,
            sharing_mode=SharingMode.MPS,
        )
        GpuLink.objects.create(gpu_a=gpus[0], gpu_b=gpus[1], kind=LinkKind.NVLINK, nvlink_count=12)
        (cluster.root / f"{name}.token").write_text(node_issue_token(node=node))
    low = PriorityClass.objects.create(
        name="pipe-low", value=10, preemptible=True, preemption_grace_s=2, open_to_all_teams=True
    )
    high = PriorityClass.objects.create(
        name="pipe-high", value=1000, preemptible=False, preemption_grace_s=30
    )
    lab = team_create(slug="pipe-lab", display_name="Pipeline lab")
    priority_class_grant_save(grant=TeamPriorityClass(team=lab, priority_class=high), actor=None)
    quota_save(
        quota=Quota(
            team=lab,
            guaranteed_gpu_memory_mib=10 * 1024 * 1024,
            guaranteed_gpus=Decimal(100),
            default_priority_class=low,
        ),
        actor=None,
    )
    alice = get_user_model().objects.create_user(username="alice", password="alice-pw")
    membership_set(user=alice, team=lab)
    return {"alice": alice, "team": lab}


def _seed_layout(name: str, layout: str, root: Path) -> None:
    """A node of one of LAYOUTS in the inventory, with its agent token on disk."""
    from scheduling.choices import LinkKind
    from scheduling.inventory.models import Gpu, GpuLink, GpuModel, Node
    from scheduling.inventory.services import node_issue_token

    model_name, _, memory, cc, sharing, count, linked = LAYOUTS[layout]
    model, _ = GpuModel.objects.get_or_create(
        name=model_name,
        defaults={
            "memory_mib": memory,
            "compute_capability": Decimal(cc),
            "sharing_modes": ["exclusive", "mps"],
        },
    )
    node = Node.objects.create(name=name, cpu_milli=128_000, memory_mib=1024 * 1024)
    gpus = [
        Gpu.objects.create(
            node=node,
            index=i,
            uuid=f"unreported-{name}-{i}",
            model=model,
            memory_mib=memory,
            sharing_mode=sharing,
        )
        for i in range(count)
    ]
    if linked:
        for i, a in enumerate(gpus):
            for b in gpus[i + 1 :]:
                GpuLink.objects.create(gpu_a=a, gpu_b=b, kind=LinkKind.NVLINK, nvlink_count=18)
    (root / f"{name}.token").write_text(node_issue_token(node=node))


# -- job helpers -----------------------------------------------------------------------------------------------


def submit(pipe, **spec):
    """Submit as alice to the pipeline team; whole-GPU jobs go to the A100s unless told otherwise."""
    from scheduling.jobs.fields import JobSpec
    from scheduling.jobs.submit import job_submit

    spec.setdefault("name", "e2e")
    spec.setdefault("gpu_models", ("A100-80GB",))
    return job_submit(submitter=pipe.people["alice"], team=pipe.people["team"], spec=JobSpec(**spec))


def wait_state(job, *states: str, timeout_s: float = 20):
    def reached():
        job.refresh_from_db()
        return job.state in states

    try:
        wait_for(f"job #{job.pk} to reach {'/'.join(states)}", reached, timeout_s=timeout_s)
    except AssertionError as exc:
        from scheduling.inventory.models import Node

        nodes = dict(Node.objects.values_list("name", "state"))
        why = f"{job.pending_reason_code}: {job.pending_reason}" if job.state == "pending" else ""
        raise AssertionError(f"{exc} (it is {job.state} {why}; nodes {nodes})") from None
    return job


def path_of(job) -> list[str]:
    """The states a job went through, in order, from its events."""
    return list(job.events.order_by("at", "id").values_list("to_state", flat=True))


def forget_live_metrics(*names: str) -> None:
    """Drop the nodes' newest GPU samples, wherever this process keeps them (Redis, or memory embedded), and
    those still waiting to be written: a test that ended before its batch was flushed left them to the next
    test's event loop, which wrote them after this (a stale sample of a node that sent none)."""
    from scheduling.agents import live_metrics
    from scheduling.coordination import redis_client

    live_metrics._batch.waiting = [kept for kept in live_metrics._batch.waiting if kept[0] not in names]
    r = redis_client()
    if r is None:
        for name in names:
            live_metrics._local.pop(name, None)
    else:
        r.delete(*(live_metrics.live_metrics_key(name) for name in names))


def _use_redis(url: str):
    """Point this process (cycle requests, Celery, the channel layer) at the cluster's private Redis.
    Returns the undo."""
    from django.test import override_settings

    from portal.celery import app

    host = {"address": url, "socket_timeout": settings.CHANNEL_REDIS_SOCKET_TIMEOUT_S}
    layer = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [host]}}}
    overrides = override_settings(REDIS_URL=url, CELERY_BROKER_URL=url, CHANNEL_LAYERS=layer)
    overrides.enable()
    old_broker = app.conf.broker_url

    def point(broker: str) -> None:
        if app._pool is not None:
            app._pool.force_close_all()
        app.conf.broker_url = broker
        app._pool = None  # as Celery does after a fork: the next publish connects afresh
        app.amqp._producer_pool = None

    point(url)

    def undo() -> None:
        point(old_broker)
        overrides.disable()

    return undo


@contextlib.contextmanager
def running_cluster(
    django_db_blocker,
    root: Path,
    *,
    extra_seed: Callable[[Cluster], dict] | None = None,
    nodes: dict[str, str | None] | None = None,
):
    """The whole cluster for a package of tests: a private Redis where redis-server exists, daphne, a Celery
    worker and beat, and the agents of `seed`'s nodes (or of `nodes`: name -> a layout of LAYOUTS, None for the
    default one), with `extra_seed`'s people added. Everything it wrote is flushed at the end, as pytest-django's
    transactional tests do."""
    if not settings.REDIS_URL or not database.postgresql():
        pytest.skip(
            "the end-to-end pipeline needs PostgreSQL and Redis: set DATABASE_URL and REDIS_URL (make test)"
        )
    from scheduling.coordination import redis_client
    from scheduling.cycle.models import NodeSync
    from scheduling.cycle.requests import KEYS
    from scheduling.inventory.models import Gpu

    own_db = None
    if not connection.settings_dict["NAME"].startswith("test_"):
        # pytest-django sets up databases only for tests marked django_db, and these tests must not be: their
        # writes have to be committed for the other processes to see them. Alone in a session, set it up here.
        from django.test.utils import setup_databases

        with django_db_blocker.unblock():
            own_db = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    (root / "starts").mkdir()
    old_log_dir = getattr(settings, "TESSERA_LOG_DIR", None)
    settings.TESSERA_LOG_DIR = str(root / "portal-logs")
    settings.TESSERA_NODE_LOST_AFTER_S = NODE_LOST_AFTER_S
    settings.TESSERA_AGENT_FENCE_AFTER_S = FENCE_AFTER_S
    settings.TESSERA_FENCE_MARGIN_S = FENCE_MARGIN_S
    with django_db_blocker.unblock():
        c = Cluster(root)
        if nodes:
            c.nodes = tuple(nodes)
            c.layouts = {name: layout for name, layout in nodes.items() if layout}
        c.redis = c.start_redis()
        redirected = _use_redis(c.redis_url) if c.redis else None
        redis_client().delete(*KEYS)
        c.people = seed(c)
        if extra_seed is not None:
            c.people.update(extra_seed(c))
        try:
            c.start_web()
            # How long daphne takes to start here: a web outage's test counts it as part of the outage.
            wait_for("the web to answer", c.web_answers, timeout_s=60)
            c.start_worker()
            c.start_beat()
            for node in c.nodes:
                c.start_agent(node)
            wait_for(
                "every agent to say hello and report its GPUs",
                lambda: (
                    NodeSync.objects.filter(connected_at__isnull=False).count() == len(c.nodes)
                    and not Gpu.objects.filter(uuid__startswith="unreported-").exists()
                ),
                timeout_s=60,
            )
            yield c
        except BaseException:
            print(c.logs())
            raise
        finally:
            c.stop_all()
            c.web_socket.close()
            c.kill_job_processes()
            if redirected is not None:
                redirected()
            else:
                redis_client().delete(*KEYS)
            call_command("flush", interactive=False, verbosity=0)
            settings.TESSERA_LOG_DIR = old_log_dir
            if own_db is not None:
                from django.test.utils import teardown_databases

                teardown_databases(own_db, verbosity=0)


def cancel_live_jobs() -> None:
    """Cancel every live job in one commit, so no cycle hands the freed GPUs to a job about to be cancelled.

    It takes its locks in the cycle's order (nodes, then jobs by id, then GPUs): releasing two slices of one GPU
    in one transaction makes PostgreSQL check the GPU's node reference at commit (FOR KEY SHARE), which would
    wait on a cycle holding that node while the cycle waits on one of our jobs.
    """
    from scheduling import lock_objects
    from scheduling.jobs.models import Job
    from scheduling.jobs.states import LIVE_STATES, IllegalTransition
    from scheduling.jobs.transitions import job_cancel

    with transaction.atomic():
        list(lock_objects.nodes_for_update())
        live = list(Job.objects.select_for_update(of=("self",)).filter(state__in=LIVE_STATES).order_by("id"))
        for job in live:
            try:
                with transaction.atomic():
                    job_cancel(job=job, actor=None)
            except IllegalTransition:
                pass  # it finished meanwhile


def idle_again() -> None:
    """After a test: cancel every job it left alive and wait until every GPU is free."""
    from scheduling.inventory.models import Gpu

    for attempt in range(3):
        try:
            cancel_live_jobs()
            break
        except OperationalError as exc:  # a deadlock the database broke: the cleanup tries again
            print(f"cancelling the test's live jobs, attempt {attempt + 1}: {exc}")
    else:
        raise AssertionError("could not cancel the jobs this test left alive")
    wait_for(
        "the GPUs to be free again",
        lambda: not Gpu.objects.filter(allocated_memory_mib__gt=0).exists(),
        timeout_s=15,
    )
