"""What every API endpoint shares: one error format, bounded pagination, the submit throttle, a CSV renderer.

Errors always read {"error": {"code", "message", "field", "limit"?, "fields": {field: [messages]}}}.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.renderers import BaseRenderer
from rest_framework.response import Response
from rest_framework.throttling import UserRateThrottle
from rest_framework.views import exception_handler as drf_exception_handler

from portal.api_errors import ApiError
from portal.api_params import int_param
from portal.client_address import client_address
from portal.parsers import body_too_large, shown_text
from quotas.errors import QuotaRefused
from scheduling.errors import ServiceError
from scheduling.jobs.states import IllegalTransition

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 50


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error details as {"field.sub": ["message", ...]}."""
    out: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            for k, v in _flatten(value, name).items():
                out.setdefault(k, []).extend(v)
    elif isinstance(detail, list):
        for item in detail:
            for k, v in _flatten(item, prefix).items():
                out.setdefault(k, []).extend(v)
    else:
        out.setdefault(prefix or "non_field_errors", []).append(str(detail))
    return out


def error_body(
    *, code: str, message: str, field: str | None = None, limit: Any = None, fields: dict | None = None
) -> dict[str, Any]:
    """The one error format. Its text is written so that any response can encode it: input quoted in a message
    (a key, a value) may hold a lone surrogate, which is written as its escape rather than failing the answer."""
    message, field = shown_text(message), field and shown_text(field)
    fields = {shown_text(k): [shown_text(m) for m in v] for k, v in (fields or {}).items()}
    error: dict[str, Any] = {"code": code, "message": message, "field": field, "fields": fields}
    if limit is not None:
        error["limit"] = limit
    if field and not error["fields"]:
        error["fields"] = {field: [message]}
    return {"error": error}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Every refusal in the same shape, so clients (and the CLI) read one format."""
    if isinstance(exc, ServiceError):
        return Response(
            error_body(
                code=exc.code,
                message=exc.message,
                field=exc.field,
                limit=exc.limit,
            ),
            status=status.HTTP_403_FORBIDDEN if exc.code == "not_member" else status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, QuotaRefused):
        return Response(
            error_body(code=exc.code, message=exc.message, field=exc.field, limit=exc.limit),
            status=exc.status_code,
        )
    if isinstance(exc, IllegalTransition):
        return Response(
            error_body(code="illegal_transition", message=str(exc), field="state"),
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, RequestDataTooBig | TooManyFieldsSent | TooManyFilesSent):
        exc = _request_limit(exc)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, ApiError):
        response.data = error_body(
            code=exc.error_code, message=str(exc.detail), field=exc.field, limit=exc.limit
        )
        return response
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        first_field, messages = next(iter(fields.items()), ("non_field_errors", ["Invalid input."]))
        field = None if first_field == "non_field_errors" else first_field
        message = f"{first_field}: {messages[0]}" if field else messages[0]
        response.data = error_body(code="invalid", message=message, field=field, fields=fields)
        return response
    codes = exc.get_codes() if isinstance(exc, exceptions.APIException) else "error"
    code = codes if isinstance(codes, str) else "error"
    detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
    limit = None
    if isinstance(exc, exceptions.Throttled):
        code, limit = "throttled", context.get("view") and _throttle_rate(context["view"])
    response.data = error_body(code=code, message=str(detail), limit=limit)
    return response


def _request_limit(exc: Exception) -> ApiError:
    """Django's own bounds on a body it parses (a form's size, fields and files), said as the API says a bound."""
    if isinstance(exc, RequestDataTooBig):
        return body_too_large(f"more than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE}")
    if isinstance(exc, TooManyFieldsSent):
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        return ApiError(f"A form body may hold at most {limit} fields.", code="out_of_range", limit=limit)
    limit = settings.DATA_UPLOAD_MAX_NUMBER_FILES
    return ApiError(f"A form body may hold at most {limit} files.", code="out_of_range", limit=limit)


def _throttle_rate(view: Any) -> str | None:
    for throttle in getattr(view, "get_throttles", list)():
        if getattr(throttle, "rate", None):
            return throttle.rate
    return None


class BoundedPagination(PageNumberPagination):
    """Pages of 50 by default; `page_size` above the maximum is refused (400), not silently clamped."""

    page_size = DEFAULT_PAGE_SIZE
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE

    def get_schema_operation_parameters(self, view: Any) -> list[dict]:
        """What the schema says of `page` and `page_size`: the bounds the API enforces."""
        parameters = super().get_schema_operation_parameters(view)
        for p in parameters:
            if p["name"] == self.page_query_param:
                p["schema"] = {"type": "integer", "minimum": 1}
            elif p["name"] == self.page_size_query_param:
                p["schema"] = {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE}
        return parameters

    last_page_strings = ()  # `?page=last` is not a page number: the schema says an integer, and so does this

    def get_page_number(self, request: Any, paginator: Any) -> int:
        return int_param(request, self.page_query_param, low=1, high=None, default=1)

    def get_page_size(self, request: Any) -> int:
        return int_param(
            request, self.page_size_query_param, low=1, high=MAX_PAGE_SIZE, default=self.page_size
        )


class ClientAddressThrottleMixin:
    """Throttles keyed by address use portal.client_address (trusted proxies only), never DRF's own reading of
    X-Forwarded-For, which believes any client."""

    def get_ident(self, request: Any) -> str:
        return client_address(request)


class SubmitRateThrottle(ClientAddressThrottleMixin, UserRateThrottle):
    """Per-user submit rate (settings REST_FRAMEWORK.DEFAULT_THROTTLE_RATES['submit']).

    A convenience against runaway scripts, not a security control: the counters are not atomic.
    """

    scope = "submit"


class PreviewRateThrottle(ClientAddressThrottleMixin, UserRateThrottle):
    """Per-user rate of the submit form's what-if preview (TESSERA_PREVIEW_RATE), which runs the engine on every
    call. The portal's view asks `allow_request` itself, as DRF does for an API view; not a security control
    either."""

    scope = "preview"

    def get_rate(self) -> str:
        return settings.TESSERA_PREVIEW_RATE


class CsvRenderer(BaseRenderer):
    """Flat rows (a list of dicts, or a paginated {"results": [...]}) as CSV, selected by ?format=csv."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        if isinstance(data, dict) and "results" in data:
            data = data["results"]
        if isinstance(data, dict):  # an error body
            data = [data.get("error", data)]
        rows = list(data or [])
        buffer = io.StringIO()
        # With no rows the view's `csv_columns` still give a header: an empty body would go out without a
        # Content-Type (DRF drops it for empty content).
        view = (renderer_context or {}).get("view")
        columns = list(rows[0].keys()) if rows else list(getattr(view, "csv_columns", None) or [])
        if columns:
            writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            for row in rows:
                writer.writerow({k: v for k, v in row.items() if not isinstance(v, dict | list)})
        return buffer.getvalue().encode()
