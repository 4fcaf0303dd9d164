"""A long-running process's startup heap kept out of the garbage collector's full collections.

Once Django, Channels and the project's modules are loaded, a web process tracks about 138,000 objects that live
as long as it does (modules, settings, URL patterns, templates' nodes). Every full collection walked all of them:
0.17 s each on the 2-core bench machine, with the event loop and the agents' database threads stopped meanwhile,
and a busy process (a thousand agents' sockets, a wave of start reports) runs one every few seconds. Frozen, they
are skipped; what is allocated afterwards is collected as before.
"""

from __future__ import annotations

import gc


def startup_heap_freeze() -> None:
    """Collect what startup left as garbage, then move everything still tracked to the permanent generation. Call
    once, when the process is ready to serve (an ASGI application built, a Celery child forked)."""
    gc.collect()
    gc.freeze()
