"""Python's cyclic garbage collector, paused while a cycle runs.

A cycle builds hundreds of thousands of short-lived objects (a snapshot's jobs, the engine's tuples, the apply's
rows); reference counting frees them, none of them is garbage only a collection could find. But their number
triggers collections, and each full one walks the process's whole heap, the snapshot included: at 20,000 pending,
three full collections took 0.27 s of a 1.5 s cycle (the engine's share of it had doubled a cycle's time in a web
process holding a 10,000-job snapshot). What cyclic garbage a cycle does leave is collected once the collector is
back on, after the cycle.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The collector off inside; left as the caller had it after (nested pauses, or another thread's cycle that
    paused it already, are kept as they were)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
