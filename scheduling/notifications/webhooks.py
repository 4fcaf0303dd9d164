"""Where a webhook may go, the one rule for it, and the send itself.

A webhook URL makes the server connect where a user chose (SSRF). So a user's webhook goes over https to an address
on the public internet: never loopback, unspecified, link-local, multicast, reserved or private (IPv4 or IPv6; an
IPv4-mapped or 6to4 IPv6 address counts as the IPv4 address inside it), unless the site's allow-list
(TESSERA_WEBHOOK_ALLOW_HOSTS: host names, addresses, networks) names its host or holds every address it resolves
to; only such a host may also take plain http. The rule is checked when the URL is saved (the API and the portal's
form both save through `notification_settings_save`) and again at every send: the name is resolved afresh, the
connection goes to the very address checked (a name rebound between the check and the connection changes
nothing), and a redirect is never followed.
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import json
import re
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from django.conf import settings

from scheduling.errors import ServiceError

FIELD = "webhook_url"
REFUSED_CODE = "destination_not_allowed"
WEBHOOK_URL_MAX = 500
# Empty (no webhook), or an http(s) URL naming a host, without spaces; the API's schema says the same (its
# pattern), and what it lets through is then read by `webhook_url_check`. The spaces are named, not \s: Python's
# \s also takes \x1c-\x1f, the schema's (ECMAScript) does not, and the server and the schema refuse the same URLs.
WEBHOOK_URL_PATTERN = r"https?://[^ \t\n\r\f\v/?#][^ \t\n\r\f\v]*"
WEBHOOK_URL = re.compile(f"({WEBHOOK_URL_PATTERN})?")
ANSWER_READ_MAX = 64 * 1024
# What a path and query keep as written when sent (other characters percent-encoded, as requests did).
_URL_SAFE = "!#$%&'()*+,/:;=?@[]~"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class WebhookRefused(ServiceError):
    """The site does not let a webhook go there: at a save, the API's 400 (or the form's error); at a send, the
    message is given up at once, since every retry would be refused the same."""

    def __init__(self, message: str):
        super().__init__(message, field=FIELD, code=REFUSED_CODE)


@dataclass(frozen=True)
class Destination:
    """Where one send goes: the URL's parts, and the address checked, which the connection is made to."""

    scheme: str
    host: str  # as the URL names it (IDNA-encoded): the Host header, and the name a certificate must match
    port: int
    target: str  # path and query
    address: str


# -- the rule ----------------------------------------------------------------------------------------------------


@functools.cache
def _allow_list(entries: tuple[str, ...]) -> tuple[frozenset[str], tuple[IPNetwork, ...]]:
    """TESSERA_WEBHOOK_ALLOW_HOSTS read once per value: entries that are networks (or addresses), and host names."""
    names, networks = set(), []
    for entry in entries:
        entry = entry.strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            names.add(entry.lower().rstrip("."))
    return frozenset(names), tuple(networks)


def _allowed() -> tuple[frozenset[str], tuple[IPNetwork, ...]]:
    return _allow_list(tuple(settings.TESSERA_WEBHOOK_ALLOW_HOSTS))


def _why_not_public(ip: IPAddress) -> str | None:
    """Why a connection to `ip` could reach the portal's own host or network, or None for a public address."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:  # ::ffff:127.0.0.1 is 127.0.0.1 to a dual-stack socket
            return _why_not_public(ip.ipv4_mapped)
        inner = ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if inner is not None and _why_not_public(inner) is not None:
            return _why_not_public(inner)
    for kind, holds in (
        ("loopback", ip.is_loopback),
        ("unspecified", ip.is_unspecified),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),
        ("private", ip.is_private),
    ):
        if holds:
            return kind
    return None if ip.is_global else "not on the public internet"


def _parts(url: str) -> tuple[str, str, int, str]:
    """scheme, host (IDNA), port and path of a webhook URL, or a refusal saying what is wrong with it."""
    try:
        split = urlsplit(url)
        host, port = split.hostname, split.port
    except ValueError as exc:  # "[::1" or a port past 65535
        raise WebhookRefused(f"webhook_url cannot be read as a URL: {exc}.") from None
    if split.scheme not in ("http", "https"):
        raise WebhookRefused("webhook_url must be an https URL (https://...).")
    if not host:
        raise WebhookRefused("webhook_url names no host (https://host/...).")
    if split.username is not None or split.password is not None:
        raise WebhookRefused("webhook_url may not carry a user name or password (user@host).")
    try:
        host = host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        raise WebhookRefused(f"webhook_url's host {host[:60]!r} is not a host name.") from None
    port = port or (443 if split.scheme == "https" else 80)
    target = (split.path or "/") + (f"?{split.query}" if split.query else "")
    return split.scheme, host, port, quote(target, safe=_URL_SAFE)


def _resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` names (itself, for an address), in the resolver's order; [] when it names none now."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):  # socket.gaierror: no such name (now), or a name the resolver cannot read
        return []
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in found:
        # fe80::1%eth0: the zone is no part of the address
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if ip not in addresses:
            addresses.append(ip)
    return addresses


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _destination(url: str, *, at_send: bool, checked: bool = True) -> Destination | None:
    """The rule, for a save (`at_send` False: a name that resolves to nothing yet is taken; its addresses are
    checked at each send) and for a send: then the address to connect to, the first the resolver gave."""
    scheme, host, port, target = _parts(url)
    addresses = _resolve(host, port)
    if checked:
        names, networks = _allowed()
        named = host.lower().rstrip(".") in names
        unlisted = [ip for ip in addresses if not any(ip in net for net in networks)]
        if not named:
            for ip in unlisted:
                if (why := _why_not_public(ip)) is not None:
                    shown = "" if _literal(host) == ip else f" resolves to {ip} and"
                    raise WebhookRefused(
                        f"webhook_url's host {host}{shown} is {why}: webhooks go only to public addresses, unless "
                        "the site allows the host (TESSERA_WEBHOOK_ALLOW_HOSTS)."
                    )
        listed = bool(addresses) and not unlisted
        if scheme != "https" and not (named or listed):
            raise WebhookRefused(
                "webhook_url must be an https URL (https://...): plain http goes only to a host the site allows "
                "(TESSERA_WEBHOOK_ALLOW_HOSTS)."
            )
    if not addresses:
        if at_send:
            raise OSError(f"the webhook's host {host} does not resolve")  # tried again later, resolved again
        return None
    return Destination(scheme=scheme, host=host, port=port, target=target, address=str(addresses[0]))


def webhook_url_check(url: str) -> str:
    """A user's webhook URL as it may be saved ("" for none), or WebhookRefused (the API's 400, the form's error)
    naming webhook_url and why."""
    url = url or ""
    if not url:
        return url
    if len(url) > WEBHOOK_URL_MAX:
        raise ServiceError(
            f"webhook_url is at most {WEBHOOK_URL_MAX} characters.", field=FIELD, limit=str(WEBHOOK_URL_MAX)
        )
    if not WEBHOOK_URL.fullmatch(url):  # what the API's schema refuses too
        raise ServiceError(
            "webhook_url must be an https URL naming its host (https://host/...), with no spaces.",
            field=FIELD,
        )
    _destination(url, at_send=False)
    return url


# -- the send ----------------------------------------------------------------------------------------------------


class _PinnedConnection(http.client.HTTPConnection):
    """HTTP(S) to the address that was checked, never to whatever the name resolves to by the time of connecting;
    over https the certificate must still match the host's name."""

    def __init__(self, destination: Destination, *, timeout_s: float):
        super().__init__(destination.host, destination.port, timeout=timeout_s)
        self.destination = destination

    def connect(self) -> None:
        sock = socket.create_connection((self.destination.address, self.destination.port), self.timeout)
        if self.destination.scheme == "https":
            try:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.destination.host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock


def webhook_post(*, url: str, payload: dict, timeout_s: float, checked: bool = True) -> int:
    """POST `payload` as JSON to a webhook and return the answer's status; a redirect is an answer like any other
    (never followed). `checked`: the rule applies (a user's URL); False only for the operator's own
    TESSERA_NOTIFY_ADMIN_WEBHOOK_URL. Raises WebhookRefused where the rule refuses the URL now, OSError (and
    http.client's errors) where the host does not resolve or answer."""
    destination = _destination(url, at_send=True, checked=checked)
    assert destination is not None  # at a send: an address, or an exception
    body = json.dumps(payload).encode()
    connection = _PinnedConnection(destination, timeout_s=timeout_s)
    try:
        connection.request(
            "POST",
            destination.target,
            body=body,
            headers={"Content-Type": "application/json", "User-Agent": "Tessera notifications"},
        )
        answer = connection.getresponse()
        answer.read(ANSWER_READ_MAX)
        return answer.status
    finally:
        connection.close()
