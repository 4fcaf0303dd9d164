"""The job spec a submit takes, as OpenAPI states it: one property per field and alias of scheduling.jobs.fields,
its schema chosen by how the field is written (its kind) and bounded as that table says; the patterns are the
reader's (scheduling.jobs.spec). What a schema cannot state (a size's bound
once written with a unit, fields that do not go together, what this cluster and team allow) is refused with a
400 whose code says so (portal.api_schema.RULE_CODES).

The lengths of a command, an env value and a workdir (64 KiB, 32 KiB, 4 KiB) are in their descriptions, not
`maxLength`: schemathesis builds strings at every maxLength, and these three alone cost the test run 18 s. A
longer one is refused with out_of_range and the limit, like a size beyond its bound."""

from __future__ import annotations

import copy
from typing import Any

from drf_spectacular.extensions import OpenApiSerializerExtension

from portal.api_params import WHITESPACE, text_pattern
from scheduling.jobs import fields
from scheduling.jobs import spec as sp

NUMBER = {"type": "number", "minimum": -fields.MAX_SPEC_INT, "maximum": fields.MAX_SPEC_INT}


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
    text = " ".join(t for t in (description, schema.get("description", ""), "null: as if not given.") if t)
    out["description"] = text
    return out


def _size(high_mib: int, *, zero: bool) -> dict[str, Any]:
    forms: list[dict[str, Any]] = [{"type": "string", "pattern": f"^{sp.SIZE}$"}]
    if zero:
        forms.append({"enum": [0, "0"]})
    return {
        "anyOf": forms,
        "description": f"A size with its unit (10GiB, 512MiB, 80GB; spaces before and after the number and the "
        f"unit are allowed: 10 GiB), at most {high_mib} MiB" + ("; 0: none." if zero else "."),
    }


_ITEM = f"[{WHITESPACE}]*[^,{WHITESPACE}][^,]*"
GPU_MODELS = {
    "anyOf": [
        {"type": "string", "pattern": f"^$|^{_ITEM}(,{_ITEM}){{0,{fields.MAX_GPU_MODELS - 1}}}$"},
        {
            "type": "array",
            "maxItems": fields.MAX_GPU_MODELS,
            "items": {"type": "string", "pattern": f"^[{WHITESPACE}]*[^{WHITESPACE}][\\s\\S]*$"},
        },
    ],
    "description": "Model names, as a list or a comma list.",
}
DURATION = {
    "anyOf": [
        {"type": "string", "pattern": f"^({sp.DURATION})?$"},
        {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": fields.MAX_RUNTIME_S},
    ],
    "description": f"2h, 30m, 90s, 1h30m, or seconds; at most {fields.MAX_RUNTIME_S} s.",
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
    f"{fields.MAX_WORKDIR_CHARS} characters.",
}

_EVENT_WORDS = [*fields.EVENTS, "all", "none"]
_EVENT = f"({'|'.join(_EVENT_WORDS)})"
COMMAND = {
    "anyOf": [
        _text(None, blank=False),
        NUMBER,
        {
            "type": "array",
            "minItems": 1,
            "items": {"anyOf": [{"type": "string", "pattern": "^[^\\x00]*$"}, NUMBER]},
        },
    ],
}
ENV = {
    "type": "object",
    "maxProperties": fields.MAX_ENV_VARS,
    "propertyNames": {"pattern": f"^{sp.ENV_NAME}$"},
    "additionalProperties": {
        "anyOf": [
            {"type": "string", "pattern": "^[^\\x00]*$"},
            NUMBER,
            {"type": "boolean"},
        ]
    },
}
CAPABILITY = {
    "anyOf": [
        {"type": "number", "minimum": 0, "maximum": 99.9},
        {"type": "string", "pattern": f"^{sp.DECIMAL}$"},
    ],
    "description": "0 to 99.9, read to one decimal.",
}
CPU = {
    "anyOf": [
        {"type": "number", "minimum": 0.001, "maximum": fields.MAX_CPU_MILLI // 1000},
        {"type": "string", "pattern": f"^{sp.CPU}$"},
    ],
    "description": f"In whole millicores; at most {fields.MAX_CPU_MILLI // 1000} cores.",
}
EVENTS = {
    "anyOf": [
        {"type": "string", "pattern": f"^$|^ *{_EVENT}( *, *{_EVENT})* *$"},
        {"type": "array", "items": {"type": "string", "enum": _EVENT_WORDS}, "maxItems": 8},
    ],
}


_DEPENDENCY_JOB = "[0-9]{1,9}"
_DEPENDENCY = f"(after(ok|any|notok)|{'|'.join(fields.DEPENDENCY_WHEN)}):{_DEPENDENCY_JOB}(:{_DEPENDENCY_JOB})*|singleton"
DEPENDENCIES = {
    "anyOf": [
        {"type": "string", "pattern": f"^ *({_DEPENDENCY})( *, *({_DEPENDENCY}))* *$"},
        {
            "type": "array",
            "maxItems": fields.MAX_DEPENDENCIES,
            "items": {
                "type": "object",
                "properties": {
                    "job": {
                        "anyOf": [
                            {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
                            {"type": "string", "pattern": f"^{_DEPENDENCY_JOB}$"},
                        ]
                    },
                    "when": {"type": "string", "enum": list(fields.DEPENDENCY_WHEN)},
                    "each_task": {"type": "boolean"},
                },
                "required": ["job"],
                "additionalProperties": False,
            },
        },
    ],
}


_PORT = f"{fields.PORT_NAME}:[0-9]{{1,5}}"
PORTS = {
    "anyOf": [
        {"type": "string", "pattern": f"^$|^ *{_PORT}( *, *{_PORT})* *$"},
        {
            "type": "array",
            "maxItems": fields.MAX_PORTS,
            "items": {
                "anyOf": [
                    {"type": "string", "pattern": f"^ *{_PORT} *$"},
                    {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "pattern": f"^{fields.PORT_NAME}$"},
                            "port": _whole(fields.MIN_PORT, fields.MAX_PORT),
                        },
                        "required": ["name", "port"],
                        "additionalProperties": False,
                    },
                ]
            },
        },
    ],
    "description": f"Ports {fields.MIN_PORT}-{fields.MAX_PORT}; each name and port once.",
}


IMAGE = {
    "type": "string",
    "maxLength": fields.MAX_IMAGE_CHARS,
    "pattern": f"^[{WHITESPACE}]*({fields.IMAGE_REFERENCE})?[{WHITESPACE}]*$",
    "description": "An image reference: registry/repository:tag or @digest.",
}
_NAME = f" *{fields.MOUNT_NAME} *"
NAMES = {
    "anyOf": [
        {"type": "string", "pattern": f"^$|^{_NAME}(,{_NAME}){{0,{fields.MAX_MOUNTS - 1}}}$"},
        {
            "type": "array",
            "maxItems": fields.MAX_MOUNTS,
            "items": {"type": "string", "pattern": f"^{_NAME}$"},
        },
    ],
    "description": "Names, as a list or a comma list; each once.",
}


def _of_kind(kind: str, *, low: int, high: int | None, required: bool, zero: bool, choices: tuple[str, ...]):
    """The schema of a value written as `kind` (scheduling.jobs.fields) within its bounds."""
    match kind:
        case fields.TEXT:
            return {"anyOf": [_text(high, blank=not required), NUMBER]}
        case fields.COMMAND:
            return COMMAND
        case fields.ENV:
            return ENV
        case fields.COUNT:
            return _whole(low, high)
        case fields.SIZE:
            return _size(high, zero=zero)
        case fields.MODELS:
            return GPU_MODELS
        case fields.CAPABILITY:
            return CAPABILITY
        case fields.CHOICE:
            return {"type": "string", "enum": [*choices, None]}
        case fields.CPU:
            return CPU
        case fields.FLAG:
            return {"type": "boolean"}
        case fields.DURATION:
            seconds = high or fields.MAX_RUNTIME_S
            return {**DURATION, "description": f"2h, 30m, 90s, 1h30m, or seconds; at most {seconds} s."}
        case fields.DIRECTORY:
            return WORKDIR
        case fields.EVENT_LIST:
            return EVENTS
        case fields.DEPENDENCIES:
            return DEPENDENCIES
        case fields.PORTS:
            return PORTS
        case fields.IMAGE:
            return IMAGE
        case fields.NAMES:
            return NAMES
    raise AssertionError(f"no schema for the kind {kind!r}")


def _described(schema: dict[str, Any], text: str) -> dict[str, Any]:
    joined = " ".join(t for t in (text, schema.get("description", "")) if t)
    return {**schema, "description": joined}


def _property(field: fields.SpecField) -> dict[str, Any]:
    schema = _of_kind(
        field.kind,
        low=field.low,
        high=field.high,
        required=field.required,
        zero=field.zero_is_none,
        choices=field.choices,
    )
    help_text = field.help[0].upper() + field.help[1:] + "."
    if field.required:
        return _described(schema, help_text)
    return _nullable(schema, help_text)


def _alias_property(alias: fields.SpecAlias) -> dict[str, Any]:
    """A unit-free alias (a count in the model's unit) is a number; the others are written as their field is."""
    schema = _of_kind(alias.kind, low=alias.low, high=alias.high, required=False, zero=False, choices=())
    text = f"{alias.field} under another name" + (f", in {alias.unit}" if alias.unit else "") + "."
    if alias.kind == fields.COUNT:
        return _described(schema, text)
    return _nullable(schema, text)


# Every field and alias a spec may carry (scheduling.jobs.fields): give a field under one name only.
PROPERTIES: dict[str, dict[str, Any]] = {field.name: _property(field) for field in fields.FIELDS}
PROPERTIES.update({alias.name: _alias_property(alias) for alias in fields.ALIASES})

JOB_SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": PROPERTIES,
    "required": list(fields.REQUIRED),
    "additionalProperties": False,
    "description": "The job spec as JSON (YAML is taken too with Content-Type: application/yaml).",
}


class JobSpecSchema(OpenApiSerializerExtension):
    """The submit body is the spec reader's, not a serializer's: JobSubmitSerializer only names it."""

    target_class = "scheduling.jobs.api.serializers.JobSubmitSerializer"

    def map_serializer(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        # A copy each time: drf-spectacular's enum hook rewrites what it is given in place (its enums cut out into
        # components), and a second schema built from the rewritten one named components it never emitted.
        return copy.deepcopy(JOB_SPEC_SCHEMA)
