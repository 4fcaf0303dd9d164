"""The flags of `tessera submit` and the spec field each sets (from the spec's one definition,
scheduling.jobs.fields): the CLI parses them, the portal's submit page writes the equivalent command line with
them. Pure Python (the CLI loads neither Django nor Celery)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from scheduling.jobs.fields import COUNT, FIELDS, MODELS, NAMES, PORTS, SESSION_TEMPLATES

__all__ = ["COUNTS", "REPEATED", "SESSION_TEMPLATES", "SUBMIT_FLAGS", "submit_command_line"]

# (flags, spec field, help) for every field `tessera submit` sets by a flag; the rest are set in a spec file.
SUBMIT_FLAGS = tuple((f.flags, f.name, f.flag_help or f.help) for f in FIELDS if f.flags)
REPEATED = frozenset(
    f.name for f in FIELDS if f.flags and f.kind in (MODELS, PORTS, NAMES)
)  # the flag may be given again
COUNTS = frozenset(f.name for f in FIELDS if f.flags and f.kind == COUNT)  # sent as numbers

_FLAG_OF = {field: flags[0] for flags, field, _ in SUBMIT_FLAGS}


def submit_command_line(spec: Mapping[str, Any]) -> str:
    """`tessera submit ...` that sends this spec (a mapping of spec fields, as `spec_to_mapping` gives)."""
    words = ["tessera", "submit"]
    for field, value in spec.items():
        if field in ("command", "env", "preemptible", "requeue_on_node_loss") or value in (None, "", [], ()):
            continue
        flag = _FLAG_OF.get(field)
        if flag is None:
            continue
        for item in value if isinstance(value, list | tuple) else [value]:
            if isinstance(item, dict) and set(item) == {"name", "port"}:  # a web port as the spec writes it
                item = f"{item['name']}:{item['port']}"
            words += [flag, str(item)]
    for name, value in (spec.get("env") or {}).items():
        words += ["--env", f"{name}={value}"]
    if spec.get("preemptible") is False:
        words.append("--no-preempt")
    line = shlex.join(words)
    command = spec.get("command") or ""
    return f"{line} -- {command}" if command else line
