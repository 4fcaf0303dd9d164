"""Running a benchmark against another commit's code in the same run: a temporary git worktree of that commit,
with this checkout's virtual environment, so "today's" figures come from the same machine at the same hour."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """A detached worktree of commit `ref`, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="tessera-baseline-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), ref],
            check=True,
            capture_output=True,
        )
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                check=False,
                capture_output=True,
            )


def run_python(tree: Path, argv: Sequence[str]) -> str:
    """Run `python argv...` with the code of `tree` first on the path; its standard output."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, *argv], cwd=tree, env=env, check=True, capture_output=True, text=True
    )
    return out.stdout
