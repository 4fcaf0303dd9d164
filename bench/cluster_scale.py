"""A 1,000-node cluster end to end: PostgreSQL, Redis, daphne, a Celery worker and beat, and simulated nodes of 8
GPUs, each its own websocket with its own token, speaking the agent protocol. Prints JSON.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tessera_scale REDIS_URL=redis://127.0.0.1:6379/6 \\
        .venv/bin/python -m bench.cluster_scale --json [--nodes 1000 --pending 20000 --burst 2000]

It creates and drops its own database (<name>_bench next to DATABASE_URL's) and empties REDIS_URL's database
(defaults: postgres://postgres@127.0.0.1:5432/tessera_scale, redis://127.0.0.1:6379/6). Every process it starts
runs in a process group of its own and is killed on exit.

The simulated nodes (a few asyncio processes, each many websockets) send what agent/runtime.py sends: hello with
the node's inventory, a heartbeat every 5 s (its running placements, the desired version it holds), a metrics
message every second (MetricsBuffer's shape, 8 GPUs, the processes of the jobs there); they ack each desired
state, report each new placement started, and exited once its `sleep N` is over, and answer log requests.

Half the nodes are A100s, half H100s. The queue (`--pending`, bulk-inserted with the rows job_submit writes)
asks for A100s only: it fills them and the rest waits, so the H100 half stays free for what follows, with the
queue waiting throughout (full cycles score it whole; the cycles between them are incremental passes). In order:
- sweeps on the idle cluster, before the queue (`--array-tasks`, 0 for none): a 10,000-task array accepted in one
  request and the time until its first 8,000 tasks run, then cancelled; a `%50` array's most tasks active at
  once; a 1,000-job dependency chain (fan-out, fan-in) from first submit to last success (`sweeps`);
- the first cycle's phases at `--pending` (from the worker's own "cycle" log line: snapshot read, engine,
  apply), and the time until every placed job is reported running by its agent;
- a window of `--window-s` with only heartbeats and samples flowing (jobs running, none changing): daphne's
  CPU time / wall time, and database growth scaled to a day;
- `--singles` jobs submitted one at a time through the API with free capacity: submit-to-running, from the
  submit's commit to the agent's start report recorded (database timestamps);
- `--bursts` bursts of `--burst` submits through the API (8 clients), each timed the same way, and the cycles
  that placed them (placements per second applied);
- over the whole run: the nodes the watchdog declared lost (`nodes_lost`), and the tracebacks each of the portal's
  processes logged (`tracebacks_logged`).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.support import free_port, percentile, wait_for

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GPUS_PER_NODE = 8
# Each simulated process opens a connection this often (hosts booting): daphne drops a websocket its consumer has
# not accepted within 5 s (--websocket_connect_timeout), which a storm of 1,000 hellos at once makes happen.
CONNECT_EVERY_S = 0.04
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/tessera_scale"
# The simulated agents' samples per frame where the portal takes batches (agent/runtime.py metrics_batch_s);
# TESSERA_BENCH_NO_BATCHES=1 sends a frame a second, as agents before batches did.
BATCH_S = 5
BATCHES = os.environ.get("TESSERA_BENCH_NO_BATCHES", "") != "1"
# Where the portal takes them, the batch rides the heartbeat (one frame a node every 5 s);
# TESSERA_BENCH_NO_HEARTBEAT_SAMPLES=1 sends it in a frame of its own, as agents before that did.
HEARTBEAT_SAMPLES = os.environ.get("TESSERA_BENCH_NO_HEARTBEAT_SAMPLES", "") != "1"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/6"
TARGETS = {
    "cycle_total_s": 1.5,
    "placements_per_s": 2000,
    "submit_to_running_p99_s": 3.0,
    "agent_traffic_cpu_pct": 35.0,
    "engine_placements_per_s": 5000,
    "array_accept_s": 1.0,
    "array_first_8000_running_s": 20.0,
    "array_throttle_max_running": 50,
}


# --- /proc ----------------------------------------------------------------------------------------------------
def proc_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def proc_tree(pid: int) -> list[int]:
    tree = [pid]
    for child in proc_children(pid):
        tree += proc_tree(child)
    return tree


def peak_rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


# --- the simulated nodes (a child process: --sim-agents FILE) -------------------------------------------------
class SimNode:
    """One node's agent as the portal sees it: the real protocol, no real jobs."""

    def __init__(self, spec: dict, url: str, stats: dict) -> None:
        self.name, self.token, self.uuids = spec["name"], spec["token"], spec["uuids"]
        self.memory_mib = spec["memory_mib"]
        self.url, self.stats = url, stats
        self.desired_version: int | None = None
        self.jobs: dict[tuple[str, int], dict] = {}  # (job id, attempt) -> {"ends_at", "gpus", "pid", ...}
        self.finished: set[tuple[str, int]] = set()
        self.outbox: dict[str, dict] = {}  # reliable messages until acked
        self.seq = 0
        self.started_at = time.time()
        self.rng = random.Random(self.name)
        self.ws = None
        # As the agent: its samples in one frame every BATCH_S once the portal's hello ack says it takes them
        # (agent/protocol.py FEATURES), else a frame a second; --no-batches: always a frame a second.
        self.batches = False
        self.in_heartbeats = False  # the batch rides the heartbeat (FEATURES heartbeat_samples)
        self.batched: list[dict] = []
        from agent.transport import Backoff

        self.backoff = Backoff()

    async def send(self, msg: dict) -> None:
        from agent import protocol

        if msg["type"] in protocol.RELIABLE:
            self.outbox[msg["id"]] = msg
        self.stats["sent"] += 1
        await self.ws.send(protocol.encode(msg))

    def running(self) -> list[dict]:
        return [
            {
                "job_id": job_id,
                "attempt": attempt,
                "state": "running",
                "pid": j["pid"],
                "started_at": j["started_at"],
                "adopted": False,
                "stop_reason": None,
                "gpus": j["gpus"],
            }
            for (job_id, attempt), j in self.jobs.items()
        ]

    def heartbeat(self) -> dict:
        from agent import protocol

        self.seq += 1
        return protocol.message(
            "heartbeat",
            {
                "node": self.name,
                "seq": self.seq,
                "uptime_s": round(time.time() - self.started_at, 1),
                "desired_version": self.desired_version,
                "running": self.running(),
                "waiting": {},
                "unacked": len(self.outbox),
            },
        )

    def metrics(self) -> dict:
        from agent import protocol

        owners: dict[str, list[dict]] = {}
        for (job_id, attempt), j in self.jobs.items():
            for uuid in j["gpus"]:
                owners.setdefault(uuid, []).append(
                    {"pid": j["pid"], "used_mib": 20000, "placement": f"{job_id}:{attempt}"}
                )
        gpus = []
        for i, uuid in enumerate(self.uuids):
            busy = uuid in owners
            gpus.append(
                {
                    "index": i,
                    "uuid": uuid,
                    "util_pct": round(self.rng.uniform(60, 100), 2) if busy else 0.0,
                    "mem_util_pct": round(self.rng.uniform(10, 60), 2) if busy else 0.0,
                    "memory_used_mib": 20000 if busy else 0,
                    "memory_total_mib": self.memory_mib,
                    "power_w": round(self.rng.uniform(250, 400), 2) if busy else 60.0,
                    "temperature_c": self.rng.randrange(40, 80),
                    "sm_clock_mhz": 1980 if busy else 210,
                    "ecc_uncorrected_volatile": 0,
                    "xid_events": [],
                    "health": "ok",
                    "processes": owners.get(uuid, []),
                }
            )
        return protocol.message("metrics", {"sampled_at": time.time(), "samples": 1, "gpus": gpus})

    def hello(self) -> dict:
        from agent import protocol

        gpus = [
            {
                "index": i,
                "uuid": uuid,
                "name": "NVIDIA H100 80GB HBM3" if self.memory_mib < 81920 else "NVIDIA A100-SXM4-80GB",
                "memory_total_mib": self.memory_mib,
                "compute_capability": "9.0" if self.memory_mib < 81920 else "8.0",
                "pci_bus_id": f"00000000:{i + 16:02X}:00.0",
                "numa_node": i // 4,
                "cpu_affinity": "0-63" if i < 4 else "64-127",
                "mig_mode_current": False,
                "mig_mode_pending": False,
                "mig_profiles": [],
                "mig_devices": [],
                "power_limit_w": 700.0,
                "ecc_enabled": True,
                "compute_mode": 0,
                "sharing_mode": "exclusive",
                "unsupported": {},
            }
            for i, uuid in enumerate(self.uuids)
        ]
        links = [
            {"gpu_a": a, "gpu_b": b, "nvlink_count": 12, "path": "NV12", "p2p_supported": True}
            for x, a in enumerate(self.uuids)
            for b in self.uuids[x + 1 :]
        ]
        inventory = {
            "backend": "sim",
            "gpus": gpus,
            "links": links,
            "driver_version": "550.54.15",
            "cuda_driver_version": "12.4",
            "nvml_version": "12.550",
        }
        return protocol.message(
            "hello",
            {
                "node": self.name,
                "hostname": self.name,
                "address": "127.0.0.1",
                "agent_version": "bench",
                "protocol": protocol.PROTOCOL_VERSION,
                "backend": "sim",
                "inventory": inventory,
                "capabilities": {"mps": False, "mig": False, "memory_watchdog": True},
                "running": self.running(),
                "desired_version": self.desired_version,
            },
        )

    def job_status(self, key: tuple[str, int], job: dict, state: str, **extra) -> dict:
        from agent import protocol

        payload = {
            "job_id": key[0],
            "attempt": key[1],
            "state": state,
            "adopted": False,
            "pid": job["pid"],
            "started_at": job["started_at"],
            "gpus": job["gpus"],
            **extra,
        }
        return protocol.message("job_status", payload)

    async def on_message(self, msg: dict) -> None:
        from agent import protocol

        kind, p = msg["type"], msg["payload"]
        if kind == "ack":
            if p.get("retry") and not p.get("ok", True):
                self.stats["retry"] += 1
                pending = self.outbox.get(str(p.get("ack_id")))
                if pending is not None:
                    await asyncio.sleep(1.0)
                    await self.send(pending)
                return
            if not p.get("ok", True):
                self.stats["refused"] += 1
            acked = self.outbox.pop(str(p.get("ack_id")), None)
            if acked is not None and acked["type"] == "hello" and BATCHES:
                self.batches = "metrics_batch" in (p.get("features") or [])
                self.in_heartbeats = HEARTBEAT_SAMPLES and "heartbeat_samples" in (p.get("features") or [])
        elif kind == "desired_state":
            version = int(p.get("version") or 0)
            if self.desired_version is not None and version < self.desired_version:
                await self.send(protocol.ack(msg["id"], ok=False, error="stale", desired_version=version))
                return
            self.desired_version = version
            await self.send(protocol.ack(msg["id"], ok=True, desired_version=version))
            wanted = {}
            for j in p.get("jobs") or []:
                wanted[(str(j["job_id"]), int(j["attempt"]))] = j
            now = time.time()
            for key, j in wanted.items():
                if key in self.jobs or key in self.finished:
                    continue
                m = re.search(r"sleep (\d+(?:\.\d+)?)", j.get("command") or "")
                job = {
                    "pid": self.rng.randrange(10_000, 4_000_000),
                    "started_at": now,
                    "ends_at": now + (float(m.group(1)) if m else 3600.0),
                    "gpus": [g["uuid"] for g in j.get("gpus") or []],
                }
                self.jobs[key] = job
                self.stats["started"] += 1
                await self.send(self.job_status(key, job, "started", mps=None))
            for key in [k for k in self.jobs if k not in wanted]:  # stopped by the portal (cancel, preempt)
                job = self.jobs.pop(key)
                self.finished.add(key)
                await self.send(self.end_report(key, job, "stopped", exit_code=-15, reason="stopped"))
        elif kind == "logs_request":
            self.stats["log_requests"] += 1
            key = (str(p.get("job_id")), int(p.get("attempt") or 0))
            offset = int(p.get("offset") or 0)
            payload = {
                "request_id": msg["id"],
                "job_id": p.get("job_id"),
                "attempt": p.get("attempt"),
                "stream": p.get("stream", "stdout"),
                "offset": offset,
                "next_offset": offset,
                "size": offset,
                "data_b64": "",
                "eof": key not in self.jobs,
            }
            await self.send(protocol.message("logs", payload))
        elif kind == "heartbeat_ack":
            self.stats["heartbeat_acks"] += 1

    def end_report(self, key, job, state: str, *, exit_code: int, reason: str | None) -> dict:
        return self.job_status(
            key,
            job,
            state,
            exit_code=exit_code,
            reason=reason,
            finished_at=time.time(),
            grace_given_s=None,
            log_tail={"stdout": ["done"], "stderr": []},
        )

    async def ticks(self) -> None:
        from agent import protocol

        await asyncio.sleep(self.rng.uniform(0, 1.0))  # nodes do not tick in step
        next_heartbeat = time.monotonic() + self.rng.uniform(0, 5.0)
        while True:
            now = time.time()
            for key in [k for k, j in self.jobs.items() if j["ends_at"] <= now]:
                job = self.jobs.pop(key)
                self.finished.add(key)
                await self.send(self.end_report(key, job, "exited", exit_code=0, reason=None))
            sample = self.metrics()
            if not self.batches:
                await self.send(sample)
                self.stats["metrics"] += 1
            else:
                self.batched.append(sample["payload"])
                if len(self.batched) >= BATCH_S and not self.in_heartbeats:
                    await self.send(protocol.message("metrics", {"batch": self.batched}))
                    self.batched = []
                    self.stats["metrics"] += 1
            if time.monotonic() >= next_heartbeat:
                next_heartbeat += 5.0
                beat = self.heartbeat()
                if self.in_heartbeats and self.batched:
                    beat["payload"]["samples"], self.batched = self.batched, []
                await self.send(beat)
                self.stats["heartbeats"] += 1
            for msg in list(self.outbox.values()):  # unacked for 30 s: again, as the agent does
                if now - msg["sent_at"] > 30:
                    msg["sent_at"] = now
                    await self.send(msg)
            await asyncio.sleep(1.0)

    async def run(self, stop: asyncio.Event) -> None:
        from websockets.asyncio.client import connect

        from agent import protocol
        from agent.transport import auth_headers

        while not stop.is_set():
            try:
                async with connect(
                    self.url,
                    additional_headers=auth_headers(self.token, self.name),
                    open_timeout=60,
                    ping_interval=20,
                    ping_timeout=60,
                    max_size=protocol.MAX_FRAME_BYTES,
                ) as ws:
                    self.ws = ws
                    self.backoff.reset()
                    self.stats["connected"] += 1
                    # Until this connection's hello ack says otherwise: a frame a second.
                    self.batches, self.in_heartbeats, self.batched = False, False, []
                    await self.send(self.hello())
                    for msg in list(self.outbox.values()):
                        if msg["type"] != "hello":
                            await self.send(msg)
                    await self.send(self.heartbeat())
                    ticks = asyncio.ensure_future(self.ticks())
                    try:
                        async for text in ws:
                            await self.on_message(protocol.decode(text))
                    finally:
                        ticks.cancel()
                        self.stats["connected"] -= 1
            except Exception as exc:  # noqa: BLE001 - as the agent: log, back off, reconnect
                self.stats["errors"] += 1
                self.stats["last_error"] = f"{type(exc).__name__}: {exc}"[:200]
            # The agent's own reconnect backoff (0.5 s doubling to 30 s, jittered): a portal that fell behind on
            # a storm of connects is not hit again at once by every node.
            await asyncio.sleep(self.backoff.next_delay())


async def _sim_main(spec_file: Path, url: str, status_file: Path) -> None:
    specs = json.loads(spec_file.read_text())
    stats = {
        k: 0
        for k in (
            "connected",
            "sent",
            "metrics",
            "heartbeats",
            "heartbeat_acks",
            "started",
            "refused",
            "retry",
            "log_requests",
        )
    }
    stats.update(errors=0, last_error="")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    nodes = [SimNode(s, url, stats) for s in specs]
    tasks = []
    for node in nodes:  # open the connections gradually, as hosts booting would
        tasks.append(asyncio.ensure_future(node.run(stop)))
        await asyncio.sleep(CONNECT_EVERY_S)
    while not stop.is_set():
        stats["unacked"] = sum(len(node.outbox) for node in nodes)  # reports the portal has not answered yet
        status_file.write_text(json.dumps(stats))
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        except TimeoutError:
            pass
    for t in tasks:
        t.cancel()


# --- the portal's processes -----------------------------------------------------------------------------------
class Procs:
    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env, self.procs = root, env, {}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        p = subprocess.Popen(
            argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs[name] = p
        return p

    def peak_rss(self) -> dict[str, float]:
        out = {}
        for name, p in self.procs.items():
            tree = proc_tree(p.pid)
            out[name] = peak_rss_mib(p.pid)
            for k, child in enumerate(tree[1:]):
                out[f"{name}.child{k}"] = peak_rss_mib(child)
        return out

    def stop_all(self) -> None:
        if "daphne" in self.procs and self.procs["daphne"].poll() is None:
            os.kill(self.procs["daphne"].pid, signal.SIGUSR1)  # a sampled daphne writes its profile
            time.sleep(0.5)
        for p in reversed(list(self.procs.values())):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + 15
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the group: prefork children too
            except ProcessLookupError:
                pass

    def log(self, name: str) -> str:
        try:
            return (self.root / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""


def cycles_logged(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        m = re.search(r"cycle (\{.*\})", line)
        if m:
            try:
                out.append(ast.literal_eval(m.group(1)))
            except (ValueError, SyntaxError):
                continue
    return out


def soft_wait(what: str, predicate, timeout_s: float, interval_s: float = 0.25, *, missed: list) -> bool:
    """As wait_for, but a timeout is noted in `missed` and the run goes on (its figures say so)."""
    try:
        wait_for(what, predicate, timeout_s=timeout_s, interval_s=interval_s, scale=False)
        return True
    except AssertionError as exc:
        missed.append(str(exc))
        return False


# --- the cluster in the database ------------------------------------------------------------------------------
def seed(*, nodes: int, root: Path) -> dict:
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.db import connection

    from quotas.models import Quota
    from quotas.services import membership_set, priority_classes_ensure_defaults, team_create
    from quotas.tokens import api_token_create
    from scheduling.choices import LinkKind
    from scheduling.inventory.models import Gpu, GpuLink, GpuModel, Node
    from scheduling.inventory.services import _hash_token

    classes = {pc.name: pc for pc in priority_classes_ensure_defaults()}
    a100 = GpuModel.objects.create(name="A100-80GB", memory_mib=81920, compute_capability=Decimal("8.0"))
    h100 = GpuModel.objects.create(name="H100-80GB", memory_mib=81559, compute_capability=Decimal("9.0"))
    specs, rows = [], []
    for i in range(nodes):
        token = f"tna_bench{i:05d}{random.getrandbits(64):016x}"
        rows.append(
            Node(
                name=f"node-{i:04d}",
                cpu_milli=128_000,
                memory_mib=1024 * 1024,
                agent_token_hash=_hash_token(token),
                agent_token_prefix=token[:12],
            )
        )
        model = a100 if i % 2 == 0 else h100
        specs.append(
            {
                "name": f"node-{i:04d}",
                "token": token,
                "memory_mib": model.memory_mib,
                "uuids": [f"GPU-{i:04d}-{g}-bench" for g in range(GPUS_PER_NODE)],
            }
        )
    Node.objects.bulk_create(rows, batch_size=1000)
    by_name = {n.name: n for n in Node.objects.all()}
    gpus = []
    for i, spec in enumerate(specs):
        model = a100 if i % 2 == 0 else h100
        for g, uuid in enumerate(spec["uuids"]):
            gpus.append(
                Gpu(
                    node=by_name[spec["name"]],
                    index=g,
                    uuid=uuid,
                    model=model,
                    memory_mib=model.memory_mib,
                    numa_node=g // 4,
                )
            )
    Gpu.objects.bulk_create(gpus, batch_size=4000)
    gpu_rows = list(Gpu.objects.order_by("node__name", "index"))
    links = []
    for k in range(0, len(gpu_rows), GPUS_PER_NODE):
        group = gpu_rows[k : k + GPUS_PER_NODE]
        links += [
            GpuLink(gpu_a=a, gpu_b=b, kind=LinkKind.NVLINK, nvlink_count=12)
            for x, a in enumerate(group)
            for b in group[x + 1 :]
        ]
    GpuLink.objects.bulk_create(links, batch_size=5000)
    org = team_create(slug="lab", display_name="Lab")
    teams = [team_create(slug=f"lab/{n}", parent=org) for n in ("training", "vision", "speech", "nlp")]
    total = nodes * GPUS_PER_NODE
    for t in teams:  # guarantees cover the cluster: capacity, not quota, is what holds the queue back
        Quota.objects.create(
            team=t,
            guaranteed_gpus=Decimal(total),
            guaranteed_gpu_memory_mib=total * 81920,
            default_priority_class=classes["training"],
        )
    users = get_user_model()
    people = []
    for k, t in enumerate(teams):
        user = users.objects.create_user(username=f"user{k}", password="pw")
        membership_set(user=user, team=t)
        people.append((user, t, api_token_create(user=user, name="bench")[1]))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    spec_path = root / "nodes.json"
    spec_path.write_text(json.dumps(specs))
    return {"people": people, "classes": classes, "specs": specs}


def queue_jobs(*, people: list, count: int, command: str, models: tuple[str, ...]) -> float:
    """`count` pending jobs with the rows job_submit writes (the job and its "submitted" event), in bulk."""
    from quotas.selectors import team_allowance
    from scheduling.choices import ActorKind, JobState
    from scheduling.jobs.fields import JobSpec
    from scheduling.jobs.models import Job, JobEvent
    from scheduling.jobs.submit import job_from_spec
    from scheduling.jobs.validation import job_spec_validate_for_team

    t0 = time.perf_counter()
    rng = random.Random(5)
    jobs = []
    resolved = {}
    for i in range(count):
        user, team, _ = people[i % len(people)]
        gpus = rng.choice([1, 1, 1, 1, 2, 2, 4, 8])
        spec = JobSpec(name=f"q-{i}", command=command, gpus=gpus, gpu_models=models, max_runtime_s=86400)
        if (team.pk, gpus) not in resolved:
            allowance = team_allowance(team=team, user=user)
            resolved[team.pk, gpus] = job_spec_validate_for_team(spec=spec, team=team, allowance=allowance)
        job = job_from_spec(submitter=user, team=team, spec=spec, priority_class=resolved[team.pk, gpus])
        job.pending_reason_code, job.pending_reason = "queued", "Waiting for the next scheduling cycle."
        jobs.append(job)
    Job.objects.bulk_create(jobs, batch_size=2000)
    JobEvent.objects.bulk_create(
        (
            JobEvent(
                job=j,
                from_state="",
                to_state=JobState.PENDING,
                actor_kind=ActorKind.USER,
                actor=j.submitter,
                code="submitted",
                message=f"Submitted by {j.submitter} to {j.team.slug}.",
            )
            for j in jobs
        ),
        batch_size=5000,
    )
    return time.perf_counter() - t0


def api_submit(port: int, token: str, body: dict) -> int:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(
        "POST",
        "/api/v1/jobs/",
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    response = conn.getresponse()
    data = response.read()
    conn.close()
    if response.status != 201:
        raise RuntimeError(f"submit: {response.status} {data[:300]!r}")
    return int(json.loads(data)["id"])


def submit_many(port: int, people: list, bodies: list[dict], clients: int) -> tuple[list[int], float]:
    import http.client

    ids: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()
    queue = list(enumerate(bodies))

    def client(k: int) -> None:
        token = people[k % len(people)][2]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        while True:
            with lock:
                if not queue:
                    break
                _, body = queue.pop()
            body = {**body, "team": people[k % len(people)][1].slug}
            try:
                conn.request("POST", "/api/v1/jobs/", body=json.dumps(body), headers=headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                errors.append(str(exc))
                continue
            with lock:
                if response.status == 201:
                    ids.append(int(json.loads(data)["id"]))
                else:
                    errors.append(f"{response.status} {data[:200]!r}")
        conn.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print(f"{len(errors)} submit errors, e.g. {errors[0]}", file=sys.stderr)
    return ids, time.perf_counter() - t0


def api_post(port: int, token: str, path: str, body: dict) -> tuple[int, dict]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request(
        "POST",
        path,
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, json.loads(data or b"{}")


def array_counts(array_id: int) -> dict[str, int]:
    """The array's tasks by state: those started (ever), those active now, those ended."""
    from django.db.models import Count, Q

    from scheduling.jobs.models import Job
    from scheduling.jobs.states import ACTIVE_STATES, TERMINAL_STATES

    return Job.objects.filter(array_job_id=array_id).aggregate(
        started=Count("id", filter=Q(started_at__isnull=False)),
        active=Count("id", filter=Q(state__in=ACTIVE_STATES)),
        ended=Count("id", filter=Q(state__in=TERMINAL_STATES)),
    )


def cluster_idle() -> bool:
    from scheduling.inventory.models import Gpu
    from scheduling.jobs.models import Job
    from scheduling.jobs.states import ACTIVE_STATES

    return (
        not Job.objects.filter(state__in=ACTIVE_STATES).exists()
        and not Gpu.objects.filter(allocated_compute_pct__gt=0).exists()
    )


def settled(root: Path, sims: int) -> bool:
    """Nothing running, every simulated node's reports answered and every ended placement's logs drained: the
    portal has caught up with what came before (a phase after it measures itself, not the last one's wake)."""
    from scheduling.jobs.models import LogDrain

    for k in range(sims):
        try:
            if json.loads((root / f"agents{k}.status").read_text()).get("unacked", 1):
                return False
        except (OSError, ValueError):  # being written
            return False
    return cluster_idle() and not LogDrain.objects.exists()


def sweeps(port: int, people: list, args: argparse.Namespace, root: Path, *, missed: list) -> dict:
    """Sweeps on the idle cluster, through the API, with every task started and ended by its node's agent:
    - a `--array-tasks` array accepted in one request, and the time until its first `--array-first` run;
    - a `%50` array of `--throttle-tasks` short tasks, its running tasks counted every 0.2 s until all ended;
    - a `--chain` dependency chain: one job, an array of all but two after it (fan-out, afterok), and one
      job after the whole array (fan-in); the time from the first submit to the last job's success."""
    from scheduling.jobs.models import Job

    out: dict = {}
    _, team, token = people[0]
    body = {"command": "sleep 100000", "gpus": 1, "team": team.slug}
    t0 = time.perf_counter()
    code, array = api_post(
        port, token, "/api/v1/jobs/", {**body, "name": "sweep", "array": f"0-{args.array_tasks - 1}"}
    )
    out["array_accept_s"] = round(time.perf_counter() - t0, 3)
    if code != 201:
        raise RuntimeError(f"the array was refused: {code} {array}")
    first = min(args.array_first, args.array_tasks)
    soft_wait(
        f"{first} of the array's tasks running",
        lambda: array_counts(array["id"])["started"] >= first,
        timeout_s=300,
        interval_s=0.5,
        missed=missed,
    )
    out["array_first_8000_running_s"] = round(time.perf_counter() - t0, 1)
    out["array_first_running"] = array_counts(array["id"])["started"]
    t1 = time.perf_counter()
    code, _ = api_post(port, token, f"/api/v1/jobs/{array['id']}/cancel/", {})
    out["array_cancel_s"] = round(time.perf_counter() - t1, 2)
    soft_wait(
        "the array cancelled and every card free", cluster_idle, timeout_s=300, interval_s=1, missed=missed
    )
    out["array_cancelled_to_idle_s"] = round(time.perf_counter() - t1, 1)
    # Every stop reported and answered, every log drained: the cancel's wake, before the next phase.
    soft_wait("the cancel's reports answered", lambda: settled(root, args.agent_procs), 600, 1, missed=missed)
    out["array_cancel_settled_s"] = round(time.perf_counter() - t1, 1)

    code, throttled = api_post(
        port,
        token,
        "/api/v1/jobs/",
        {**body, "command": "sleep 2", "name": "throttled", "array": f"0-{args.throttle_tasks - 1}%50"},
    )
    most, deadline = 0, time.monotonic() + 240
    while time.monotonic() < deadline:
        counts = array_counts(throttled["id"])
        most = max(most, counts["active"])
        if counts["ended"] >= args.throttle_tasks:
            break
        time.sleep(0.2)
    else:
        missed.append("the throttled array ending")
    out["array_throttle_max_running"] = most
    soft_wait("the throttled array settled", lambda: settled(root, args.agent_procs), 300, 1, missed=missed)

    t0 = time.perf_counter()
    _, prepare = api_post(port, token, "/api/v1/jobs/", {**body, "command": "sleep 1", "name": "prepare"})
    _, fan_out = api_post(
        port,
        token,
        "/api/v1/jobs/",
        {
            **body,
            "command": "sleep 1",
            "name": "train",
            "array": f"0-{args.chain - 3}",
            "depends_on": f"afterok:{prepare['id']}",
        },
    )
    _, fan_in = api_post(
        port,
        token,
        "/api/v1/jobs/",
        {**body, "command": "sleep 1", "name": "evaluate", "depends_on": f"afterok:{fan_out['id']}"},
    )
    soft_wait(
        "the dependency chain's last job ended",
        lambda: Job.objects.get(pk=fan_in["id"]).state not in ("pending", "placed", "starting", "running"),
        timeout_s=300,
        interval_s=0.25,
        missed=missed,
    )
    out["dependency_chain_s"] = round(time.perf_counter() - t0, 1)
    out["dependency_chain_end"] = Job.objects.get(pk=fan_in["id"]).state
    soft_wait("the chain settled", lambda: settled(root, args.agent_procs), 300, 1, missed=missed)
    return out


def table_sizes() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
        )
        sizes = dict(cursor.fetchall())
        # A partitioned table's own size is 0: sum its partitions.
        cursor.execute(
            "SELECT parent.relname, COALESCE(SUM(pg_total_relation_size(child.oid)), 0) FROM pg_inherits i "
            "JOIN pg_class parent ON parent.oid = i.inhparent JOIN pg_class child ON child.oid = i.inhrelid "
            "GROUP BY parent.relname"
        )
        for name, size in cursor.fetchall():
            sizes[name] = int(size)
    return sizes


def latencies_of(ids: list[int]) -> list[float]:
    from scheduling.jobs.models import Job

    rows = Job.objects.filter(pk__in=ids, started_at__isnull=False).values_list("submitted_at", "started_at")
    return [(started - submitted).total_seconds() for submitted, started in rows]


def latency_phases(ids: list[int]) -> dict:
    """Where submit-to-running went: the commit to the placement's event (the cycle), and the placement to the
    agent's start report recorded (the desired state's way to the node and the report's way back)."""
    from scheduling.jobs.models import Job, JobEvent

    placed = dict(
        JobEvent.objects.filter(job_id__in=ids, to_state="placed")
        .order_by("job_id", "at")
        .values_list("job_id", "at")
    )
    rows = Job.objects.filter(pk__in=ids, started_at__isnull=False).values_list(
        "pk", "submitted_at", "started_at"
    )
    to_placed = [(placed[pk] - submitted).total_seconds() for pk, submitted, _ in rows if pk in placed]
    to_running = [(started - placed[pk]).total_seconds() for pk, _, started in rows if pk in placed]
    return {"submit_to_placed": summary(to_placed), "placed_to_running": summary(to_running)}


def running_count(ids: list[int] | None = None) -> int:
    from scheduling.jobs.models import Job

    qs = Job.objects.filter(started_at__isnull=False)
    return (qs.filter(pk__in=ids) if ids is not None else qs).count()


def summary(values: list[float]) -> dict:
    return {
        "n": len(values),
        "p50_s": round(percentile(values, 50), 3),
        "p90_s": round(percentile(values, 90), 3),
        "p99_s": round(percentile(values, 99), 3),
        "max_s": round(max(values), 3) if values else None,
    }


def bench_database() -> tuple[str, str, str]:
    """Create `<DATABASE_URL name>_bench` afresh, empty REDIS_URL's database, and point this process (and the ones
    it starts) at both. Returns (the server's admin url, the bench database's url, its name)."""
    import psycopg
    import redis

    database_url = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    redis_url = os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    parts = urlsplit(database_url)
    bench_name = f"{parts.path.lstrip('/') or 'tessera'}_bench"
    admin_url = urlunsplit((parts.scheme, parts.netloc, "/postgres", "", ""))
    bench_url = urlunsplit((parts.scheme, parts.netloc, f"/{bench_name}", "", ""))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{bench_name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{bench_name}"')
    redis.Redis.from_url(redis_url).flushdb()
    os.environ.update(DATABASE_URL=bench_url, REDIS_URL=redis_url, DJANGO_SETTINGS_MODULE="portal.settings")
    return admin_url, bench_url, bench_name


def run(args: argparse.Namespace) -> dict:
    import psycopg

    admin_url, bench_url, bench_name = bench_database()
    root = Path(tempfile.mkdtemp(prefix="tessera-scale-"))
    port = free_port()
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "INFO",
        "TESSERA_LOG_DIR": str(root / "portal-logs"),
        "PROMETHEUS_MULTIPROC_DIR": str(root / "prometheus"),
        "TESSERA_API_SUBMIT_RATE": "1000000/min",  # the bench's clients are few users submitting a lot
        "DATABASE_CONN_MAX_AGE": "600",
    }
    (root / "prometheus").mkdir()
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    t_start = time.perf_counter()
    call_command("migrate", verbosity=0)
    from scheduling.cycle.requests import cycle_request

    seeded = seed(nodes=args.nodes, root=root)
    people = seeded["people"]
    procs = Procs(root, env)
    result: dict = {
        "benchmark": "cluster_scale",
        "nodes": args.nodes,
        "web_procs": args.web_procs,
        "gpus": args.nodes * GPUS_PER_NODE,
        "host": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_start": [round(x, 2) for x in os.getloadavg()],
            "shared": "the machine ran other work while measuring",
        },
        "setup_s": round(time.perf_counter() - t_start, 1),
    }
    phases: dict = {}
    missed: list[str] = []
    result["timeouts"] = missed
    try:
        # The agents' daphnes (--web-procs), the nodes spread over them as a load balancer would.
        ports = [port] + [free_port() for _ in range(args.web_procs - 1)]
        webs = []
        for k, web_port in enumerate(ports):
            name = "daphne" if k == 0 else f"daphne{k}"
            serve = ["-b", "127.0.0.1", "-p", str(web_port), "portal.asgi:application"]
            if args.profile_daphne and k == 0:  # a sampling profile of every thread (bench/sampled.py)
                procs.env = {**env, "TESSERA_BENCH_PROFILE": str(args.profile_daphne.resolve())}
                webs.append(procs.start(name, [sys.executable, "-m", "bench.sampled", "daphne", *serve]))
                procs.env = env
            else:
                webs.append(procs.start(name, [str(BIN / "daphne"), *serve]))
        # The API (singles, bursts) on a daphne of its own, as a site of this size routes /ws/agent/ apart from
        # the browsers and the API: sharing one, its request threads starved the agents' heartbeats of the GIL.
        # Its connections are not kept (Django's advice under ASGI): each request runs on a thread of its own, and
        # a kept connection per thread used up PostgreSQL's 100 under a burst of submits (500s).
        port = free_port()
        procs.env = {**env, "DATABASE_CONN_MAX_AGE": "0"}
        procs.start(
            "daphne-api", [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "portal.asgi:application"]
        )
        procs.env = env
        for web_port in [*ports, port]:
            wait_for("daphne", lambda web_port=web_port: _port_open(web_port), timeout_s=60, scale=False)
        daphne = webs  # the agents' daphnes: their CPU is the agents' traffic
        specs = seeded["specs"]
        per = -(-len(specs) // args.agent_procs)
        sims = []
        for k in range(args.agent_procs):
            part = root / f"nodes-{k}.json"
            part.write_text(json.dumps(specs[k * per : (k + 1) * per]))
            sims.append(
                procs.start(
                    f"agents{k}",
                    [
                        sys.executable,
                        "-m",
                        "bench.cluster_scale",
                        "--sim-agents",
                        str(part),
                        "--url",
                        f"ws://127.0.0.1:{ports[k % len(ports)]}/ws/agent/",
                        "--status",
                        str(root / f"agents{k}.status"),
                    ],
                )
            )
        t0 = time.perf_counter()
        from scheduling.cycle.models import NodeSync

        soft_wait(
            f"{args.nodes} agents' hello",
            lambda: NodeSync.objects.filter(connected_at__isnull=False).count() >= args.nodes,
            timeout_s=240,
            interval_s=1.0,
            missed=missed,
        )
        phases["agents_connected_s"] = round(time.perf_counter() - t0, 1)
        phases["agents_said_hello"] = NodeSync.objects.filter(connected_at__isnull=False).count()
        procs.start("worker", [str(BIN / "celery"), "-A", "portal", "worker", "-l", "INFO", "-c", "2"])
        procs.start(
            "beat", [str(BIN / "celery"), "-A", "portal", "beat", "-l", "INFO", "-s", str(root / "beat")]
        )
        time.sleep(args.window_s / 2)
        # Idle traffic: heartbeats and samples, no jobs.
        result["agent_traffic_idle"] = traffic_window(daphne, bench_url, min(20.0, args.window_s), sims)
        if args.array_tasks:
            result |= sweeps(port, people, args, root, missed=missed)

        # -- the queue, and the first cycle at its size ----------------------------------------------------------
        # The sweeps' cycles came before: the queue's is the first to place anything after them.
        before_queue = max((c["epoch"] for c in cycles_logged(procs.log("worker"))), default=0)
        phases["queue_insert_s"] = round(
            queue_jobs(people=people, count=args.pending, command="sleep 100000", models=("A100-80GB",)), 1
        )
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        t_req = time.perf_counter()
        cycle_request()
        first = wait_for(
            "the first cycle at the queue's size",
            lambda: next(
                (c for c in cycles_logged(procs.log("worker")) if c["placed"] and c["epoch"] > before_queue),
                None,
            ),
            timeout_s=240,
            scale=False,
        )
        placed = first["placed"]
        soft_wait(
            f"{placed} placed jobs running",
            lambda: running_count() >= placed,
            timeout_s=300,
            interval_s=1,
            missed=missed,
        )
        e2e = time.perf_counter() - t_req
        total = first["snapshot_s"] + first["engine_s"] + first["apply_s"]
        result["first_cycle"] = {**first, "total_s": round(total, 3)}
        result["cycle_read_s"] = first["snapshot_s"]
        result["cycle_engine_s"] = first["engine_s"]
        result["cycle_apply_s"] = first["apply_s"]
        result["placements_per_s"] = round(placed / total, 1)
        result["engine_placements_per_s"] = round(placed / max(first["engine_s"], 1e-9), 1)
        result["placed_to_running_e2e"] = {
            "placed": placed,
            "request_to_all_running_s": round(e2e, 1),
            "running_per_s": round(placed / e2e, 1),
        }
        time.sleep(5)

        # -- agents' traffic with jobs running and nothing changing; database growth -------------------------
        sizes0 = table_sizes()
        from scheduling.history.models import ClusterMinute

        minutes0 = ClusterMinute.objects.count()
        w = traffic_window(daphne, bench_url, args.window_s, sims)
        sizes1 = table_sizes()
        minutes1 = ClusterMinute.objects.count()
        result["agent_traffic"] = w
        result["agent_traffic_cpu_pct"] = w["daphne_cpu_pct"]
        result["db_growth"] = db_growth(sizes0, sizes1, w["wall_s"], minutes1 - minutes0)
        result["db_growth_mib_per_day"] = result["db_growth"]["mib_per_day"]

        # -- one at a time, with free capacity ---------------------------------------------------------------
        singles, single_ids = [], []
        user, team, token = people[0]
        for i in range(args.singles):
            job_id = api_submit(
                port,
                token,
                {
                    "name": f"single-{i}",
                    "command": "sleep 5",
                    "gpus": 1,
                    "team": team.slug,
                    "gpu_models": ["H100-80GB"],
                },
            )
            single_ids.append(job_id)
            if soft_wait(
                f"single {job_id} running",
                lambda job_id=job_id: running_count([job_id]),
                timeout_s=60,
                interval_s=0.05,
                missed=missed,
            ):
                singles += latencies_of([job_id])
            else:
                singles.append(60.0)  # not running within 60 s: counted as 60 s
        result["singles"] = summary(singles)
        result["singles_phases"] = latency_phases(single_ids)
        # -- bursts ------------------------------------------------------------------------------------------
        bursts = []
        epoch_before = max((c["epoch"] for c in cycles_logged(procs.log("worker"))), default=0)
        for b in range(args.bursts):
            bodies = [
                {"name": f"burst{b}-{i}", "command": "sleep 20", "gpus": 1, "gpu_models": ["H100-80GB"]}
                for i in range(args.burst)
            ]
            ids, submit_s = submit_many(port, people, bodies, clients=8)
            soft_wait(
                f"burst {b} running",
                lambda ids=ids: running_count(ids) >= len(ids),
                timeout_s=180,
                interval_s=0.5,
                missed=missed,
            )
            lat = latencies_of(ids)
            bursts.append(
                {
                    "submitted": len(ids),
                    "submit_s": round(submit_s, 1),
                    "submits_per_s": round(len(ids) / submit_s, 1),
                    **summary(lat),
                }
            )
            if b + 1 < args.bursts:
                time.sleep(22)  # they end: the H100s are free again
        burst_cycles = [c for c in cycles_logged(procs.log("worker")) if c["epoch"] > epoch_before]
        result["bursts"] = bursts
        result["burst_cycles"] = {
            "cycles": len(burst_cycles),
            "placed": sum(c["placed"] for c in burst_cycles),
            "pending_seen": max((c["pending"] for c in burst_cycles), default=0),
            "total_s_p50": round(
                percentile([c["snapshot_s"] + c["engine_s"] + c["apply_s"] for c in burst_cycles], 50), 3
            ),
            "snapshot_s_p50": round(percentile([c["snapshot_s"] for c in burst_cycles], 50), 3),
            "engine_s_p50": round(percentile([c["engine_s"] for c in burst_cycles], 50), 3),
            "apply_s_p50": round(percentile([c["apply_s"] for c in burst_cycles], 50), 3),
        }
        result["submit_to_running_p50_s"] = result["singles"]["p50_s"]
        result["submit_to_running_p99_s"] = result["singles"]["p99_s"]
        result["burst_submit_to_running_p99_s"] = max((b["p99_s"] for b in bursts), default=None)
        result["sim_agents"] = [
            json.loads((root / f"agents{k}.status").read_text()) for k in range(args.agent_procs)
        ]
        result["peak_rss_mib"] = procs.peak_rss()
        # Read before anything is stopped (stopping is noisy): nodes the watchdog declared lost, and errors the
        # portal's processes logged with a traceback.
        result["nodes_lost"] = len(set(re.findall(r"node (\S+) lost; its jobs", procs.log("worker"))))
        result["tracebacks_logged"] = {
            name: procs.log(name).count("Traceback (most recent call last)")
            for name in procs.procs
            if not name.startswith("agents")
        }
    except BaseException:
        for name in procs.procs:
            print(f"--- {name} ---\n" + "\n".join(procs.log(name).splitlines()[-30:]), file=sys.stderr)
        raise
    finally:
        procs.stop_all()
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{bench_name}" WITH (FORCE)')
    result["phases"] = phases
    result["host"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    result["targets"] = TARGETS
    total = result["cycle_read_s"] + result["cycle_engine_s"] + result["cycle_apply_s"]
    result["met"] = {
        "cycle_total_s": total <= TARGETS["cycle_total_s"],
        "placements_per_s": result["placements_per_s"] >= TARGETS["placements_per_s"],
        "submit_to_running_p99_s": result["submit_to_running_p99_s"] <= TARGETS["submit_to_running_p99_s"],
        "agent_traffic_cpu_pct": result["agent_traffic_cpu_pct"] <= TARGETS["agent_traffic_cpu_pct"],
        "engine_placements_per_s": result["engine_placements_per_s"] >= TARGETS["engine_placements_per_s"],
    }
    if "array_accept_s" in result:
        result["met"] |= {
            "array_accept_s": result["array_accept_s"] <= TARGETS["array_accept_s"],
            "array_first_8000_running_s": result["array_first_running"]
            >= min(args.array_first, args.array_tasks)
            and result["array_first_8000_running_s"] <= TARGETS["array_first_8000_running_s"],
            "array_throttle_max_running": result["array_throttle_max_running"]
            <= TARGETS["array_throttle_max_running"],
        }
    return result


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _pg_backends_cpu(url: str) -> dict[int, float]:
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(url, autocommit=True) as conn:
        pids = [
            r[0]
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (name,)
            ).fetchall()
        ]
    return {pid: proc_cpu_s(pid) for pid in pids}


def traffic_window(webs: list, url: str, seconds: float, sims: list) -> dict:
    """daphne's (every web process's; and the simulated agents', and this database's backends') CPU over
    `seconds` of wall time."""
    d0 = sum(proc_cpu_s(p.pid) for p in webs)
    s0, pg0 = [proc_cpu_s(p.pid) for p in sims], _pg_backends_cpu(url)
    w0 = time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - w0
    d1 = sum(proc_cpu_s(p.pid) for p in webs)
    s1, pg1 = [proc_cpu_s(p.pid) for p in sims], _pg_backends_cpu(url)
    pg = sum(cpu - pg0.get(pid, 0.0) for pid, cpu in pg1.items())
    return {
        "wall_s": round(wall, 1),
        "daphne_cpu_pct": round(100 * (d1 - d0) / wall, 1),
        "postgres_backends_cpu_pct": round(100 * pg / wall, 1),
        "sim_agents_cpu_pct": round(100 * (sum(s1) - sum(s0)) / wall, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _history_runs_per_day(table: str) -> int:
    if "five_minute" in table:
        return 24 * 12
    if "hour" in table:
        return 24
    return 24 * 60


def db_growth(before: dict[str, int], after: dict[str, int], wall_s: float, minutes: int) -> dict:
    grown = {t: after.get(t, 0) - before.get(t, 0) for t in after}
    history = {t: g for t, g in grown.items() if t.startswith("history_")}
    other = {t: g for t, g in grown.items() if not t.startswith("history_") and g}
    # History grows once per recorder run (each minute): a minute table's growth per run x 1,440. The 5-minute and
    # hourly tables are written one run in 5 or 60: a window of a few minutes holds at most one such write, so
    # what they grew is one write, x 288 or x 24. The rest grows with wall time.
    history_day = 0.0
    for table, g in history.items():
        if g > 0 and minutes:
            runs = _history_runs_per_day(table)
            history_day += g / minutes * runs if runs == 24 * 60 else g * runs
    other_day = sum(other.values()) / wall_s * 86400
    mib = 1024 * 1024
    if not minutes:  # no recorder run fell in the window: history's growth is unknown, not zero
        return {"mib_per_day": None, "recorder_runs_in_window": 0, "note": "window held no recorder run"}
    return {
        "mib_per_day": round((history_day + other_day) / mib, 1),
        "history_mib_per_day": round(history_day / mib, 1),
        "other_mib_per_day": round(other_day / mib, 1),
        "recorder_runs_in_window": minutes,
        "history_tables_kib_per_run": {
            t: round(g / minutes / 1024, 1) for t, g in history.items() if g and minutes
        },
        "other_tables_kib_in_window": {t: round(g / 1024, 1) for t, g in other.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=20000)
    parser.add_argument("--burst", type=int, default=2000)
    parser.add_argument("--bursts", type=int, default=1)
    parser.add_argument("--singles", type=int, default=20)
    parser.add_argument("--array-tasks", type=int, default=10_000, help="the sweep's array (0: no sweeps)")
    parser.add_argument("--array-first", type=int, default=8_000, help="its tasks timed until running")
    parser.add_argument("--throttle-tasks", type=int, default=200, help="tasks of the %%50 array")
    parser.add_argument("--chain", type=int, default=1000, help="jobs in the dependency chain")
    parser.add_argument("--window-s", type=float, default=65.0, help="the traffic / database-growth window")
    parser.add_argument("--agent-procs", type=int, default=2, help="processes the simulated nodes share")
    parser.add_argument("--web-procs", type=int, default=2, help="daphne processes the nodes are spread over")
    parser.add_argument("--profile-daphne", type=Path, help="write a sampling profile of daphne here (JSON)")
    parser.add_argument("--json", action="store_true", help="JSON only (the default prints JSON too)")
    parser.add_argument("--sim-agents", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--status", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sim_agents:
        asyncio.run(_sim_main(args.sim_agents, args.url, args.status))
        return 0
    sys.path.insert(0, str(ROOT))

    def stop(signum, _frame):  # SIGTERM / SIGHUP: stop everything started (run's finally), then exit
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    print(json.dumps(run(args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
