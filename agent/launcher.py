"""Job launcher: the first process of every job's process group; runs the command and records its exit code.

The agent starts `python launcher.py --exit-file F -- cmd...` in a new session. The launcher survives
SIGTERM/SIGINT/SIGHUP (handlers, which exec resets to default in the child, so the job itself still gets them)
and writes F once the command ends, so an agent restarted meanwhile still learns the exit code of a job it did
not start. Standard library only: it runs before anything else is importable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def _noted(signum: int, frame: object) -> None:
    # The signal was meant for the whole group; the job gets it too and its exit is what we report.
    return None


def _write_atomic(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(payload, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--exit-file" or argv[2] != "--":
        print("usage: launcher.py --exit-file FILE -- command [args...]", file=sys.stderr)
        return 2
    exit_file, command = argv[1], argv[3:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _noted)
    try:
        proc = subprocess.Popen(command)
    except OSError as exc:
        print(f"tessera launcher: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        _write_atomic(exit_file, {"exit_code": 127, "error": str(exc), "finished_at": time.time()})
        return 127
    code = proc.wait()
    _write_atomic(exit_file, {"exit_code": code, "child_pid": proc.pid, "finished_at": time.time()})
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
