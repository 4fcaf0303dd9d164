"""A webhook makes the server call a URL a user chose (SSRF): such a URL is refused when saved, through the API and
the portal's form alike, and checked again at each send (the name resolved again, the connection made to the
address checked); no redirect is followed; the site's allow-list (TESSERA_WEBHOOK_ALLOW_HOSTS) lets an internal
host in. Every server here is a real listener on this host, which records whatever reaches it."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from scheduling.notifications.models import Notification, NotificationSettings
from scheduling.notifications.services import admin_notify, notification_deliver, notification_settings_save
from tests.support import RecordingHttpServer

pytestmark = pytest.mark.django_db


# What bob once saved (and the server then POSTed to), and their kin; each with the word the refusal gives.
REFUSED = [
    ("http://127.0.0.1:8125/x", "loopback"),
    ("https://127.0.0.1:8125/x", "loopback"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[::1]:8125/x", "loopback"),
    ("http://localhost:8125/x", "loopback"),
    ("https://[::ffff:127.0.0.1]:8125/x", "loopback"),  # IPv4-mapped IPv6
    ("https://[::ffff:169.254.169.254]/x", "link-local"),
    ("https://2130706433/x", "loopback"),  # 127.0.0.1 written as one number
    ("https://10.1.2.3/x", "private"),
    ("https://192.168.1.1/x", "private"),
    ("https://[fd00::1]/x", "private"),
    ("https://[fe80::1]/x", "link-local"),
    ("https://224.0.0.251/x", "multicast"),
    ("https://[ff02::1]/x", "multicast"),
    ("https://0.0.0.0/x", "unspecified"),
    ("https://[::]/x", "unspecified"),
    ("https://240.0.0.1/x", "reserved"),
    ("https://100.64.0.1/x", "not on the public internet"),  # shared (carrier-grade NAT) space
    ("http://93.184.215.14/x", "https"),  # public, but plain http
    ("https:///x", "host"),
    ("https://", "host"),  # the schema's pattern, too, asks for a host
]


def _put(client: Client, url: str):
    return client.put(
        "/api/v1/notifications/",
        {"job_events": ["end"], "email": False, "webhook_url": url},
        content_type="application/json",
    )


def _outbox_row(user, url: str) -> Notification:
    """The row a job's change writes for a webhook (what delivery reads), here written directly."""
    return Notification.objects.create(
        user=user,
        kind="end",
        channel=Notification.WEBHOOK,
        target=url,
        subject="[Tessera] job 7 x succeeded",
        body="Job 7 went from running to succeeded.",
        next_attempt_at=timezone.now(),
    )


@pytest.fixture
def listener():
    server = RecordingHttpServer()
    yield server
    server.close()


def test_each_internal_or_plain_http_webhook_is_refused_by_the_api_naming_the_field_and_why(bob):
    client = Client()
    client.force_login(bob)
    for url, why in REFUSED:
        answer = _put(client, url)
        assert answer.status_code == 400, (url, answer.content)
        error = answer.json()["error"]
        assert error["field"] == "webhook_url", (url, error)
        assert why in error["message"], (url, error["message"])
    assert not NotificationSettings.objects.filter(user=bob).exists()


def test_the_portal_form_refuses_the_same_webhooks_by_the_same_rule(bob):
    client = Client()
    client.force_login(bob)
    for url, why in REFUSED:
        page = client.post(
            "/account/notifications/", {"job_events": ["end"], "email": "on", "webhook_url": url}
        )
        assert page.status_code == 200, url  # the form again, with the refusal beside the field
        assert why in page.context["form"].errors["webhook_url"][0], (url, page.context["form"].errors)
    assert not NotificationSettings.objects.filter(user=bob).exists()


def test_a_public_https_webhook_is_taken(bob):
    client = Client()
    client.force_login(bob)
    answer = _put(client, "https://93.184.215.14/services/T0/B0/x")
    assert answer.status_code == 200, answer.content
    assert NotificationSettings.objects.get(user=bob).webhook_url == "https://93.184.215.14/services/T0/B0/x"


def test_the_allow_list_lets_an_internal_host_in_over_http_by_name_or_network(bob, settings):
    settings.TESSERA_WEBHOOK_ALLOW_HOSTS = ["chat.internal", "10.1.0.0/16"]
    for url in ("http://10.1.2.3:8080/hooks/x", "https://10.1.200.1/x"):
        notification_settings_save(user=bob, job_events="end", email=False, webhook_url=url)
    # A name on the list is taken whatever it resolves to (here: nothing, offline).
    notification_settings_save(user=bob, job_events="end", email=False, webhook_url="http://chat.internal/x")
    for url in ("http://10.2.0.1/x", "http://127.0.0.1:8125/x", "http://chat.internal.evil.org/x"):
        client = Client()
        client.force_login(bob)
        assert _put(client, url).status_code == 400, url


def test_a_name_that_resolves_to_loopback_at_send_time_is_not_contacted(bob, settings, listener):
    """Saved while the site allowed the name, then taken off the list: the send resolves it again (localhost:
    127.0.0.1) and refuses it, as it would a name rebound to an inner address after the save."""
    settings.TESSERA_WEBHOOK_ALLOW_HOSTS = ["localhost"]
    url = f"http://localhost:{listener.port}/hook"
    notification_settings_save(user=bob, job_events="end", email=False, webhook_url=url)
    row = _outbox_row(bob, url)
    settings.TESSERA_WEBHOOK_ALLOW_HOSTS = []

    assert notification_deliver(notification_id=row.pk) is False

    assert listener.requests == []
    row.refresh_from_db()
    assert "loopback" in row.last_error and "127.0.0.1" in row.last_error
    assert row.failed_at is not None  # refused, not retried: the next try would be refused the same


def test_a_redirect_is_not_followed_not_even_to_an_allowed_host(bob, settings, listener):
    inner = listener
    outer = RecordingHttpServer(status=307, location=f"http://127.0.0.1:{inner.port}/hook")
    try:
        # The first hop's host is allowed by name; the redirect's (127.0.0.1) would be refused, and is not asked.
        settings.TESSERA_WEBHOOK_ALLOW_HOSTS = ["localhost"]
        row = _outbox_row(bob, f"http://localhost:{outer.port}/hook")
        assert notification_deliver(notification_id=row.pk) is False
        assert outer.requests == [("POST", "/hook")]
        assert inner.requests == []
        row.refresh_from_db()
        assert "307" in row.last_error and "redirect" in row.last_error
    finally:
        outer.close()


def test_an_allowed_internal_webhook_is_delivered_to_the_address_checked(bob, settings, listener):
    settings.TESSERA_WEBHOOK_ALLOW_HOSTS = ["localhost"]
    row = _outbox_row(bob, f"http://localhost:{listener.port}/hook")
    assert notification_deliver(notification_id=row.pk) is True
    assert listener.requests == [("POST", "/hook")]
    assert listener.received[0]["text"].startswith("*[Tessera] job 7 x succeeded*")


def test_the_sites_own_admin_webhook_is_the_operators_choice_and_not_checked(admin_user, settings, listener):
    settings.TESSERA_NOTIFY_ADMIN_WEBHOOK_URL = listener.url  # loopback, and no allow-list
    settings.TESSERA_WEBHOOK_ALLOW_HOSTS = []
    NotificationSettings.objects.create(user=admin_user, email=False, admin_events=[])
    (row,) = admin_notify(kind="node_lost", subject="node a100-01 lost", body="No heartbeat for 60 s.")
    assert notification_deliver(notification_id=row.pk) is True
    assert [m["tessera"]["kind"] for m in listener.received] == ["node_lost"]
