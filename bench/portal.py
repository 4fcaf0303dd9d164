"""Benchmark the browser portal at cluster size: 1,000 nodes x 8 GPUs and 10,000 pending jobs in PostgreSQL.
Prints JSON.

- `jobs_page_p95_ms`, `queue_page_p95_ms`, `job_page_p95_ms`: server time of /jobs/, /queue/ and one job's page
  (Django's full request path, in process, through the same views and selectors the portal serves);
- `whatif_p95_ms`: the submit form's live answer (POST /jobs/new/preview/), one engine cycle on the cached
  snapshot with the hypothetical job in the queue; `whatif_cold_ms` adds reading the snapshot;
- `push_to_dom_p95_ms`: daphne with Redis channels and Chromium with `--pages` job pages open on one job; a state
  change is committed and each page's DOM is watched until it shows it: commit to DOM, every page, p95;
  `push_part_refreshed_p95_ms`: until the page's part, pushed over its socket with the new event, is in the DOM
  (`push_part_arrived_p95_ms`: until it reached the page's socket, before the page swapped it in).
- `cluster_map_render_ms`: the cluster map (/cluster/) in Chromium over daphne, navigation start to the load event
  (p95 of several loads), with MPS cards shared by slices of two teams, NVLink groups of four and a live sample
  of every GPU in Redis; `cluster_map_group_open_ms`: opening the largest group until its first page of node
  tiles is drawn. `--only cluster-map` runs just these (and the map's server times).

    .venv/bin/python -m bench.portal --nodes 1000 --pending 10000 --pages 100
    .venv/bin/python -m bench.portal --only cluster-map --pending 0
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from tests.support import free_port, launch_chromium, percentile, sign_in

ROOT = Path(__file__).resolve().parents[1]


def summary_ms(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "p50": round(percentile(ms, 50), 1),
        "p95": round(percentile(ms, 95), 1),
        "max": round(max(ms), 1),
        "mean": round(statistics.fmean(ms), 1),
        "n": len(ms),
    }


def build_cluster(*, nodes: int, gpus_per_node: int, pending: int, running: int) -> dict:
    """A fresh cluster in the benchmark database: nodes of A100s and H100s (NVLinked in fours, every fifth node's
    cards shared with MPS), four teams with quotas, alice and bob, `running` whole-GPU jobs holding cards and
    `pending` jobs in the queue."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from quotas.models import Quota
    from quotas.services import membership_set, priority_classes_ensure_defaults, team_create
    from scheduling.choices import ActorKind, JobState, LinkKind, SharingMode
    from scheduling.inventory.models import Gpu, GpuLink, GpuModel, Node
    from scheduling.jobs.models import Job, JobEvent, Slice

    call_command("flush", interactive=False, verbosity=0)
    classes = {pc.name: pc for pc in priority_classes_ensure_defaults()}
    a100 = GpuModel.objects.create(name="A100-80GB", memory_mib=81920, compute_capability=Decimal("8.0"))
    h100 = GpuModel.objects.create(name="H100-80GB", memory_mib=81559, compute_capability=Decimal("9.0"))
    Node.objects.bulk_create(
        Node(
            name=f"node-{i:04d}", cpu_milli=128_000, memory_mib=1024 * 1024, last_heartbeat_at=timezone.now()
        )
        for i in range(nodes)
    )
    by_name = {n.name: n for n in Node.objects.all()}
    gpus = []
    for i in range(nodes):
        model = h100 if i % 4 == 0 else a100
        for g in range(gpus_per_node):
            gpus.append(
                Gpu(
                    node=by_name[f"node-{i:04d}"],
                    index=g,
                    uuid=f"GPU-{i:04d}-{g}",
                    model=model,
                    memory_mib=model.memory_mib,
                    numa_node=g // 4,
                    # A pool of shared cards for the slices: every fifth node's GPUs run MPS.
                    sharing_mode=SharingMode.MPS if i % 5 == 1 else SharingMode.EXCLUSIVE,
                )
            )
    Gpu.objects.bulk_create(gpus, batch_size=2000)
    gpu_rows = list(Gpu.objects.order_by("node__name", "index"))
    links = []
    for k in range(0, len(gpu_rows), 4):
        group = gpu_rows[k : k + 4]
        links += [
            GpuLink(gpu_a=a, gpu_b=b, kind=LinkKind.NVLINK, nvlink_count=12)
            for x, a in enumerate(group)
            for b in group[x + 1 :]
        ]
    GpuLink.objects.bulk_create(links, batch_size=5000)
    org = team_create(slug="lab", display_name="Lab")
    teams = [team_create(slug=f"lab/{name}", parent=org) for name in ("training", "vision", "speech", "nlp")]
    for t in teams:
        Quota.objects.create(
            team=t,
            guaranteed_gpus=Decimal(nodes * gpus_per_node // 5),
            guaranteed_gpu_memory_mib=nodes * gpus_per_node * 81920 // 5,
            default_priority_class=classes["training"],
        )
    users = get_user_model()
    alice = users.objects.create_user(username="alice", password="alice-pw")
    bob = users.objects.create_user(username="bob", password="bob-pw")
    membership_set(user=alice, team=teams[0])
    membership_set(user=bob, team=teams[1])
    rng = random.Random(7)
    now = timezone.now()
    jobs = []
    for i in range(running + pending):
        is_running = i < running
        slice_job = not is_running and rng.random() < 0.5
        jobs.append(
            Job(
                team=teams[i % len(teams)],
                submitter=alice if i % len(teams) == 0 else bob,
                name=f"job-{i}",
                command="python train.py",
                gpus=0 if slice_job else (1 if is_running else rng.choice([1, 2, 4, 8])),
                gpu_memory_mib=rng.choice([10240, 20480, 40960]) if slice_job else 0,
                compute_pct=rng.choice([25, 50]) if slice_job else 0,
                priority_class=classes["training"],
                preemptible=True,
                max_runtime_s=rng.choice([3600, 7200, 14400]),
                state=JobState.RUNNING if is_running else JobState.PENDING,
                started_at=now if is_running else None,
                placed_at=now if is_running else None,
                attempt=1 if is_running else 0,
                queue_position=None if is_running else i - running + 1,
                pending_reason_code="" if is_running else "insufficient-gpus",
                pending_reason="" if is_running else "no node has enough free GPUs now",
            )
        )
    Job.objects.bulk_create(jobs, batch_size=2000)
    job_rows = list(Job.objects.order_by("id"))
    running_rows = [j for j in job_rows if j.state == JobState.RUNNING]
    Slice.objects.bulk_create(
        (
            Slice(job=j, gpu=gpu_rows[k], memory_mib=gpu_rows[k].memory_mib, compute_pct=100)
            for k, j in enumerate(running_rows)
        ),
        batch_size=2000,
    )
    with connection.cursor() as cursor:
        ids = [gpu_rows[k].pk for k in range(len(running_rows))]
        cursor.execute(
            f"UPDATE {Gpu._meta.db_table} SET allocated_memory_mib = memory_mib, allocated_compute_pct = 100 "
            "WHERE id = ANY(%s)",
            [ids],
        )
    events = []
    for j in job_rows:
        events.append(
            JobEvent(
                job=j,
                to_state=JobState.PENDING,
                actor_kind=ActorKind.USER,
                code="submitted",
                message="Submitted.",
            )
        )
        if j.state == JobState.RUNNING:
            events.append(
                JobEvent(
                    job=j,
                    from_state="pending",
                    to_state="placed",
                    actor_kind=ActorKind.SCHEDULER,
                    code="placed",
                )
            )
            events.append(
                JobEvent(
                    job=j, from_state="placed", to_state="running", actor_kind=ActorKind.AGENT, code="started"
                )
            )
    JobEvent.objects.bulk_create(events, batch_size=5000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return {
        "alice": alice,
        "job": next(j for j in running_rows if j.submitter_id == alice.pk),
        "team": teams[0],
    }


def time_requests(client, method: str, path: str, n: int, data: dict | None = None) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        response = client.post(path, data) if method == "POST" else client.get(path)
        out.append(time.perf_counter() - t0)
        if response.status_code != 200:
            raise RuntimeError(f"{method} {path}: {response.status_code}")
    return out


WHATIF_FORM = {
    "name": "what-if",
    "team": "lab/training",
    "kind": "whole",
    "gpus": "2",
    "topology": "nvlink",
    "nodes": "1",
    "command_form": "argv",
    "command": "python train.py",
}


def server_times(people: dict, requests: int) -> dict:
    from django.test import Client

    from scheduling.cycle import whatif

    client = Client()
    client.force_login(people["alice"])
    job = people["job"]
    time_requests(client, "GET", "/jobs/", 2)  # warm connections and caches
    out = {
        "jobs_page": summary_ms(time_requests(client, "GET", "/jobs/?scope=teams", requests)),
        "queue_page": summary_ms(time_requests(client, "GET", "/queue/", requests)),
        "job_page": summary_ms(time_requests(client, "GET", f"/jobs/{job.pk}/", requests)),
        "job_live_partial": summary_ms(time_requests(client, "GET", f"/jobs/{job.pk}/?part=live", requests)),
    }
    whatif._cached = None  # cold: the first answer reads the snapshot
    out["whatif_cold"] = summary_ms(time_requests(client, "POST", "/jobs/new/preview/", 1, WHATIF_FORM))
    # Steady state: each answer is one engine cycle on the snapshot held (a large cluster's snapshot is read
    # again in the background, never on the request; kept still here so a refresh does not compete for the CPU).
    whatif.SNAPSHOT_TTL_S = 3600.0
    out["whatif"] = summary_ms(
        time_requests(client, "POST", "/jobs/new/preview/", max(10, requests // 3), WHATIF_FORM)
    )
    return out


def push_to_dom(*, env: dict, people: dict, pages: int, changes: int) -> dict:
    """Commit-to-DOM latency on `pages` job pages open on one job, over `changes` state changes."""
    from django.db import transaction
    from playwright.sync_api import sync_playwright

    from scheduling.choices import ActorKind, JobState
    from scheduling.jobs.models import Job
    from scheduling.jobs.transitions import job_transition

    port = free_port()
    server = _daphne(env, port)
    latencies: list[float] = []  # commit -> the new state shown
    refreshed: list[float] = []  # commit -> the job's whole live part re-rendered (its events list)
    arrived: list[float] = []  # commit -> the first pushed part after it reached the page's socket
    try:
        wait_http(port)
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
        with sync_playwright() as p:
            browser = launch_chromium(p)
            context = browser.new_context(base_url=f"http://127.0.0.1:{port}")
            # When each page's socket brings it a pushed part (before any script handles it): the server's share of
            # the part's time, the rest is the page swapping it in.
            context.add_init_script(PART_ARRIVALS)
            sign_in(context.new_page(), "alice")
            job = people["job"]
            opened = []
            for _ in range(pages):
                page = context.new_page()
                page.goto(f"/jobs/{job.pk}/")
                page.wait_for_function(
                    "document.getElementById('live') && document.getElementById('live').textContent === 'live'"
                )
                page.evaluate(
                    """() => { window.__seen = {}; window.__parts = {}; const watch = () => {
                         const s = document.getElementById('job-state');
                         if (s && !window.__seen[s.textContent]) window.__seen[s.textContent] = Date.now();
                         const n = document.querySelectorAll('#job-live .timeline li').length;
                         if (!window.__parts[n]) window.__parts[n] = Date.now(); };
                       new MutationObserver(watch).observe(document.body, {subtree: true, childList: true, characterData: true}); }"""
                )
                opened.append(page)
            states = [JobState.PREEMPTED, JobState.PENDING, JobState.PLACED, JobState.RUNNING]
            row = Job.objects.get(pk=job.pk)
            events_shown = opened[0].evaluate("document.querySelectorAll('#job-live .timeline li').length")
            for n in range(changes):
                to = states[n % len(states)]
                with transaction.atomic():
                    row = Job.objects.select_for_update().get(pk=job.pk)
                    job_transition(
                        job=row, to_state=to, actor_kind=ActorKind.ADMIN, code="bench", message="bench"
                    )
                committed_ms = time.time() * 1000
                label = row.get_state_display()
                events_shown += 1
                deadline = time.time() + 30
                # The times are taken in each page; asking all of them over and over meanwhile would take the CPU
                # they measure with: one page is watched (in the page) until it shows both, then all are read.
                try:
                    opened[-1].wait_for_function(
                        f"window.__seen[{json.dumps(label)}] && window.__parts[{events_shown}]",
                        timeout=30_000,
                        polling=100,
                    )
                except Exception:  # noqa: BLE001 - the sweep below counts what never came
                    pass
                pending_pages = list(opened)
                while pending_pages and time.time() < deadline:
                    still = []
                    for page in pending_pages:
                        seen, part, came = page.evaluate(
                            f"[window.__seen[{json.dumps(label)}] || 0, window.__parts[{events_shown}] || 0,"
                            f" (window.__partsIn.find(t => t >= {committed_ms}) || 0)]"
                        )
                        if seen and part:
                            latencies.append(max(0.0, seen - committed_ms) / 1000)
                            refreshed.append(max(0.0, part - committed_ms) / 1000)
                            if came:
                                arrived.append(max(0.0, came - committed_ms) / 1000)
                            page.evaluate("window.__seen = {}; window.__parts = {}; window.__partsIn = []")
                        else:
                            still.append(page)
                    pending_pages = still
                    time.sleep(
                        0.25
                    )  # the times are taken in each page: asking less often only spares the CPU
                latencies.extend([30.0] * len(pending_pages))  # never shown within 30 s: counted as 30 s
                refreshed.extend([30.0] * len(pending_pages))
                time.sleep(1.0)
            browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    return {
        "state_shown": summary_ms(latencies),
        "part_refreshed": summary_ms(refreshed),
        "part_arrived": summary_ms(arrived) if arrived else None,
    }


# Each page's pushed parts, by when its socket brought them (ms since the epoch, as Date.now()).
PART_ARRIVALS = """
window.__partsIn = [];
(function () {
  const Native = window.WebSocket;
  window.WebSocket = function (url, protocols) {
    const socket = protocols === undefined ? new Native(url) : new Native(url, protocols);
    socket.addEventListener("message", function (e) {
      if (typeof e.data === "string" && e.data.indexOf('"type": "part"') >= 0) window.__partsIn.push(Date.now());
    });
    return socket;
  };
  window.WebSocket.prototype = Native.prototype;
  Object.assign(window.WebSocket, { CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3 });
})();
"""


def share_cards_and_sample(*, nodes: int, gpus_per_node: int, redis_url: str) -> dict:
    """For the cluster map: on every MPS node (every fifth), cards 0-3 shared by the slice already there (halved)
    and one of another team; and a live sample of every GPU in Redis (kept 10 min, long enough to measure)."""
    import redis
    from django.db import connection

    from scheduling.agents.live_metrics import live_metrics_key
    from scheduling.choices import JobState, SharingMode
    from scheduling.inventory.models import Gpu, Node
    from scheduling.jobs.models import Job, Slice

    shared = list(
        Slice.objects.filter(gpu__sharing_mode=SharingMode.MPS, gpu__index__lt=4).select_related("job", "gpu")
    )
    donor = (
        Job.objects.filter(state=JobState.RUNNING).exclude(team=shared[0].job.team).first()
        if shared
        else None
    )
    if shared and donor is not None:
        Slice.objects.filter(pk__in=[sl.pk for sl in shared]).update(memory_mib=40960, compute_pct=50)
        extra = [
            Job(
                team=donor.team,
                submitter=donor.submitter,
                name=f"serve-{k}",
                command="python serve.py",
                gpus=0,
                gpu_memory_mib=20480,
                compute_pct=25,
                priority_class=donor.priority_class,
                state=JobState.RUNNING,
                started_at=donor.started_at,
                placed_at=donor.placed_at,
                attempt=1,
            )
            for k in range(len(shared))
        ]
        Job.objects.bulk_create(extra, batch_size=2000)
        Slice.objects.bulk_create(
            (
                Slice(job=j, gpu=sl.gpu, memory_mib=20480, compute_pct=25)
                for j, sl in zip(extra, shared, strict=True)
            ),
            batch_size=2000,
        )
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {Gpu._meta.db_table} SET allocated_memory_mib = 61440, allocated_compute_pct = 75 "
                "WHERE id = ANY(%s)",
                [[sl.gpu_id for sl in shared]],
            )
    rng = random.Random(11)
    r = redis.Redis.from_url(redis_url)
    pipe = r.pipeline()
    now = time.time()
    for name in Node.objects.values_list("name", flat=True):
        gpus = [
            {
                "index": g,
                "uuid": f"{name}-{g}",
                "util_pct": round(rng.uniform(0, 100), 1),
                "mem_util_pct": round(rng.uniform(0, 60), 1),
                "memory_used_mib": rng.randrange(0, 81920),
                "memory_total_mib": 81920,
                "power_w": round(rng.uniform(60, 400), 1),
                "temperature_c": rng.randrange(30, 80),
                "sm_clock_mhz": rng.choice([210, 1410, 1980]),
                "health": "ok",
            }
            for g in range(gpus_per_node)
        ]
        pipe.set(live_metrics_key(name), json.dumps({"sampled_at": now, "gpus": gpus}), ex=600)
    pipe.execute()
    return {"shared_cards": len(shared)}


def cluster_map_times(*, env: dict, people: dict, loads: int, requests: int) -> dict:
    """The map's server times (in process) and, in Chromium over daphne, navigation start to the load event of
    /cluster/ and the time to open the largest group."""
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.utils import timezone
    from playwright.sync_api import sync_playwright

    from scheduling.inventory.cluster_map import cluster_groups
    from scheduling.inventory.models import Node

    client = Client()
    client.force_login(people["alice"])
    biggest = max(cluster_groups(), key=lambda g: g.nodes).name
    time_requests(client, "GET", "/cluster/", 2)
    out: dict = {
        "page_server": summary_ms(time_requests(client, "GET", "/cluster/", requests)),
        "group_part_server": summary_ms(
            time_requests(client, "GET", f"/cluster/?group={biggest}&part=group", requests)
        ),
        "node_page_server": summary_ms(time_requests(client, "GET", "/cluster/node-0001/", requests)),
        "group": biggest,
    }
    users = get_user_model()
    if not users.objects.filter(username="root").exists():
        users.objects.create_user(username="root", password="root-pw", is_staff=True)
    port = free_port()
    server = _daphne(env, port)
    loaded: list[float] = []
    opened: list[float] = []
    try:
        wait_http(port)
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
        with sync_playwright() as p:
            browser = launch_chromium(p)
            context = browser.new_context(
                base_url=f"http://127.0.0.1:{port}", viewport={"width": 1280, "height": 800}
            )
            page = sign_in(context.new_page(), "alice")
            page.goto("/cluster/")  # warm the server's and the browser's caches
            for _ in range(loads):
                page.goto("/cluster/", wait_until="load")
                page.wait_for_selector("details.group")
                loaded.append(
                    page.evaluate(
                        "(() => { const n = performance.getEntriesByType('navigation')[0];"
                        " return n.loadEventEnd - n.startTime; })()"
                    )
                    / 1000
                )
                selector = f"details.group[data-group={json.dumps(biggest)}]"
                t0 = time.perf_counter()
                page.click(f"{selector} > summary")
                page.wait_for_selector(f"{selector} .node-tile .gpu-cell")
                page.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")
                opened.append(time.perf_counter() - t0)
            out["tiles_on_open"] = page.locator(
                f"details.group[data-group={json.dumps(biggest)}] .node-tile"
            ).count()
            # A picture as staff see it (every team's slices named), for the docs.
            staff = browser.new_context(
                base_url=f"http://127.0.0.1:{port}", viewport={"width": 1280, "height": 800}
            ).new_page()
            sign_in(staff, "root")
            Node.objects.update(last_heartbeat_at=timezone.now())  # as if the agents were there
            staff.goto(f"/cluster/?group={biggest}")
            staff.wait_for_selector(".node-tile .gpu-cell")
            staff.screenshot(path=str(ROOT / "test-artifacts" / "bench-cluster-map.png"), full_page=False)
            browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    out["render"] = summary_ms(loaded)
    out["group_open"] = summary_ms(opened)
    return out


def _daphne(env: dict, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(Path(sys.executable).parent / "daphne"),
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "portal.asgi:application",
        ],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# --- history and capacity pages -------------------------------------------------------------------------------
HISTORY_USERS = 200  # researchers across the four teams, each hour's usage rows come from these


def build_history(
    *, people: dict, usage_days: int, node_days: int, finished_jobs: int, seed: float = 0.42
) -> dict:
    """30 days of rollups at cluster size, generated inside PostgreSQL (INSERT ... SELECT generate_series): the
    queue each minute, each GPU model and team each minute, hourly usage for every team x user x model that
    ran that hour, `finished_jobs` jobs started over the window (for queue times, rolled into their hourly
    rollup by the recorder's own `waits_roll`), and `node_days` days of node minutes (and one day of GPU 5-minute windows, to measure its size). Returns what was written and how long
    it took, with each table's size per day."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from quotas.models import Membership, Team
    from scheduling.history.models import (
        ClusterMinute,
        GpuFiveMinute,
        ModelMinute,
        NodeHour,
        NodeMinute,
        TeamMinute,
        UsageHour,
        WaitHour,
    )
    from scheduling.history.partitions import partitions_ensure
    from scheduling.history.recorder import waits_roll
    from scheduling.inventory.models import Gpu, GpuModel, Node
    from scheduling.jobs.models import Job

    t0 = time.perf_counter()
    users = get_user_model()
    users.objects.bulk_create(users(username=f"researcher-{i:03d}") for i in range(HISTORY_USERS))
    teams = list(Team.objects.filter(children__isnull=True).order_by("slug"))
    Membership.objects.bulk_create(
        Membership(user=u, team=teams[k % len(teams)])
        for k, u in enumerate(users.objects.filter(username__startswith="researcher-").order_by("pk"))
    )
    # Pools: nodes carry a `pool` label, eight pools of 125 nodes at 1,000 nodes.
    nodes = list(Node.objects.order_by("name"))
    for k, n in enumerate(nodes):
        n.labels = {"pool": f"pool-{k * 8 // len(nodes) + 1}"}
    Node.objects.bulk_update(nodes, ["labels"], batch_size=2000)
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    since = now - timedelta(days=usage_days)
    node_since = now - timedelta(days=node_days)
    partitions_ensure(days=[(since + timedelta(days=d)).date() for d in range(usage_days + 2)])
    # A working-day curve: 0.55 +- 0.35 with the hour of the day (UTC), as in the demo's generated history.
    load = "(0.55 + 0.35 * sin(2 * pi() * (EXTRACT(HOUR FROM {t}) - 9) / 24))"
    timings = {}
    job = Job._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(%s)", [seed])

        def run(name: str, sql: str, params: list) -> None:
            t = time.perf_counter()
            cursor.execute(sql, params)
            timings[name] = round(time.perf_counter() - t, 1)

        run(
            "cluster_minute",
            f"""INSERT INTO {ClusterMinute._meta.db_table} (at, pending_jobs, running_jobs, ready_nodes, nodes)
                SELECT t, (10000 * {load.format(t="t")})::int, (7900 * {load.format(t="t")})::int, 1000, 1000
                FROM generate_series(%s::timestamptz, %s::timestamptz - interval '1 minute', interval '1 minute') t""",
            [since, now],
        )
        run(
            "model_minute",
            f"""INSERT INTO {ModelMinute._meta.db_table}
                  (at, model_id, gpus, ready_gpus, allocated_milli, used_milli, free_gpus, stranded_milli)
                SELECT t, m.id, m.n, m.n - 8, (m.n * 1000 * {load.format(t="t")})::int,
                       (m.n * 700 * {load.format(t="t")})::int, (m.n * (1 - {load.format(t="t")}) * 0.8)::int,
                       (m.n * 30 * random())::int
                FROM generate_series(%s::timestamptz, %s::timestamptz - interval '1 minute', interval '1 minute') t
                CROSS JOIN (SELECT model_id AS id, COUNT(*) AS n FROM {Gpu._meta.db_table} GROUP BY model_id) m""",
            [since, now],
        )
        run(
            "team_minute",
            f"""INSERT INTO {TeamMinute._meta.db_table} (at, team_id, guaranteed_milli, limit_milli, held_milli,
                  borrowed_milli, fair_share_milli, pending_jobs, pending_milli, running_jobs)
                SELECT t, tm.id, 1600000, NULL, (1975000 * {load.format(t="t")})::int, 0, NULL,
                       (2500 * {load.format(t="t")})::int, (2500000 * {load.format(t="t")})::int,
                       (1975 * {load.format(t="t")})::int
                FROM generate_series(%s::timestamptz, %s::timestamptz - interval '1 minute', interval '1 minute') t
                CROSS JOIN (SELECT id FROM {Team._meta.db_table} WHERE id = ANY(%s)) tm""",
            [since, now, [t.pk for t in teams]],
        )
        # Each hour, about 60 % of the researchers ran something, on one or both GPU models.
        run(
            "usage_hour",
            f"""INSERT INTO {UsageHour._meta.db_table}
                  (hour, team_id, user_id, model_id, gpu_seconds, gpu_memory_gib_seconds, idle_gpu_seconds)
                SELECT h, ms.team_id, ms.user_id, m.id, g, g * 70, g * 0.1 * random()
                FROM generate_series(%s::timestamptz, %s::timestamptz - interval '1 hour', interval '1 hour') h
                CROSS JOIN (SELECT user_id, team_id FROM {Membership._meta.db_table}) ms
                CROSS JOIN (SELECT id FROM {GpuModel._meta.db_table}) m
                CROSS JOIN LATERAL (SELECT 3600 * 40 * random() * {load.format(t="h")} AS g) v
                WHERE random() < 0.6""",
            [since, now],
        )
        template = people["job"].pk
        columns = [f.column for f in Job._meta.concrete_fields if f.column != "id"]
        override = {
            "name": "'finished-' || k",
            "state": "'succeeded'",
            "team_id": f"(ARRAY{[t.pk for t in teams]})[1 + k %% {len(teams)}]",
            "submitted_at": "s.started - s.wait",
            "placed_at": "s.started",
            "started_at": "s.started",
            "finished_at": "s.started + interval '1 hour'",
            "exit_code": "0",
            "queue_position": "NULL",
            "pending_reason_code": "''",
            "pending_reason": "''",
        }
        select = ", ".join(override.get(c, f"j.{c}") for c in columns)
        run(
            "jobs",
            f"""INSERT INTO {job} ({", ".join(columns)})
                SELECT {select} FROM {job} j CROSS JOIN generate_series(1, %s) k
                CROSS JOIN LATERAL (SELECT %s::timestamptz + (random() * %s) * interval '1 second' AS started,
                    (CASE WHEN random() < 0.1 THEN 7200 ELSE 300 END * random()) * interval '1 second' AS wait
                    WHERE k > 0) s
                WHERE j.id = %s""",
            [finished_jobs, since, usage_days * 86400, template],
        )
        t = time.perf_counter()
        waits_roll(
            now=now, since=since
        )  # what the recorder does each few minutes, over the whole window at once
        timings["wait_hour"] = round(time.perf_counter() - t, 1)
        run(
            "node_minute",
            f"""INSERT INTO {NodeMinute._meta.db_table} (node_id, at, state, gpus, allocated_milli, util_pct,
                  memory_used_mib, memory_allocated_mib, memory_mib, power_w, temperature_max_c)
                SELECT n.id, t, 'ready', 8, a * 1000, LEAST(100, a * 12 * random()), a * 60000, a * 81920, 655360,
                       400 + a * 300 * random(), 40 + a * 5
                FROM generate_series(%s::timestamptz, %s::timestamptz - interval '1 minute', interval '1 minute') t
                CROSS JOIN {Node._meta.db_table} n
                CROSS JOIN LATERAL (SELECT LEAST(8, GREATEST(0, round(8 * {load.format(t="t")}
                                    + (n.id %% 7 - 3) * 0.3)))::int AS a WHERE n.id > 0) v""",
            [node_since, now],
        )
        run(
            "node_hour",
            f"""INSERT INTO {NodeHour._meta.db_table} (node_id, hour, minutes, gpus, allocated_milli_sum,
                  util_pct_sum, util_minutes)
                SELECT n.id, t, 60, 8, 60 * a * 1000, 60 * LEAST(100, a * 12 * (0.5 + 0.5 * random())), 60
                FROM generate_series(%s::timestamptz, %s::timestamptz, interval '1 hour') t
                CROSS JOIN {Node._meta.db_table} n
                CROSS JOIN LATERAL (SELECT LEAST(8, GREATEST(0, round(8 * {load.format(t="t")}
                                    + (n.id %% 7 - 3) * 0.3)))::int AS a WHERE n.id > 0) v""",
            [since.replace(minute=0), now.replace(minute=0)],
        )
        day = now - timedelta(days=1)
        run(
            "gpu_five_minute_1d",
            f"""INSERT INTO {GpuFiveMinute._meta.db_table} (gpu_id, at, node_id, samples, util_pct_sum,
                  memory_used_mib_max, memory_allocated_mib, temperature_c_max, power_w_sum, sm_clock_mhz_sum,
                  ecc_uncorrected)
                SELECT g.id, t, g.node_id, 5, 5 * 100 * random(), 60000, 81920, 60, 5 * 400, 5 * 1410, 0
                FROM generate_series(%s::timestamptz, %s::timestamptz - interval '5 minutes', interval '5 minutes') t
                CROSS JOIN {Gpu._meta.db_table} g""",
            [day, now],
        )
        cursor.execute("ANALYZE")

        def size(table: str) -> int:
            """Bytes with indexes, summed over a partitioned table's partitions."""
            cursor.execute(
                "SELECT COALESCE(SUM(pg_total_relation_size(relid)), pg_total_relation_size(%s::regclass)) "
                "FROM pg_partition_tree(%s::regclass) WHERE isleaf",
                [table, table],
            )
            return int(cursor.fetchone()[0])

        def rows(table: str) -> int:
            cursor.execute(f"SELECT COUNT(*) FROM {table}")
            return int(cursor.fetchone()[0])

        days_of = {
            NodeMinute: node_days,
            NodeHour: usage_days,
            GpuFiveMinute: 1,
            ModelMinute: usage_days,
            TeamMinute: usage_days,
            ClusterMinute: usage_days,
            UsageHour: usage_days,
            WaitHour: usage_days,
        }
        tables = {}
        for model, days in days_of.items():
            table = model._meta.db_table
            total = size(table)
            tables[table] = {
                "rows": rows(table),
                "days": days,
                "mib": round(total / 2**20, 2),
                "mib_per_day": round(total / 2**20 / days, 2),
            }
        tables[job] = {"rows": rows(job), "finished_jobs_added": finished_jobs}
    return {"built_s": round(time.perf_counter() - t0, 1), "insert_s": timings, "tables": tables}


def history_times(people: dict, requests: int) -> dict:
    from django.test import Client

    client = Client()
    client.force_login(people["alice"])
    time_requests(client, "GET", "/history/?window=30d", 2)
    time_requests(client, "GET", "/capacity/", 2)
    pages = {
        "history_30d": "/history/?window=30d",
        "history_30d_by_user": "/history/?window=30d&by=user",
        "history_7d": "/history/?window=7d",
        "capacity_24h": "/capacity/",
        "capacity_7d": "/capacity/?window=7d",
        "capacity_pool_7d": "/capacity/?window=7d&pool=pool-1",
        "capacity_now_part": "/capacity/?part=now",
    }
    return {name: summary_ms(time_requests(client, "GET", path, requests)) for name, path in pages.items()}


def wait_http(port: int) -> None:
    import http.client

    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the portal did not start")


def ensure_database(url: str) -> None:
    from urllib.parse import urlparse

    import psycopg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    with psycopg.connect(parsed._replace(path="/postgres").geturl(), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tessera_bench_portal"
        ),
    )
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument(
        "--free-gpus",
        type=int,
        default=100,
        help="GPUs left free; the rest run 1-GPU jobs (a queue of 10,000 waits on a full cluster)",
    )
    parser.add_argument("--requests", type=int, default=60, help="timed requests per page")
    parser.add_argument("--pages", type=int, default=100, help="browser pages for push_to_dom (0: skip)")
    parser.add_argument("--changes", type=int, default=8, help="state changes pushed to the pages")
    parser.add_argument(
        "--map-loads", type=int, default=10, help="loads of the cluster map timed in Chromium"
    )
    parser.add_argument("--history-days", type=int, default=30, help="days of history rollups (0: skip)")
    parser.add_argument(
        "--history-node-days",
        type=int,
        default=7,
        help="days of node minutes (the capacity page reads at most 7; 30 would take ~20 min to generate here)",
    )
    parser.add_argument("--history-jobs", type=int, default=100_000, help="finished jobs over the window")
    parser.add_argument("--history-requests", type=int, default=20, help="timed requests per history page")
    parser.add_argument(
        "--only",
        choices=("all", "cluster-map", "history", "push"),
        default="all",
        help="cluster-map: only the cluster map's figures; history: only the history and capacity pages'; "
        "push: only the pages' live updates (push_to_dom)",
    )
    args = parser.parse_args(argv)
    env = {
        **os.environ,
        "DATABASE_URL": args.database_url,
        "REDIS_URL": args.redis_url,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "DATABASE_CONN_MAX_AGE": "600",
        "LOG_LEVEL": "WARNING",
        "DEBUG": "false",
        "AXES_ENABLED": "false",
        # One user with a hundred pages open: far above the per-user and per-session socket caps.
        "TESSERA_MAX_SOCKETS_PER_USER": "10000",
        "TESSERA_MAX_SOCKETS_PER_SESSION": "10000",
    }
    os.environ.update(env)
    ensure_database(args.database_url)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    t0 = time.perf_counter()
    running = max(0, args.nodes * args.gpus_per_node - args.free_gpus)
    people = build_cluster(
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, pending=args.pending, running=running
    )
    built_s = time.perf_counter() - t0
    only = args.only
    times = server_times(people, args.requests) if only == "all" else None
    push = (
        push_to_dom(env=env, people=people, pages=args.pages, changes=args.changes)
        if args.pages and only in ("all", "push")
        else None
    )
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    cluster_map = None
    if only in ("all", "cluster-map"):
        shared = share_cards_and_sample(
            nodes=args.nodes, gpus_per_node=args.gpus_per_node, redis_url=args.redis_url
        )
        cluster_map = cluster_map_times(
            env=env, people=people, loads=args.map_loads, requests=max(5, args.requests // 3)
        )
        cluster_map.update(shared)
    built_history = hist = None
    if args.history_days and only in ("all", "history"):
        built_history = build_history(
            people=people,
            usage_days=args.history_days,
            node_days=min(args.history_node_days, args.history_days),
            finished_jobs=args.history_jobs,
        )
        hist = history_times(people, args.history_requests)
    result = {
        "benchmark": "portal",
        "cluster": {
            "nodes": args.nodes,
            "gpus": args.nodes * args.gpus_per_node,
            "pending": args.pending,
            "running": running,
            "built_s": round(built_s, 1),
        },
        "machine": {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2)},
        "jobs_page_p95_ms": times["jobs_page"]["p95"] if times else None,
        "queue_page_p95_ms": times["queue_page"]["p95"] if times else None,
        "job_page_p95_ms": times["job_page"]["p95"] if times else None,
        "whatif_p95_ms": times["whatif"]["p95"] if times else None,
        "whatif_cold_ms": times["whatif_cold"]["max"] if times else None,
        "cluster_map_render_ms": cluster_map["render"]["p95"] if cluster_map else None,
        "cluster_map_group_open_ms": cluster_map["group_open"]["p95"] if cluster_map else None,
        "push_to_dom_p95_ms": push["state_shown"]["p95"] if push else None,
        "push_part_refreshed_p95_ms": push["part_refreshed"]["p95"] if push else None,
        "push_part_arrived_p95_ms": (push["part_arrived"] or {}).get("p95") if push else None,
        "history_page_p95_ms": hist["history_30d"]["p95"] if hist else None,
        "capacity_page_p95_ms": hist["capacity_24h"]["p95"] if hist else None,
        "history": {
            "usage_days": args.history_days,
            "node_minute_days": min(args.history_node_days, args.history_days),
            "note": "node minutes for the capacity page's longest window (7 d), not 30: generating 43 M rows "
            "would take far past this benchmark's budget here; the history page reads no node rows",
            "build": built_history,
            "pages": hist,
        }
        if hist
        else None,
        "detail": {
            **(times or {}),
            "push_to_dom": push,
            "pages": args.pages,
            "changes": args.changes,
            "cluster_map": cluster_map,
        },
        "targets": {
            "history_page_p95_ms": 300,
            "jobs_page_p95_ms": 150,
            "queue_page_p95_ms": 150,
            "job_page_p95_ms": 100,
            "push_to_dom_p95_ms": 1000,
            "push_part_refreshed_p95_ms": 1000,
            "whatif_p95_ms": 300,
            "cluster_map_render_ms": 1000,
        },
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
