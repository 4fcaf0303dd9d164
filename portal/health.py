"""Health checks of Tessera's processes, for container healthchecks (docker-compose.yml):
`python -m portal.health web|worker|beat|agent`. Exit status 0 when healthy, 1 with one line saying why otherwise.

- web: the portal answers /healthz (the process is alive: compose's healthcheck) or, given --url .../readyz, is
  ready (database, Redis, a recent scheduling cycle, beat: `readiness`; for rollouts and alerts, not restarts).
- worker: this host's Celery worker answers a ping through the broker.
- beat: beat sent its periodic cycle request recently. Beat keeps no state a probe could read, so every process
  notes in Redis when it publishes that task (`scheduling.coordination.beat_note_publish`, connected in
  portal.celery); only beat does. A standby beat (portal.beat) is healthy while the active one sends.
- agent: the node agent's lease (`<work dir>/lease.json`, renewed each time the portal acknowledges one of its
  heartbeats) is fresh: the agent runs and the portal hears it. Needs no Django and no portal credentials.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence


def check_web(*, url: str, timeout_s: float) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - a URL the operator set
            body = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:  # /readyz answers 503 with what failed
        return f"{url}: {exc.code} {_failed_checks(exc)}"
    except (OSError, ValueError) as exc:
        return f"{url}: {exc}"
    return None if body.get("status") == "ok" or body.get("ready") is True else f"{url} answered {body!r}"


def _failed_checks(error: urllib.error.HTTPError) -> str:
    try:
        checks = json.loads(error.read() or b"{}").get("checks", {})
    except (OSError, ValueError):
        return ""
    return "; ".join(f"{name}: {c.get('detail')}" for name, c in checks.items() if not c.get("ok"))


def check_worker(*, node: str, timeout_s: float) -> str | None:
    from portal.celery import app

    try:
        replies = app.control.ping(destination=[node], timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - the broker is unreachable: not healthy, say why
        return f"cannot reach the broker: {type(exc).__name__}: {exc}"
    if not any(node in reply for reply in replies):
        return f"worker {node} did not answer a ping within {timeout_s:g} s"
    return None


def check_agent(*, work_dir: str, max_age_s: float) -> str | None:
    """The agent's lease was renewed within `max_age_s` (its monotonic stamp, the clock its supervisors fence by;
    the wall-clock one after a reboot, when the monotonic clock started again)."""
    path = os.path.join(work_dir, "lease.json")
    try:
        with open(path) as fh:
            lease = json.load(fh)
    except FileNotFoundError:
        return f"no {path}: the agent has not started with this work dir"
    except (OSError, ValueError) as exc:
        return f"cannot read {path}: {exc}"
    age_s = time.monotonic() - float(lease.get("renewed_mono", float("-inf")))
    if age_s < 0 or age_s == float("inf"):
        age_s = time.time() - float(lease.get("renewed_at", 0))
    if age_s > max_age_s:
        return (
            f"the agent's lease was last renewed {age_s:.0f} s ago (more than {max_age_s:g} s): the agent is not "
            "running, or the portal has not acknowledged its heartbeats"
        )
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m portal.health", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="process", required=True)
    web = sub.add_parser("web", help="the portal answers /healthz")
    web.add_argument("--url", default="http://localhost:8000/healthz")
    web.add_argument("--timeout-s", type=float, default=5.0)
    worker = sub.add_parser("worker", help="this host's Celery worker answers a ping")
    worker.add_argument(
        "--node", default=f"celery@{socket.gethostname()}", help="worker name (default: %(default)s)"
    )
    worker.add_argument("--timeout-s", type=float, default=5.0)
    beat = sub.add_parser("beat", help="beat sent its periodic cycle request recently")
    beat.add_argument(
        "--max-age-s",
        type=float,
        default=None,
        help="default: three cycle intervals (TESSERA_CYCLE_INTERVAL_S) + 10",
    )
    agent = sub.add_parser("agent", help="the node agent's lease is fresh (the portal acknowledges it)")
    agent.add_argument(
        "--work-dir",
        default=os.environ.get("TESSERA_AGENT_WORK_DIR", "/var/lib/tessera-agent"),
        help="the agent's --work-dir (default: TESSERA_AGENT_WORK_DIR, else %(default)s)",
    )
    agent.add_argument(
        "--max-age-s",
        type=float,
        default=50.0,
        help="unhealthy past this (default %(default)s s: the portal's default TESSERA_NODE_LOST_AFTER_S)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.process == "web":
        problem = check_web(url=args.url, timeout_s=args.timeout_s)
    elif args.process == "agent":
        problem = check_agent(work_dir=args.work_dir, max_age_s=args.max_age_s)
    else:
        import django

        django.setup()
        if args.process == "worker":
            problem = check_worker(node=args.node, timeout_s=args.timeout_s)
        else:
            from django.conf import settings

            max_age_s = args.max_age_s
            if max_age_s is None:
                max_age_s = 3 * float(settings.TESSERA_CYCLE_INTERVAL_S) + 10
            from scheduling.observability.readiness import check_beat

            problem = check_beat(max_age_s=max_age_s)
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    sys.exit(main())
