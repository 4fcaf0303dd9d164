"""Health checks of the portal's processes, for container healthchecks (docker-compose.yml):
`python -m portal.health web|worker|beat`. Exit status 0 when healthy, 1 with one line saying why otherwise.

- web: the portal answers /healthz (the process is alive) or, given --url .../readyz, is ready (database, Redis,
  a recent scheduling cycle, beat: `readiness`).
- worker: this host's Celery worker answers a ping through the broker.
- beat: beat sent its periodic cycle request recently. Beat keeps no state a probe could read, so every process
  notes in Redis when it publishes that task (`scheduling.coordination.beat_note_publish`, connected in
  portal.celery); only beat does.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.process == "web":
        problem = check_web(url=args.url, timeout_s=args.timeout_s)
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
