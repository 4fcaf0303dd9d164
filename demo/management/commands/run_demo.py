"""Run the whole embedded path in one command: the ASGI portal, the scheduling loop and one simulated agent per node.

`make demo` calls it after `load_demo`. The cycle and the node watchdog run inside the server's event loop (their
database work on its sync thread), so the in-memory channel layer reaches the agents' websockets with no Redis;
each demo node gets a `tessera-agent run --backend sim` process whose GPUs mirror the node's inventory.
Production runs the same pieces as separate processes (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import yaml
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from agent import procfs
from demo.workload import DEFAULT_SEED, DemoSubmitter
from scheduling.choices import LinkKind
from scheduling.cycle import requests, runner
from scheduling.cycle.idle import idle_check
from scheduling.cycle.watchdog import lost_jobs_check, nodes_check, preemptions_check, releasing_check
from scheduling.history import recorder
from scheduling.inventory.models import GpuLink, Node
from scheduling.notifications.services import notifications_deliver_due

log = logging.getLogger("tessera.demo")

# The demo's jobs name scripts (train.py, serve.py, embed.py) that do not exist on this machine. On the simulated
# agents' PATH this stand-in plays them, each as what it is: an inference server logs its requests, a batch job its
# batches, training its steps and loss; then it exits 0. Real interpreters run anything else.
DEMO_PYTHON = """#!/bin/sh
# Tessera demo stand-in: plays missing demo scripts; runs real Python otherwise.
if [ -n "$1" ] && [ "${1%.py}" != "$1" ] && [ ! -e "$1" ]; then
  # The living demo's jobs say how long they run (TESSERA_DEMO_STEPS, demo/workload.py); others 20-60 steps.
  steps=${TESSERA_DEMO_STEPS:-$(( $(od -An -N1 -tu1 /dev/urandom) % 40 + 20 ))}
  step_s=${TESSERA_DEMO_STEP_S:-5}  # the seconds between its lines (demo.workload.STEP_S)
  script=$(basename "$1")
  case "$script" in
    serve*)
      echo "[demo] $1 is simulated here: an inference server for about $(( (steps * step_s + 59) / 60 )) min"
      echo "loading model weights ... done"
      echo "serving on 0.0.0.0:8000"
      i=1; while [ $i -le $steps ]; do
        n=$(( $(od -An -N1 -tu1 /dev/urandom) % 40 + 10 ))
        printf 'served %d requests in the last %d s (p50 %d ms, p99 %d ms)\\n' $n $step_s $(( 80 + n )) $(( 240 + 4 * n ))
        sleep $step_s; i=$((i+1))
      done
      echo "shutting down: drained, 0 requests in flight";;
    embed*)
      echo "[demo] $1 is simulated here: $steps batches of 512 documents"
      i=1; while [ $i -le $steps ]; do
        printf 'batch %d/%d: 512 documents embedded (%d in all)\\n' $i $steps $(( i * 512 ))
        sleep $step_s; i=$((i+1))
      done;;
    *)
      echo "[demo] $1 is simulated here: $steps steps of $step_s s"
      i=1; while [ $i -le $steps ]; do
        milli=$(( 1000 / (i + 1) )); printf 'step %d/%d loss=%d.%03d\\n' $i $steps $((milli / 1000)) $((milli % 1000))
        sleep $step_s; i=$((i+1))
      done;;
  esac
  echo "[demo] done"; exit 0
fi
exec "{python}" "$@"
"""

NOTIFY_EVERY_S = 5.0
WORKLOAD_EVERY_S = 5.0
# The examples (docs/examples/) also run `torchrun train.py ...` and `jupyter lab`: on the agents' PATH these play
# a missing script (torchrun) or a notebook server (jupyter, when this machine has none) the same way.
DEMO_TORCHRUN = """#!/bin/sh
# Tessera demo stand-in: plays torchrun with a missing demo script; runs the real torchrun otherwise.
for a in "$@"; do
  case "$a" in *.py) [ -e "$a" ] || exec python "$a";; esac
done
exec "{real}" "$@"
"""
DEMO_JUPYTER = """#!/bin/sh
# Tessera demo stand-in: plays a notebook server when this machine has no Jupyter. A job serving a `jupyter` port
# gets a server that answers through the portal's proxy (demo/notebook_stand_in.py).
if [ -n "$TESSERA_PORT_JUPYTER" ]; then exec "{python}" "{stand_in}" jupyter; fi
echo "[demo] jupyter $* is simulated here: a notebook server for a few minutes"
steps=${TESSERA_DEMO_STEPS:-36}
i=1; while [ $i -le $steps ]; do echo "[demo] notebook kernel idle ($i/$steps)"; sleep 5; i=$((i+1)); done
echo "[demo] done"; exit 0
"""
STAND_INS = ("python", "torchrun", "jupyter")


def sim_spec(node) -> dict:
    """A simulated-backend YAML for a node, mirroring its GPUs (model, memory, NUMA, sharing) and NVLink."""

    gpus = [
        {
            "model": g.model.name,
            "count": 1,
            "memory_mib": g.memory_mib,
            "compute_capability": str(g.model.compute_capability),
            "numa_node": g.numa_node,
            "sharing": g.sharing_mode,
        }
        for g in node.gpus.select_related("model").order_by("index")
    ]
    links = [
        [a, b, n]
        for a, b, n in GpuLink.objects.filter(gpu_a__node=node, kind=LinkKind.NVLINK).values_list(
            "gpu_a__index", "gpu_b__index", "nvlink_count"
        )
    ]
    return {"node": node.name, "gpus": gpus, "nvlink": links}


class Command(BaseCommand):
    help = "Serve the portal with the scheduling loop and simulated node agents, all in one command."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-agents", action="store_true", help="do not start simulated agents")
        parser.add_argument(
            "--seed",
            type=int,
            default=DEFAULT_SEED,
            help="the other teams' workload (demo/workload.py): the same seed submits the same work at the same "
            "clock times",
        )
        parser.add_argument(
            "--no-workload", action="store_true", help="the other teams submit nothing (only the loaded jobs)"
        )

    def handle(self, *args, host: str, port: int, no_agents: bool, seed: int, no_workload: bool, **options):
        if settings.REDIS_URL:
            self.stderr.write(
                "REDIS_URL is set: cycles would go to Celery. The demo runs embedded; unset REDIS_URL, or run "
                "web, worker, beat and agents as docs/operations.md describes."
            )
            sys.exit(2)
        if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
            # The cycle, the watchdog and the requests share one SQLite file: wait for its lock, never fail on it.
            from django.db import connections

            connections["default"].settings_dict.setdefault("OPTIONS", {})["timeout"] = 30
        # Every simulated node is this host: a session's web port is on loopback.
        settings.TESSERA_SESSION_ALLOW_LOOPBACK = True
        # The pages that draw history say that the demo's past was generated (load_demo --history-days).
        settings.TESSERA_DEMO = True
        agents = [] if no_agents else self._start_agents(f"http://{host}:{port}")
        try:
            self._serve(host, port, seed=None if no_workload else seed)
        finally:
            for proc in agents:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in agents:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            if agents:
                _stop_demo_jobs(Path(settings.VAR_DIR) / "demo-agents")
            # A scheduling step stopped mid-cycle waits on the event loop it publishes through, which is gone:
            # Python's exit would join its thread for ever (Ctrl-C, then nothing). All that matters has been
            # committed or rolled back; what the demo started is stopped above.
            failed = sys.exc_info()[0] is not None and not issubclass(
                sys.exc_info()[0], KeyboardInterrupt | SystemExit
            )
            if failed:
                traceback.print_exc()
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1 if failed else 0)

    # -- agents -------------------------------------------------------------------------------------------------
    def _start_agents(self, portal_url: str) -> list[subprocess.Popen]:
        root = Path(settings.VAR_DIR) / "demo-agents"
        bin_dir = root / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        write_stand_ins(bin_dir)
        # The agents run this checkout's agent package, as the portal runs this checkout (an installed
        # `tessera-agent` may be another's: a shared virtual environment).
        argv0 = [sys.executable, "-m", "agent.cli"]
        python_path = os.pathsep.join(p for p in (str(settings.BASE_DIR), os.environ.get("PYTHONPATH")) if p)
        env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": python_path,
        }
        # Simulated nodes on this machine: jobs run as the user running the demo (as root the agents would give
        # each job a user of its own, who may not run this checkout's Python).
        env.setdefault("TESSERA_AGENT_JOB_USERS", "agent")
        procs = []
        for node in Node.objects.prefetch_related("gpus").order_by("name"):
            token = Path(settings.VAR_DIR) / "agent-tokens" / f"{node.name}.token"
            if not token.exists():
                self.stderr.write(
                    f"no agent token for {node.name} ({token}): run `manage.py load_demo` first"
                )
                continue
            spec = root / f"{node.name}.yaml"
            spec.write_text(yaml.safe_dump(sim_spec(node), sort_keys=False))
            log_file = open(root / f"{node.name}.log", "ab")  # noqa: SIM115 - the agent keeps it
            procs.append(
                subprocess.Popen(
                    [
                        *argv0,
                        "run",
                        "--backend",
                        "sim",
                        "--sim-config",
                        str(spec),
                        "--node",
                        node.name,
                        # Every simulated node is this host: a gang's members and a session's proxy reach it here.
                        "--address",
                        "127.0.0.1",
                        "--portal",
                        portal_url,
                        "--token-file",
                        str(token),
                        "--work-dir",
                        str(root / node.name),
                    ],
                    env=env,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                )
            )
        self.stdout.write(f"Started {len(procs)} simulated node agents (logs in {root}).")
        return procs

    # -- server and scheduling loop -------------------------------------------------------------------------------
    def _serve(self, host: str, port: int, *, seed: int | None) -> None:
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server, twisted_loop

        from portal.asgi import application

        logging.getLogger("daphne.server").addFilter(_WithoutHttp2Note())
        # One line per request would bury the scheduling lines: the demo shows the 4xx and 5xx ones (portal/logs.py).
        logging.getLogger("tessera.access").setLevel(logging.WARNING)

        def ready() -> None:
            asyncio.ensure_future(scheduling_loop(seed=seed), loop=twisted_loop)
            self.stdout.write(
                f"Tessera is serving on http://{host}:{port}/ with the scheduling loop running."
            )

        Server(
            application=application,
            endpoints=build_endpoint_description_strings(host=host, port=port),
            ready_callable=ready,
        ).run()


def write_stand_ins(bin_dir: Path) -> None:
    """The demo agents' PATH: `python` and `torchrun` stand-ins always (they run what exists), `jupyter` only when
    this machine has none."""
    real_torchrun = shutil.which("torchrun")
    scripts = {
        "python": DEMO_PYTHON.replace("{python}", shutil.which("python3") or sys.executable),
        "torchrun": DEMO_TORCHRUN.replace(
            '"{real}"', f'"{real_torchrun}"' if real_torchrun else "python -m torch.distributed.run"
        ),
        "jupyter": None
        if shutil.which("jupyter")
        else DEMO_JUPYTER.replace("{python}", sys.executable).replace(
            "{stand_in}", str(Path(__file__).resolve().parents[2] / "notebook_stand_in.py")
        ),
    }
    for name, text in scripts.items():
        path = bin_dir / name
        if text is None:
            path.unlink(missing_ok=True)
            continue
        path.write_text(text)
        path.chmod(0o755)


class _WithoutHttp2Note(logging.Filter):
    """daphne says at every start that HTTP/2 is off (no h2 extras): nothing a demo user can act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("HTTP/2 support")


def _stop_demo_jobs(root: Path) -> None:
    """Agents leave their jobs running when they stop (a restarted agent re-adopts them). The demo's jobs stop
    with the demo; the next run finds them gone and requeues them."""
    for launch in root.glob("*/jobs/*/*/launch.json"):
        if (launch.parent / "outcome.json").exists():
            continue
        try:
            record = json.loads(launch.read_text())
            # Only the supervisor the agent launched, never a later process that reuses its pid; then its job.
            if procfs.is_same_process(int(record["pid"]), record.get("start_ticks")):
                os.kill(int(record["pid"]), signal.SIGKILL)
                job = json.loads((launch.parent / "job.json").read_text())
                os.killpg(int(job["pgid"]), signal.SIGKILL)
        except (OSError, ValueError, KeyError, TypeError):
            pass


def _scheduling_step(state: dict) -> None:
    """Run what is due: cycles while requested (or every interval), the watchdog and the history every interval."""
    now = time.monotonic()
    if state["workload"] is not None and now - state["workload_at"] >= WORKLOAD_EVERY_S:
        state["workload_at"] = now
        if state["workload"].step():  # the other teams' work, as the clock passes
            requests.local_cycle_wanted.set()
    if now - state["notified_at"] >= NOTIFY_EVERY_S:
        state["notified_at"] = now
        notifications_deliver_due()  # the console's email backend in the demo: instant
    if now - state["history_at"] >= settings.TESSERA_HISTORY_INTERVAL_S:
        state["history_at"] = now
        recorder.history_record()
        state["usage_rolls"] += 1
        # A small cluster's hour of usage is cheap to recount: each minute, so the history page's current hour
        # is as fresh as the chargeback's.
        recorder.usage_hours_roll()
        if state["usage_rolls"] % 5 == 1:
            recorder.waits_roll()
        if state["usage_rolls"] % 60 == 1:
            recorder.history_maintain()
    if now - state["watchdog_at"] >= settings.TESSERA_WATCHDOG_INTERVAL_S:
        state["watchdog_at"] = now
        if any(
            [nodes_check(), lost_jobs_check(), preemptions_check(), releasing_check()]
        ):  # each, every round
            requests.local_cycle_wanted.set()
    if now - state["idle_at"] >= settings.TESSERA_IDLE_CHECK_INTERVAL_S:
        state["idle_at"] = now
        if any(idle_check().values()):
            requests.local_cycle_wanted.set()
    if requests.local_cycle_wanted.is_set() or now - state["cycle_at"] >= settings.TESSERA_CYCLE_INTERVAL_S:
        state["cycle_at"] = now
        runner.run_cycles(holder="demo")


async def scheduling_loop(*, seed: int | None = DEFAULT_SEED) -> None:
    state = {
        "cycle_at": 0.0,
        "watchdog_at": 0.0,
        "idle_at": 0.0,
        "history_at": 0.0,
        "usage_rolls": 0,
        "notified_at": 0.0,
        "workload_at": 0.0,
        "workload": DemoSubmitter(seed=seed) if seed is not None else None,
    }
    step = sync_to_async(_scheduling_step, thread_sensitive=True)
    while True:
        try:
            await step(state)
        except Exception:
            log.exception("scheduling step failed; retrying")
            await sync_to_async(close_old_connections, thread_sensitive=True)()
        # Wake quickly on a request (a submit, a finish), otherwise at the next interval.
        for _ in range(20):
            if requests.local_cycle_wanted.is_set():
                break
            await asyncio.sleep(0.05)
