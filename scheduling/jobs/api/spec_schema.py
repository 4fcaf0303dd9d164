"""The job spec a submit takes, as OpenAPI states it: each field's types, written forms and bounds, exactly as
scheduling.jobs.spec reads them (the patterns are that module's). What a schema cannot state (a size's bound
once written with a unit, fields that do not go together, what this cluster and team allow) is refused with a
400 whose code says so (portal.api_schema.RULE_CODES).

The lengths of a command, an env value and a workdir (64 KiB, 32 KiB, 4 KiB) are in their descriptions, not
`maxLength`: schemathesis builds strings at every maxLength, and these three alone cost the test run 18 s. A
longer one is refused with out_of_range and the limit, like a size beyond its bound."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiSerializerExtension

from portal.api_params import WHITESPACE, text_pattern
from scheduling.choices import Topology
from scheduling.jobs import spec as sp
from scheduling.jobs.services import MAX_GANG_NODES, MAX_GPUS_PER_JOB_NODE

NUMBER = {"type": "number", "minimum": -sp.MAX_SPEC_INT, "maximum": sp.MAX_SPEC_INT}


def _text(max_chars: int | None, *, blank: bool) -> dict[str, Any]:
    """Text of at most max_chars, no NUL; with blank=False, something besides whitespace."""
    out: dict[str, Any] = {"type": "string", "pattern": text_pattern(blank=blank)}
    if not blank:
        out["minLength"] = 1
    if max_chars is not None:
        out["maxLength"] = max_chars
    return out


def _whole(low: int, high: int) -> dict[str, Any]:
    """A whole number, or its digits as text (bounded only in `limit`: out_of_range beyond it)."""
    return {
        "anyOf": [
            {"type": "integer", "minimum": low, "maximum": high},
            {"type": "string", "pattern": f"^{sp.DIGITS}$"},
        ],
        "description": f"{low} to {high}.",
    }


def _nullable(schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    out = {**schema, "nullable": True}
    text = " ".join(t for t in (schema.get("description", ""), description, "null: as if not given.") if t)
    out["description"] = text
    return out


def _size(high_mib: int, *, zero: bool) -> dict[str, Any]:
    forms: list[dict[str, Any]] = [{"type": "string", "pattern": f"^{sp.SIZE}$"}]
    if zero:
        forms.append({"enum": [0, "0"]})
    return {
        "anyOf": forms,
        "description": f"A size with its unit (10GiB, 512MiB, 80GB), at most {high_mib} MiB"
        + ("; 0: none." if zero else "."),
    }


_ITEM = f"[{WHITESPACE}]*[^,{WHITESPACE}][^,]*"
GPU_MODELS = {
    "anyOf": [
        {"type": "string", "pattern": f"^$|^{_ITEM}(,{_ITEM}){{0,{sp.MAX_GPU_MODELS - 1}}}$"},
        {
            "type": "array",
            "maxItems": sp.MAX_GPU_MODELS,
            "items": {"type": "string", "pattern": f"^[{WHITESPACE}]*[^{WHITESPACE}][\\s\\S]*$"},
        },
    ],
    "description": "Model names, as a list or a comma list.",
}
DURATION = {
    "anyOf": [
        {"type": "string", "pattern": f"^({sp.DURATION})?$"},
        {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": sp.MAX_RUNTIME_S},
    ],
    "description": f"2h, 30m, 90s, 1h30m, or seconds; at most {sp.MAX_RUNTIME_S} s.",
}
WORKDIR = {
    "anyOf": [
        {
            "type": "string",
            "pattern": f"^[{WHITESPACE}]*/[^\\x00]*$",
        },
        {"enum": [""]},
    ],
    "description": "An absolute directory on the node the job starts in (default: the agent's); at most "
    f"{sp.MAX_WORKDIR_CHARS} characters.",
}

_EVENT_WORDS = ["start", "end", "fail", "preempt", "all", "none"]
_EVENT = f"({'|'.join(_EVENT_WORDS)})"
PROPERTIES: dict[str, dict[str, Any]] = {
    "name": {"anyOf": [_text(sp.MAX_NAME_CHARS, blank=False), NUMBER]},
    "team": _nullable(
        {"anyOf": [_text(100, blank=True), NUMBER]}, "Team slug; optional when you are in one team."
    ),
    "command": {
        "anyOf": [
            _text(None, blank=False),
            NUMBER,
            {
                "type": "array",
                "minItems": 1,
                "items": {"anyOf": [{"type": "string", "pattern": "^[^\\x00]*$"}, NUMBER]},
            },
        ],
        "description": f"A shell command, or a list of arguments; at most {sp.MAX_COMMAND_CHARS} characters.",
    },
    "env": _nullable(
        {
            "type": "object",
            "maxProperties": sp.MAX_ENV_VARS,
            "description": f"NAME: value; a value of at most {sp.MAX_ENV_VALUE_CHARS} characters.",
            "propertyNames": {"pattern": f"^{sp.ENV_NAME}$"},
            "additionalProperties": {
                "anyOf": [
                    {"type": "string", "pattern": "^[^\\x00]*$"},
                    NUMBER,
                    {"type": "boolean"},
                ]
            },
        }
    ),
    "gpus": _nullable(_whole(0, MAX_GPUS_PER_JOB_NODE), "Whole GPUs per node."),
    "gpu_memory": _nullable(_size(sp.MAX_GPU_MEMORY_MIB, zero=True), "Per GPU slice."),
    "compute_pct": _nullable(_whole(0, 100), "Per GPU slice, percent of one card."),
    "gpu_models": _nullable(GPU_MODELS),
    "min_gpu_memory": _nullable(_size(sp.MAX_GPU_MEMORY_MIB, zero=True), "Only cards with this much."),
    "min_compute_capability": _nullable(
        {
            "anyOf": [
                {"type": "number", "minimum": 0, "maximum": 99.9},
                {"type": "string", "pattern": f"^{sp.DECIMAL}$"},
            ],
            "description": "e.g. 8.0; 0 to 99.9, read to one decimal.",
        }
    ),
    "topology": _nullable({"type": "string", "enum": [*Topology.values, None]}),
    "nodes": _nullable(_whole(1, MAX_GANG_NODES), "Gang size (whole-GPU jobs)."),
    "cpu": _nullable(
        {
            "anyOf": [
                {"type": "number", "minimum": 0.001, "maximum": sp.MAX_CPU_MILLI // 1000},
                {"type": "string", "pattern": f"^{sp.CPU}$"},
            ],
            "description": f"Cores ('4', 0.5) or millicores ('500m'), in whole millicores; at most "
            f"{sp.MAX_CPU_MILLI // 1000} cores.",
        }
    ),
    "memory": _nullable(_size(sp.MAX_HOST_MEMORY_MIB, zero=False), "Host memory per node."),
    "priority": _nullable({"anyOf": [_text(50, blank=True), NUMBER]}, "Priority class; blank: the default."),
    "preemptible": _nullable({"type": "boolean"}),
    "max_runtime": _nullable(DURATION),
    "checkpoint_interval": _nullable(
        DURATION,
        "How often the job checkpoints, in whole seconds from 1m to 7d (a refusal says out_of_range).",
    ),
    "requeue_on_node_loss": _nullable({"type": "boolean"}),
    "workdir": _nullable(WORKDIR),
    "notify": _nullable(
        {
            "anyOf": [
                {"type": "string", "pattern": f"^$|^ *{_EVENT}( *, *{_EVENT})* *$"},
                {"type": "array", "items": {"type": "string", "enum": _EVENT_WORDS}, "maxItems": 8},
            ],
        },
        "Tell the submitter when the job starts, ends, fails or is preempted: a comma list of start, end, fail, "
        "preempt (or all, none); unset: their default.",
    ),
}
# The unit-free aliases (scheduling.jobs.spec.ALIASES): give a field under one name only.
PROPERTIES.update(
    {
        "gpu_memory_mib": _whole(0, sp.MAX_GPU_MEMORY_MIB),
        "min_gpu_memory_mib": _whole(0, sp.MAX_GPU_MEMORY_MIB),
        "memory_mib": _whole(1, sp.MAX_HOST_MEMORY_MIB),
        "cpu_milli": _whole(1, sp.MAX_CPU_MILLI),
        "max_runtime_s": _nullable(DURATION),
        "checkpoint_interval_s": _nullable(DURATION),
        "gpu_model": _nullable(GPU_MODELS),
        "cwd": _nullable(WORKDIR),
    }
)
for _alias, _field in sp.ALIASES.items():
    PROPERTIES[_alias] = {
        **PROPERTIES[_alias],
        "description": f"{_field} under another name. {PROPERTIES[_alias].get('description', '')}".strip(),
    }

JOB_SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": PROPERTIES,
    "required": ["name", "command"],
    "additionalProperties": False,
    "description": "The job spec as JSON (YAML is taken too with Content-Type: application/yaml).",
}


class JobSpecSchema(OpenApiSerializerExtension):
    """The submit body is the spec reader's, not a serializer's: JobSubmitSerializer only names it."""

    target_class = "scheduling.jobs.api.serializers.JobSubmitSerializer"

    def map_serializer(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        return JOB_SPEC_SCHEMA
