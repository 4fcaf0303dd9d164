"""Sessions and personal tokens end together: "sign out everywhere" (the account page and the API) ends every
session and revokes every token of the user, and so does any change of their password (the portal's form, an
admin's reset), the browser that changed it staying signed in."""

from __future__ import annotations

import logging

import pytest
from django.test import Client

from quotas.models import ApiToken
from quotas.tokens import api_token_create

pytestmark = pytest.mark.django_db


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _token_works(token: str) -> bool:
    answer = Client().get("/api/v1/whoami/", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert answer.status_code in (200, 401), answer.content
    return answer.status_code == 200


def _session_works(client: Client) -> bool:
    return client.get("/api/v1/whoami/").status_code == 200


def test_sign_out_everywhere_on_the_account_page_ends_every_session_and_token(alice, bob):
    here, elsewhere, bobs = _signed_in(alice), _signed_in(alice), _signed_in(bob)
    _, token = api_token_create(user=alice, name="laptop")
    _, bobs_token = api_token_create(user=bob, name="bob's")
    page = here.get("/account/sign-out-everywhere/")
    assert page.status_code == 200 and b"Sign out everywhere" in page.content

    done = here.post("/account/sign-out-everywhere/")

    assert done.status_code == 302 and done["Location"].startswith("/login/")
    assert not _session_works(here) and not _session_works(elsewhere) and not _token_works(token)
    assert _session_works(bobs) and _token_works(bobs_token)  # nobody else's


def test_the_api_signs_out_everywhere_and_says_how_much_it_ended(alice, bob, caplog):
    browser = _signed_in(alice)
    _, token = api_token_create(user=alice, name="cli")
    _, other = api_token_create(user=alice, name="ci")
    _, bobs_token = api_token_create(user=bob, name="bob's")

    with caplog.at_level(logging.INFO):
        answer = Client().post("/api/v1/auth/sign-out-everywhere/", HTTP_AUTHORIZATION=f"Bearer {token}")

    assert answer.status_code == 200, answer.content
    assert answer.json() == {"sessions_ended": 1, "tokens_revoked": 2}
    assert not _token_works(token) and not _token_works(other) and not _session_works(browser)
    assert _token_works(bobs_token)
    said = [r.getMessage() for r in caplog.records if "signed out everywhere" in r.getMessage()]
    assert said and "alice" in said[0] and "2 tokens" in said[0]  # the log says who, and what ended


def test_a_password_change_revokes_the_tokens_and_other_sessions_and_keeps_this_browser(alice):
    here, elsewhere = _signed_in(alice), _signed_in(alice)
    _, token = api_token_create(user=alice, name="laptop")

    changed = here.post(
        "/password/",
        {
            "old_password": "alice-pw",
            "new_password1": "a new pass phrase 42",
            "new_password2": "a new pass phrase 42",
        },
    )

    assert changed.status_code == 302, changed.content
    assert _session_works(here)
    assert not _session_works(elsewhere)
    assert not _token_works(token)
    assert ApiToken.objects.get(user=alice).revoked_at is not None


def test_a_password_an_admin_sets_revokes_the_users_tokens_and_sessions(alice, admin_user):
    browser = _signed_in(alice)
    _, token = api_token_create(user=alice, name="laptop")
    admin = _signed_in(admin_user)

    reset = admin.post(
        f"/admin/auth/user/{alice.pk}/password/",
        {"password1": "a new pass phrase 42", "password2": "a new pass phrase 42", "usable_password": "true"},
    )

    assert reset.status_code == 302, reset.content
    assert not _token_works(token) and not _session_works(browser)
    assert _session_works(admin)
