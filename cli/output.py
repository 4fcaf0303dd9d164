"""What the subcommands share: their parser (with --json), aligned tables, durations and sizes, and an API error
printed with its exit code (cli.client.ExitCode)."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from cli.client import ApiError, ExitCode


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def table(rows: list[list[Any]], headers: list[str], *, wrap_last: int | None = None) -> str:
    """A plain aligned table, like squeue's. `wrap_last`: the last column's text is wrapped at so many characters,
    its further lines under it (whole messages, never cut)."""
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    if wrap_last:
        wrapped = []
        for row in cells:
            lines = textwrap.wrap(row[-1], wrap_last, break_on_hyphens=False) or [""]
            wrapped.append([*row[:-1], lines[0]])
            wrapped += [[""] * (len(row) - 1) + [line] for line in lines[1:]]
        cells = wrapped
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(max(0, seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            rest = seconds % size
            sub = {"d": ("h", 3600), "h": ("m", 60), "m": ("s", 1)}[unit]
            return (
                f"{seconds // size}{unit}{rest // sub[1]}{sub[0]}"
                if rest // sub[1]
                else f"{seconds // size}{unit}"
            )
    return f"{seconds}s"


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def until(value: str | None) -> str:
    moment = _parse_time(value)
    if moment is None:
        return "-"
    return f"in {human_duration((moment - datetime.now(UTC)).total_seconds())}"


def ago(value: str | None) -> str:
    moment = _parse_time(value)
    if moment is None:
        return "-"
    return f"{human_duration((datetime.now(UTC) - moment).total_seconds())} ago"


def mib(value: int | None) -> str:
    if not value:
        return "0"
    return f"{value / 1024:g}GiB" if value % 1024 == 0 or value >= 10240 else f"{value}MiB"


def request_text(request: dict[str, Any]) -> str:
    """'2xGPU nvlink', '10GiB/25%', '1xGPU x4 nodes'."""
    if request.get("gpus"):
        text = f"{request['gpus']}xGPU"
        if request.get("nodes", 1) > 1:
            text += f" x{request['nodes']}n"
        if request.get("topology") not in (None, "none"):
            text += f" {request['topology']}"
    else:
        parts = []
        if request.get("gpu_memory_mib"):
            parts.append(mib(request["gpu_memory_mib"]))
        if request.get("compute_pct"):
            parts.append(f"{request['compute_pct']}%")
        text = "/".join(parts) or "-"
    if request.get("gpu_models"):
        text += f" [{','.join(request['gpu_models'])}]"
    return text


def shorten(text: str | None, width: int) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def command_parser(name: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"tessera {name}", description=description)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def run_command(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return handler(args)
    except ApiError as exc:
        if getattr(args, "json", False):
            print_json(
                {"error": {"code": exc.code, "message": exc.message, "field": exc.field, "limit": exc.limit}}
            )
        else:
            print(f"tessera: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return ExitCode.OK
