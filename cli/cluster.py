"""The cluster: `tessera nodes` (sinfo) and `top`, a live view of nodes, teams and the queue."""

from __future__ import annotations

import argparse
import select
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from cli.client import Client, ExitCode
from cli.output import command_parser, human_duration, print_json, request_text, run_command, shorten, table


def _gpu_bar(gpu: dict[str, Any], width: int = 10) -> str:
    share = max(
        gpu["allocated_memory_mib"] / gpu["memory_mib"] if gpu["memory_mib"] else 0,
        gpu["allocated_compute_pct"] / max(1, gpu["compute_capacity_pct"]),
    )
    filled = round(min(1.0, share) * width)
    mark = "#" if any(s["mine"] for s in gpu["slices"]) else "="
    return "[" + mark * filled + "." * (width - filled) + "]"


def nodes(argv: Sequence[str]) -> int:
    parser = command_parser("nodes", "Nodes and their GPUs (sinfo-like); '#' marks GPUs your teams use.")
    parser.add_argument("--state")
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        rows = Client.from_config().get_all("/api/v1/cluster/nodes/", limit=10_000, state=args.state)
        if args.json:
            print_json(rows)
            return ExitCode.OK
        print(_nodes_table(rows))
        return ExitCode.OK

    return run_command(handle, args)


def _nodes_table(rows: list[dict[str, Any]]) -> str:
    out = []
    for n in rows:
        gpus = n["gpus"]
        models = sorted({g["model"] for g in gpus})
        used = sum(1 for g in gpus if g["allocated_memory_mib"] or g["allocated_compute_pct"])
        conditions = n.get("conditions") or {}
        out.append(
            [
                n["name"],
                n["state"],
                ",".join(models) or "-",
                f"{used}/{len(gpus)}",
                _live_util(gpus),
                " ".join(_gpu_bar(g, 4) for g in gpus),
                conditions.get("connection_reason", "-"),
                shorten(conditions.get("last_error"), 60) or "-",
            ]
        )
    return table(
        out,
        ["NODE", "STATE", "MODEL", "USED", "UTIL", "GPUS (memory/compute allocated)", "AGENT", "LAST ERROR"],
    )


def _live_util(gpus: list[dict[str, Any]]) -> str:
    """Mean SM utilisation of the node's GPUs as its agent last measured it; '-' when no fresh sample."""
    utils = [g["metrics"]["util_pct"] for g in gpus if (g.get("metrics") or {}).get("util_pct") is not None]
    return f"{sum(utils) / len(utils):.0f}%" if utils else "-"


def _top_frame(client: Client) -> str:
    cluster = client.get("/api/v1/cluster/")
    node_rows = client.get_all("/api/v1/cluster/nodes/", limit=2000)
    queue = client.get("/api/v1/queue/", page_size=10)
    now = datetime.now(UTC).strftime("%H:%M:%S")
    lines = [
        f"tessera top  {now}   nodes {sum(cluster['nodes'].values())} "
        + " ".join(f"{k}:{v}" for k, v in sorted(cluster["nodes"].items()))
        + f"   GPUs {cluster['allocated_gpus']:.2f}/{cluster['gpus']} allocated"
        + f"   running {cluster['running_jobs']}  pending {cluster['pending_jobs']}",
        "",
        table(
            [
                [
                    m["model"],
                    m["gpus"],
                    m["ready_gpus"],
                    f"{m['allocated_gpus']:.2f}",
                    m["free_whole_gpus"],
                    f"{100 * m['allocated_memory_mib'] / max(1, m['memory_mib']):.0f}%",
                ]
                for m in cluster["models"]
            ],
            ["MODEL", "GPUS", "READY", "ALLOCATED", "FREE_WHOLE", "MEM_ALLOC"],
        ),
        "",
        table(
            [
                [
                    t["team"],
                    t["guaranteed_gpus"],
                    t["fair_share_gpus"],
                    f"{t['allocated_gpus']:.2f}",
                    f"{t['borrowed_gpus']:.2f}",
                    t["running_jobs"],
                    t["pending_jobs"],
                ]
                for t in cluster["teams"]
            ],
            ["TEAM", "GUARANTEED", "FAIR_SHARE", "ALLOCATED", "BORROWED", "RUNNING", "PENDING"],
        ),
        "",
        _nodes_table(node_rows),
        "",
        f"Queue (first {len(queue['results'])} of {queue['count']}):",
        table(
            [
                [
                    r["position"],
                    r["team"],
                    shorten(r["name"], 20) if r["mine"] else "(other team)",
                    request_text(r["request"]),
                    human_duration(r["wait_s"]),
                    shorten(
                        r["pending_reason"] or r.get("pending_reason_general") or r["pending_reason_code"], 50
                    ),
                ]
                for r in queue["results"]
            ],
            ["POS", "TEAM", "NAME", "REQUEST", "WAIT", "REASON"],
        ),
    ]
    return "\n".join(lines)


def top(argv: Sequence[str]) -> int:
    parser = command_parser("top", "A live view of the cluster; q or Ctrl-C quits.")
    parser.add_argument("--once", action="store_true", help="print one frame and exit (scripts, tests)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    args = parser.parse_args(argv)

    def handle(args: argparse.Namespace) -> int:
        client = Client.from_config()
        if args.json:
            print_json(
                {
                    "cluster": client.get("/api/v1/cluster/"),
                    "nodes": client.get_all("/api/v1/cluster/nodes/", limit=2000),
                    "queue": client.get("/api/v1/queue/", page_size=10)["results"],
                }
            )
            return ExitCode.OK
        if args.once or not sys.stdin.isatty():
            print(_top_frame(client))
            return ExitCode.OK
        return _top_live(client, args.interval)

    return run_command(handle, args)


def _top_live(client: Client, interval: float) -> int:
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        sys.stdout.write("\x1b[?25l")  # hide the cursor
        while True:
            frame = _top_frame(client)
            sys.stdout.write("\x1b[H\x1b[2J" + frame + "\n\n(q to quit)\n")
            sys.stdout.flush()
            ready, _, _ = select.select([sys.stdin], [], [], interval)
            if ready and sys.stdin.read(1).lower() == "q":
                return ExitCode.OK
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        sys.stdout.write("\x1b[?25h\n")
        sys.stdout.flush()
