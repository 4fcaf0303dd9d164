"""The submit form's what-if preview runs the engine on each call: it is rate-limited per user as the API's submits
are (a DRF throttle, TESSERA_PREVIEW_RATE), and says so plainly with a 429."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.test import Client

pytestmark = pytest.mark.django_db


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_preview_answers_429_past_its_rate_saying_so_and_when_to_try_again(alice, bob, settings):
    settings.TESSERA_PREVIEW_RATE = "2/min"
    cache.clear()
    alices, bobs = _signed_in(alice), _signed_in(bob)
    assert [alices.post("/jobs/new/preview/", {}).status_code for _ in range(2)] == [200, 200]

    refused = alices.post("/jobs/new/preview/", {})

    assert refused.status_code == 429
    text = refused.content.decode()
    assert "Too many previews" in text and "2 a minute" in text, text
    assert 0 < int(refused["Retry-After"]) <= 60
    assert bobs.post("/jobs/new/preview/", {}).status_code == 200  # per user
