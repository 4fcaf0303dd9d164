"""Run a console script under a sampling profiler of every thread (no py-spy needed): each 5 ms the stacks of all
threads are taken; at exit the most frequent frames (inclusive, by function) are written as JSON to
$TESSERA_BENCH_PROFILE.

    python -m bench.sampled daphne -b 127.0.0.1 -p 8000 portal.asgi:application
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import signal
import sys
import threading
import time
from importlib.metadata import entry_points

INTERVAL_S = 0.005


def main() -> None:
    out = os.environ["TESSERA_BENCH_PROFILE"]
    inclusive: collections.Counter = collections.Counter()
    leaf: collections.Counter = collections.Counter()
    samples = [0]
    me = threading.get_ident()

    def sample() -> None:
        while True:
            time.sleep(INTERVAL_S)
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                seen = set()
                first = True
                while frame is not None:
                    code = frame.f_code
                    key = f"{code.co_filename.rsplit('site-packages/', 1)[-1]}:{code.co_name}"
                    if first:
                        leaf[key] += 1
                        first = False
                    if key not in seen:
                        inclusive[key] += 1
                        seen.add(key)
                    frame = frame.f_back
            samples[0] += 1

    def dump() -> None:
        with open(out, "w") as fh:
            json.dump(
                {
                    "ticks": samples[0],
                    "inclusive": inclusive.most_common(120),
                    "leaf": leaf.most_common(60),
                },
                fh,
                indent=1,
            )

    atexit.register(dump)
    signal.signal(signal.SIGUSR1, lambda *_: dump())
    thread = threading.Thread(target=sample, daemon=True)
    me = None
    thread.start()
    me = thread.ident
    name = sys.argv[1]
    sys.argv = sys.argv[1:]
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == name]
    sys.exit(script.load()())


if __name__ == "__main__":
    main()
