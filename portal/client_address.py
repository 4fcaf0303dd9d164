"""The client's address, the one rule for it: REMOTE_ADDR, unless it is one of TRUSTED_PROXIES; then the nearest
address in X-Forwarded-For that is not a trusted proxy. A header from anyone else is ignored, so a client cannot
choose its own address (and dodge a per-address limit) by sending one.

Used by the API's throttles and by the sign-in protection (django-axes' AXES_CLIENT_IP_CALLABLE).
"""

from __future__ import annotations

import functools
import ipaddress

from django.conf import settings
from django.http import HttpRequest


@functools.cache
def _trusted(networks: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(n, strict=False) for n in networks)


def _is_trusted(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in _trusted(tuple(settings.TRUSTED_PROXIES)))


def client_address(request: HttpRequest) -> str:
    remote = request.META.get("REMOTE_ADDR", "") or ""
    if not settings.TRUSTED_PROXIES or not _is_trusted(remote):
        return remote
    hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if h.strip()]
    for hop in reversed(hops):
        if not _is_trusted(hop):
            # What a trusted proxy says the client was; something that is no address says nothing.
            return hop if _is_address(hop) else remote
    return remote


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
