"""`tessera`: the command line's parser and dispatch. Subcommands are registered in COMMANDS; each loads its code
lazily, so `tessera --help` starts without importing any of them."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

# name -> ("module:function", one-line help). The function takes the remaining argv and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("cli.main:simulate", "replay traces and scenarios through the scheduling engine"),
    # The API client (cli/client.py; exit codes in cli.client.ExitCode and docs/api.md).
    "login": ("cli.account:login", "get a personal API token and save it"),
    "whoami": ("cli.account:whoami", "who the saved token belongs to"),
    "usage": ("cli.account:usage", "GPU-hours by team, user, day (sacct); --csv"),
    "submit": ("cli.submit:submit", "submit a job from a spec file, a script or flags (sbatch)"),
    "queue": ("cli.jobs:queue", "pending jobs in the scheduler's order (squeue)"),
    "ls": ("cli.jobs:ls", "your teams' jobs"),
    "show": ("cli.jobs:show", "one job in detail with its events"),
    "cancel": ("cli.jobs:cancel", "cancel jobs (scancel)"),
    "logs": ("cli.jobs:logs", "a job's output; --follow to keep reading"),
    "open": ("cli.jobs:open_session", "the URL of a job's web port (a notebook, a dashboard)"),
    "nodes": ("cli.cluster:nodes", "nodes and GPUs (sinfo)"),
    "top": ("cli.cluster:top", "live cluster view; q quits"),
}

SIMULATE_MODES: dict[str, tuple[str, str]] = {
    "static": (
        "scheduling.sim.cli_static:main_static",
        "static packing of an openb trace (published protocol)",
    ),
    "dynamic": ("scheduling.sim.cli_dynamic:main_dynamic", "replay an openb trace on its timestamps"),
    "scenario": ("scheduling.sim.cli_dynamic:main_scenario", "run a YAML scenario, e.g. seed-case"),
}


def _load(target: str) -> Callable[[Sequence[str]], int]:
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def simulate(argv: Sequence[str]) -> int:
    """Dispatch to a simulator mode; everything after the mode, --help included, belongs to that mode."""
    argv = list(argv)
    if argv and argv[0] in SIMULATE_MODES:
        return int(_load(SIMULATE_MODES[argv[0]][0])(argv[1:]) or 0)
    parser = argparse.ArgumentParser(
        prog="tessera simulate", description="Replay workloads through the engine."
    )
    parser.add_argument(
        "mode",
        choices=sorted(SIMULATE_MODES),
        help="; ".join(f"{k}: {v[1]}" for k, v in SIMULATE_MODES.items()),
    )
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    parser.parse_args(argv[:1])  # an unknown mode: argparse names the choices and exits 2
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _main(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # here, so a closed pipe is caught below rather than at exit
    except BrokenPipeError:
        return _reader_gone()
    return code


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tessera", description="Tessera: a multi-tenant GPU cluster portal."
    )
    parser.add_argument(
        "command",
        choices=sorted(COMMANDS),
        metavar="COMMAND",
        help="; ".join(f"{name}: {text}" for name, (_, text) in sorted(COMMANDS.items())),
    )
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    args, rest = parser.parse_known_args(argv[:1])
    return int(_load(COMMANDS[args.command][0])(argv[1:]) or 0)


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what `yes | head` exits with


def _reader_gone() -> int:
    """The reader of stdout went away (`tessera ls | head`): stop quietly, as other tools do. stdout now points
    at /dev/null, so Python's own flush at exit finds nothing to complain about."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
