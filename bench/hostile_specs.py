"""How much CPU refusing a hostile job spec costs, for specs of up to 256 KiB. Prints JSON.

Each document goes through what a submit does with it (`spec_from_text` for YAML and JSON files; the jobs API's JSON
body parser first for JSON bodies), repeated, and the worst CPU time of a refusal is reported in ms. Target:
every refusal <= 5 ms.

    .venv/bin/python -m bench.hostile_specs
"""

from __future__ import annotations

import gc
import io
import json
import os
import sys
import time


def documents() -> dict[str, str | bytes]:
    bomb = [f"l0: &l0 [{', '.join(['x'] * 10)}]"]
    bomb += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 8)]
    big = 250_000
    return {
        "yaml_alias_bomb": "\n".join(bomb) + "\nname: x\n",
        "yaml_self_alias": "a: &a [*a]\n",
        "json_nested_100000": "[" * 100_000 + "]" * 100_000,
        "yaml_50000_open_brackets": "[" * 50_000,
        "yaml_20000_keys": "\n".join(f"k{i}: v" for i in range(20_000)),
        "yaml_deep_block": "\n".join(" " * i + f"k{i}:" for i in range(600)),
        "json_array_120000": "[" + ",".join("1" for _ in range(120_000)) + "]",
        "json_object_15000_keys": json.dumps({f"k{i}": i for i in range(15_000)}),
        "yaml_big_scalar_unknown_field": "name: x\ncommand: " + "a" * big + "\nbogus: 1\n",
        "json_big_scalar_unknown_field": json.dumps({"name": "x", "command": "a" * big, "bogus": 1}),
        "yaml_invalid_utf8": b"name: caf\xe9\ncommand: run\n" + b"x" * big,
        "yaml_duplicate_key": "name: a\nname: b\ncommand: c\ngpus: 1\n",
        "over_256_kib": "name: a\ncommand: " + "x" * (256 * 1024),
    }


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from rest_framework.exceptions import APIException

    from scheduling.jobs.api.views import SpecJSONParser
    from scheduling.jobs.spec import SpecError, spec_from_mapping, spec_from_text

    rows = {}
    for name, doc in documents().items():
        times = []
        refused_by = ""
        for _ in range(7):
            gc.collect()  # the collector's pauses belong to no one refusal
            started = time.process_time()
            try:
                if name.startswith("json"):
                    data = SpecJSONParser().parse(io.BytesIO(doc.encode() if isinstance(doc, str) else doc))
                    spec_from_mapping(data)
                else:
                    spec_from_text(doc)
                refused_by = "ACCEPTED"
            except (SpecError, APIException) as exc:
                refused_by = str(getattr(exc, "message", None) or getattr(exc, "detail", exc))[:90]
            times.append(time.process_time() - started)
        times.sort()
        rows[name] = {
            "bytes": len(doc),
            "refusal_cpu_ms_p50": round(times[len(times) // 2] * 1000, 2),
            "refusal_cpu_ms_max": round(times[-1] * 1000, 2),
            "refused_with": refused_by,
        }
    result = {
        "benchmark": "hostile_specs",
        "documents": rows,
        "refusal_cpu_ms_p50_worst": max(r["refusal_cpu_ms_p50"] for r in rows.values()),
        "refusal_cpu_ms_max": max(r["refusal_cpu_ms_max"] for r in rows.values()),
        "all_refused": all(r["refused_with"] != "ACCEPTED" for r in rows.values()),
        "target_ms": 5.0,
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
