"""The request id and the access log: every HTTP request gets an id (the client's `X-Request-ID` when it is sane,
else a new one), returned in the response's `X-Request-ID` and carried on every log line written while the request
is handled (agent/logformat.py's context variable and filter). One line per request on `tessera.access`: INFO for
an answer below 400, WARNING for 4xx, ERROR for 5xx; a request that raised is logged once, by `django.request`
with its traceback. Formats and settings: docs/operations.md, "Logs".
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from agent.logformat import request_id_var

HEADER = "X-Request-ID"
MAX_REQUEST_ID_CHARS = 64
_SANE = re.compile(rf"[A-Za-z0-9-]{{1,{MAX_REQUEST_ID_CHARS}}}")

access_log = logging.getLogger("tessera.access")


def request_id_from(value: str | None) -> str:
    """The client's id when it is bounded and plain ([A-Za-z0-9-], at most 64 characters), else a new one."""
    if value and _SANE.fullmatch(value):
        return value
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """First in MIDDLEWARE, so every later middleware's and view's log lines carry the id."""

    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = request_id_from(request.headers.get(HEADER))
        request.request_id = request_id
        token = request_id_var.set(request_id)
        started = time.perf_counter()
        try:
            response = self.get_response(request)
            response[HEADER] = request_id
            if not getattr(response, "_has_been_logged", False):
                status = response.status_code
                level = logging.ERROR if status >= 500 else logging.WARNING if status >= 400 else logging.INFO
                access_log.log(
                    level,
                    "%s %s %s %.0f ms",
                    request.method,
                    request.path[:500],  # never the query: it may carry a secret
                    status,
                    (time.perf_counter() - started) * 1000,
                )
                # Django's own line for a 4xx/5xx ("Not Found: /x") would say it a second time.
                response._has_been_logged = True
            return response
        finally:
            request_id_var.reset(token)
