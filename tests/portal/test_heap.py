"""Long-running processes keep their startup heap out of full garbage collections (portal/heap.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from django.conf import settings


def _frozen_after(code: str) -> int:
    """gc.get_freeze_count() in a fresh interpreter after `code` ran (this process's heap is the test runner's)."""
    script = f"import gc\n{code}\nprint(gc.get_freeze_count())"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings"}
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip().splitlines()[-1])


def test_a_web_process_freezes_what_its_startup_built():
    # Django, Channels and the project loaded: over 100,000 objects a full collection walked every time.
    assert _frozen_after("import portal.asgi") > 100_000


def test_a_celery_child_freezes_the_heap_it_inherited():
    code = "\n".join(
        [
            "import django; django.setup()",
            "from portal.celery import app",
            "from celery.signals import worker_process_init",
            "worker_process_init.send(sender=None)",
        ]
    )
    assert _frozen_after(code) > 50_000
