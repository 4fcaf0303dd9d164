"""The API's request parsers, and the one bound on any body it reads. Kept apart from api_support: DRF reads its
parser setting while its views module loads, so this module must not import DRF's views."""

from __future__ import annotations

import json
import re
from typing import Any

from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import JSONParser

from portal.api_errors import ApiError
from scheduling.errors import ServiceError
from scheduling.jobs.documents import json_object_once

MAX_BODY_BYTES = 1024 * 1024  # any body the API reads, whatever its media type
MAX_JSON_DEPTH = 32
MAX_JSON_VALUES = 20_000

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def body_too_large(size: int | str, *, limit: int = MAX_BODY_BYTES, field: str | None = None) -> ApiError:
    return ApiError(
        f"The body is {size} bytes; this endpoint reads at most {limit} bytes.",
        code="out_of_range",
        field=field,
        limit=limit,
    )


def shown_text(text: str) -> str:
    """Text as an error may quote it: a lone surrogate (which no response can encode) written as its escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class BoundedBodyNegotiation(DefaultContentNegotiation):
    """Once a parser is chosen, and before any of the body is read: a body longer, by its Content-Length, than the
    parser's `max_body_bytes` (MAX_BODY_BYTES unless it says less, as a job spec's does) is refused (400, `limit`
    in bytes), whatever its media type. DRF would otherwise read a form or JSON body whole, and Django's own limit
    answers with an HTML page."""

    def select_parser(self, request: Any, parsers: Any) -> Any:
        parser = super().select_parser(request, parsers)
        try:
            size = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:  # DRF reads no body then either
            size = 0
        limit = getattr(parser, "max_body_bytes", MAX_BODY_BYTES)
        if size > limit:
            raise body_too_large(size, limit=limit, field=getattr(parser, "body_field", None))
        return parser


class SafeJSONParser(JSONParser):
    """The API's JSON bodies, bounded: at most MAX_BODY_BYTES, `max_depth` levels and `max_values` values, no key
    twice in one object, no text a database cannot store (a lone surrogate, in a key or a value: named by where it
    is, escaped). Each refusal is a 400 that says which bound, never a RecursionError or an encoding error at
    INSERT; the costly checks run only when a cheap scan of the text says they might find something."""

    max_body_bytes = MAX_BODY_BYTES
    body_field: str | None = None
    max_depth = MAX_JSON_DEPTH
    max_values = MAX_JSON_VALUES

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = stream.read(self.max_body_bytes + 1) if stream is not None else b""
        if len(raw) > self.max_body_bytes:
            raise body_too_large(
                f"more than {self.max_body_bytes}", limit=self.max_body_bytes, field=self.body_field
            )
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
                        field = shown_text(path) or "body"
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
