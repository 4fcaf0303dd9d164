"""Reading a job spec document (YAML or JSON) safely: bounded before anything is built from it.

A spec is small (a few dozen fields, at most 256 environment variables). So before a value exists in Python:
the text must be at most MAX_SPEC_BYTES and valid UTF-8; a YAML document is read as events by libyaml (C) and
refused at the first anchor or alias (no spec needs one, and an alias bomb multiplies with each level), past
MAX_DEPTH levels of nesting or past MAX_EVENTS events; a JSON document is parsed by the C decoder with duplicate
keys refused and its nesting and size checked as it is walked. Only then are values built, with duplicate YAML
keys refused as well. Each refusal names what it refuses and the limit; refusing costs a bounded amount of work
whatever the document holds.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from scheduling.errors import ServiceError

MAX_SPEC_BYTES = 256 * 1024
MAX_DEPTH = 16  # a spec nests three levels deep (env: NAME: value); this leaves room and no more
# Events a spec can need: ~25 fields and 256 env variables as key/value scalars (about 600), lists of GPU models,
# the start and end of each collection. Far more is not a spec.
MAX_EVENTS = 1500
MAX_VALUES = 1000

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


class SpecError(ServiceError):
    """A spec refused before it reaches the services; `limit` is the bound it broke, when there is one."""

    def __init__(self, message: str, *, field: str, limit: Any = None, code: str = "invalid"):
        super().__init__(message, field=field, code=code, limit=limit)


class DocumentError(SpecError):
    """The document itself is refused (before any field is read): its field is `spec`."""

    def __init__(self, message: str, *, limit: Any = None):
        super().__init__(message, field="spec", limit=limit)


def _text(raw: str | bytes) -> str:
    if isinstance(raw, bytes):
        if len(raw) > MAX_SPEC_BYTES:
            raise DocumentError(f"A spec must be at most {MAX_SPEC_BYTES} bytes.", limit=MAX_SPEC_BYTES)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentError(f"The spec is not valid UTF-8 (byte {exc.start}).") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise DocumentError(f"A spec must be at most {MAX_SPEC_BYTES} bytes.", limit=MAX_SPEC_BYTES)
    return raw


def _check_yaml_events(text: str) -> None:
    depth = events = 0
    try:
        for event in yaml.parse(text, Loader=_Loader):
            events += 1
            if events > MAX_EVENTS:
                raise DocumentError(f"The spec has more than {MAX_EVENTS} YAML elements.", limit=MAX_EVENTS)
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise DocumentError("YAML anchors and aliases (&name, *name) are not allowed in a spec.")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise DocumentError(f"The spec nests deeper than {MAX_DEPTH} levels.", limit=MAX_DEPTH)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError as exc:
        raise DocumentError(f"The spec is not valid YAML or JSON: {exc}") from None


class _StrictLoader(_Loader):
    """The safe loader, with a key given twice in one mapping refused (YAML would keep the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                if key in seen:
                    raise DocumentError(f"The spec gives {key!r} twice.")
            except TypeError:
                raise DocumentError("A spec's keys must be plain values.") from None
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)


class KeyTwice(ValueError):
    """A JSON object gives one key twice (Python's json keeps the last silently)."""

    def __init__(self, key: str):
        super().__init__(f"{key!r} is given twice in one object")
        self.key = key


def json_object_once(pairs: list[tuple[str, Any]]) -> dict:
    """`object_pairs_hook` for json.loads that refuses a key given twice (the API's parser uses it too)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        raise KeyTwice(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return out


def _refuse_json_constant(name: str) -> Any:
    """json.loads accepts NaN, Infinity and -Infinity, which are not JSON: refuse them."""
    raise ValueError(f"{name} is not a number a spec may hold")


def check_shape(data: Any) -> None:
    """At most MAX_DEPTH levels and MAX_VALUES values, walked without recursion: any decoded document (the API's
    JSON body too) passes here before a field is read."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    seen = 1
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                raise DocumentError(f"The spec nests deeper than {MAX_DEPTH} levels.", limit=MAX_DEPTH)
            seen += len(value)  # counted before anything inside is looked at
            if seen > MAX_VALUES:
                raise DocumentError(f"The spec holds more than {MAX_VALUES} values.", limit=MAX_VALUES)
            items = value.values() if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items if isinstance(item, dict | list))


def load_document(raw: str | bytes) -> Any:
    """The decoded document, or a DocumentError naming why not."""
    text = _text(raw)
    try:
        if text.lstrip().startswith(("{", "[")):
            # Separators outside strings bound the values: too many, and nothing is built.
            if _JSON_STRING.sub("", text).count(",") >= MAX_VALUES:
                raise DocumentError(f"The spec holds more than {MAX_VALUES} values.", limit=MAX_VALUES)
            data = json.loads(text, object_pairs_hook=json_object_once, parse_constant=_refuse_json_constant)
        else:
            _check_yaml_events(text)
            data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a safe loader with a stricter mapping
    except RecursionError:
        raise DocumentError(f"The spec nests deeper than {MAX_DEPTH} levels.", limit=MAX_DEPTH) from None
    except KeyTwice as exc:
        raise DocumentError(f"The spec gives {exc.key!r} twice.") from None
    except json.JSONDecodeError as exc:
        raise DocumentError(f"The spec is not valid YAML or JSON: {exc}") from None
    except yaml.YAMLError as exc:
        raise DocumentError(f"The spec is not valid YAML or JSON: {exc}") from None
    except ValueError as exc:  # an integer of more than 4300 digits, or NaN / Infinity in JSON
        raise DocumentError(f"The spec holds a number that is out of range: {exc}") from None
    check_shape(data)
    return data
