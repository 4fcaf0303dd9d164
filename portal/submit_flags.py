"""The flags of `tessera submit` and the spec field each sets: the CLI parses them, the portal's submit page
writes the equivalent command line with them. Pure Python (the CLI loads neither Django nor Celery)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

SUBMIT_FLAGS = (
    # (flags, spec field, help)
    (("--name", "-J"), "name", "job name (default: the script it runs, e.g. train.py, else its program)"),
    (("--team", "-A"), "team", "team slug, e.g. ai-lab/training (default: your only team)"),
    (("--gpus", "-G"), "gpus", "whole GPUs per node"),
    (("--gpu-memory",), "gpu_memory", "a slice of one GPU: memory, e.g. 10GiB"),
    (("--compute-pct",), "compute_pct", "a slice of one GPU: compute share, 1-100"),
    (("--gpu-model", "-C"), "gpu_models", "allowed GPU model (repeat for several)"),
    (("--min-gpu-memory",), "min_gpu_memory", "only GPUs with at least this much memory, e.g. 40GiB"),
    (("--min-compute-capability",), "min_compute_capability", "e.g. 8.0"),
    (("--topology",), "topology", "none, numa or nvlink"),
    (("--nodes", "-N"), "nodes", "gang size (whole-GPU jobs)"),
    (("--cpus", "-c"), "cpu", "CPU per node: cores (4) or millicores (500m)"),
    (("--mem",), "memory", "host memory per node, e.g. 64GiB"),
    (("--priority", "-p"), "priority", "priority class, e.g. training"),
    (("--time", "-t"), "max_runtime", "run-time limit, e.g. 2h, 30m, 1h30m"),
    (("--checkpoint-every",), "checkpoint_interval", "how often it checkpoints, e.g. 30m, 2h, 600 (s)"),
    (("--chdir", "-D"), "workdir", "absolute directory the job starts in on its node"),
    (("--notify",), "notify", "tell me by email/webhook: start,end,fail,preempt, all or none"),
)

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
            words += [flag, str(item)]
    for name, value in (spec.get("env") or {}).items():
        words += ["--env", f"{name}={value}"]
    if spec.get("preemptible") is False:
        words.append("--no-preempt")
    line = shlex.join(words)
    command = spec.get("command") or ""
    return f"{line} -- {command}" if command else line
