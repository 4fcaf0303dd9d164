"""A client cannot pick its own address with X-Forwarded-For: only configured proxies are believed, for the
API's throttles and the sign-in protection alike."""

from __future__ import annotations

import pytest
from django.test import Client, RequestFactory

from portal.client_address import client_address

pytestmark = pytest.mark.django_db


def _login(client: Client, forwarded: str):
    return client.post(
        "/api/v1/auth/token/",
        {"username": "alice", "password": "wrong"},
        content_type="application/json",
        HTTP_X_FORWARDED_FOR=forwarded,
    )


def test_wrong_passwords_from_one_address_are_refused_whatever_x_forwarded_for_says(alice, settings):
    settings.TRUSTED_PROXIES = []
    client = Client()
    statuses = [_login(client, f"203.0.113.{i}").status_code for i in range(25)]
    assert statuses[: settings.AXES_FAILURE_LIMIT - 1] == [401] * (settings.AXES_FAILURE_LIMIT - 1)
    assert 429 in statuses and statuses[-1] == 429
    assert _login(client, "198.51.100.7").json()["error"]["code"] in ("locked_out", "throttled")


def test_behind_a_trusted_proxy_each_forwarded_client_is_counted_on_its_own(alice, settings):
    settings.TRUSTED_PROXIES = ["127.0.0.1"]
    client = Client(REMOTE_ADDR="127.0.0.1")
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _login(client, "203.0.113.9")
    assert _login(client, "203.0.113.9").status_code == 429
    assert _login(client, "203.0.113.10").status_code == 401  # another client behind the proxy


@pytest.mark.parametrize(
    "remote, forwarded, trusted, expected",
    [
        ("198.51.100.1", "203.0.113.5", [], "198.51.100.1"),  # no proxy: the header is ignored
        ("198.51.100.1", "203.0.113.5", ["10.0.0.0/8"], "198.51.100.1"),  # not from a proxy: ignored
        ("10.0.0.2", "203.0.113.5", ["10.0.0.0/8"], "203.0.113.5"),
        ("10.0.0.2", "1.2.3.4, 203.0.113.5, 10.0.0.3", ["10.0.0.0/8"], "203.0.113.5"),  # spoofed left part
        ("10.0.0.2", "", ["10.0.0.0/8"], "10.0.0.2"),
        ("10.0.0.2", "not-an-address", ["10.0.0.0/8"], "10.0.0.2"),
    ],
)
def test_the_client_address_rule(settings, remote, forwarded, trusted, expected):
    settings.TRUSTED_PROXIES = trusted
    request = RequestFactory().get("/", REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded)
    assert client_address(request) == expected
