"""`/metrics` for Prometheus, and the middleware that counts each request by route.

Access (docs/operations.md, "Monitoring"): a bearer token (`TESSERA_METRICS_TOKEN`), or a client address in
`TESSERA_METRICS_ALLOW_NETWORKS` (default: this host only). Anyone else gets 403: the metrics name teams, jobs and
nodes.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import time
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from portal.client_address import client_address
from scheduling.observability.exposition import metrics_text
from scheduling.observability.instruments import HTTP_DURATION, HTTP_REQUESTS
from scheduling.observability.readiness import ReadinessCollector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_READINESS = ReadinessCollector()


def metrics_body() -> bytes:
    """What /metrics answers: the exposition with the readiness checks (/readyz's) beside it."""
    return metrics_text(extra={"readiness": _READINESS})


@functools.cache
def _networks(spec: tuple[str, ...]) -> tuple:
    return tuple(ipaddress.ip_network(n, strict=False) for n in spec)


def metrics_allowed(request: HttpRequest) -> bool:
    token = settings.TESSERA_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].strip(), token):
        return True
    try:
        address = ipaddress.ip_address(client_address(request))
    except ValueError:
        return False
    return any(address in net for net in _networks(tuple(settings.TESSERA_METRICS_ALLOW_NETWORKS)))


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not metrics_allowed(request):
        return HttpResponse(
            "Forbidden: /metrics takes a bearer token (TESSERA_METRICS_TOKEN) or a client address in "
            "TESSERA_METRICS_ALLOW_NETWORKS.\n",
            status=403,
            content_type="text/plain; charset=utf-8",
        )
    return HttpResponse(metrics_body(), content_type=CONTENT_TYPE)


class RequestMetricsMiddleware:
    """Counts every request by its route pattern (never the raw path: ids would make a series each), method and
    status, and times it."""

    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = match.route if match is not None and match.route else "(unmatched)"
        method = request.method if request.method in _METHODS else "OTHER"
        HTTP_REQUESTS.labels(route, method, str(response.status_code)).inc()
        HTTP_DURATION.labels(route, method).observe(time.perf_counter() - started)
        return response


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
