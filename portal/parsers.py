"""The API's request parsers. Kept apart from api_support: DRF reads its parser setting while its views module
loads, so this module must not import DRF's views."""

from __future__ import annotations

import json
import re
from typing import Any

from rest_framework import exceptions
from rest_framework.parsers import JSONParser

from scheduling.errors import ServiceError
from scheduling.jobs.documents import json_object_once

MAX_JSON_BODY_BYTES = 1024 * 1024
MAX_JSON_DEPTH = 32
MAX_JSON_VALUES = 20_000

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class SafeJSONParser(JSONParser):
    """The API's JSON bodies, bounded: at most MAX_JSON_BODY_BYTES, `max_depth` levels and `max_values` values,
    no key twice in one object, no text a database cannot store (a lone surrogate). Each refusal is a 400 that
    says which bound, never a RecursionError or an encoding error at INSERT; the costly checks run only when a
    cheap scan of the text says they might find something."""

    max_depth = MAX_JSON_DEPTH
    max_values = MAX_JSON_VALUES

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = stream.read(MAX_JSON_BODY_BYTES + 1) if stream is not None else b""
        if len(raw) > MAX_JSON_BODY_BYTES:
            raise exceptions.ParseError(f"A JSON body may be at most {MAX_JSON_BODY_BYTES} bytes.")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise exceptions.ParseError(f"The body is not valid UTF-8 (byte {exc.start}).") from None
        if not text.strip():
            return None
        outside_strings = _STRING.sub("", text)
        if outside_strings.count(",") + outside_strings.count(":") >= self.max_values:
            raise exceptions.ParseError(f"A JSON body may hold at most {self.max_values} values.")
        try:
            data = json.loads(text, object_pairs_hook=json_object_once)
        except RecursionError:
            raise exceptions.ParseError(f"JSON nested deeper than {self.max_depth} levels.") from None
        except ValueError as exc:  # JSONDecodeError, a duplicate key, an integer of more than 4300 digits
            raise exceptions.ParseError(f"JSON parse error: {exc}") from None
        self._check(data, surrogates=bool(_SURROGATE_ESCAPE.search(text)))
        return data

    def _check(self, data: Any, *, surrogates: bool) -> None:
        """Depth, and (only where the text escapes a surrogate) which field holds a lone one."""
        stack: list[tuple[Any, int, str]] = [(data, 1, "")]
        while stack:
            value, depth, path = stack.pop()
            if isinstance(value, str):
                if surrogates:
                    try:
                        value.encode("utf-8")
                    except UnicodeEncodeError:
                        field = path or "body"
                        raise ServiceError(
                            f"{field} is not valid text (it holds a lone surrogate character).", field=field
                        ) from None
            elif isinstance(value, dict | list):
                if depth > self.max_depth:
                    raise exceptions.ParseError(f"JSON nested deeper than {self.max_depth} levels.")
                if isinstance(value, dict):
                    for key, item in value.items():
                        name = f"{path}.{key}" if path else str(key)
                        if surrogates:
                            stack.append((key, depth + 1, name))
                        if surrogates or isinstance(item, dict | list):
                            stack.append((item, depth + 1, name))
                else:
                    stack.extend(
                        (item, depth + 1, path)
                        for item in value
                        if surrogates or isinstance(item, dict | list)
                    )
