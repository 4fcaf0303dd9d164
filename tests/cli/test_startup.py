"""`tessera` starts without Django or Celery: `--help`, and a subcommand's own help, in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What the CLI must never load (import-linter's CLI contract also keeps the portal's apps out of it).
HEAVY = ("django", "celery", "rest_framework", "channels")

PROBE = """
import json, sys
from cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "modules": sorted({m.split('.')[0] for m in sys.modules})}))
"""


@pytest.mark.parametrize("argv", [["--help"], ["submit", "--help"], ["logs", "--help"], ["top", "--help"]])
def test_it_starts_without_importing_django(argv):
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["code"] == 0
    assert [name for name in HEAVY if name in report["modules"]] == []
