"""Sign-in through the site's OpenID Connect provider (a real one: django-oauth-toolkit in a process of its own,
tests/oidc_provider/): the sign-in page names it, the authorization code flow with PKCE signs a person in with names
and teams from the claims, a person out of a group loses the team at the next sign-in, and `tessera login --sso`
gets a personal token by the device flow, whose tokens the portal checks were issued to the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import pytest
import requests

from quotas.choices import Role
from quotas.models import DirectoryAccount, Membership
from tests.directory_servers import oidc_provider_missing, oidc_provider_run

pytestmark = pytest.mark.skipif(oidc_provider_missing() is not None, reason=oidc_provider_missing() or "")

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = [
    "frontend.auth.SignInProtectionBackend",
    "quotas.oidc.DirectoryOIDCBackend",
    "frontend.auth.LocalAccountBackend",
]


@pytest.fixture(autouse=True)
def _fresh_login_throttle():
    """The token logins are throttled per address (20 a minute, in this process's cache, the live server's too):
    for attackers, not for the tests before these."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(scope="module")
def provider(live_server, tmp_path_factory):
    yield from oidc_provider_run(
        tmp_path_factory.mktemp("oidc"), redirect_uri=f"{live_server.url}/oidc/callback/"
    )


@pytest.fixture
def sso(provider, settings, teams):
    """The portal configured for the provider as a site would (its discovery document's endpoints); the training
    team follows gpu-training (admins: gpu-training-admins)."""
    config = provider.config
    settings.OIDC_PROVIDER_NAME = "Example Lab SSO"
    settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET = "tessera-web", "tessera-web-secret"
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = config["authorization_endpoint"]
    settings.OIDC_OP_TOKEN_ENDPOINT = config["token_endpoint"]
    settings.OIDC_OP_USER_ENDPOINT = config["userinfo_endpoint"]
    settings.OIDC_OP_JWKS_ENDPOINT = config["jwks_uri"]
    settings.TESSERA_OIDC_ISSUER = config["issuer"]
    settings.TESSERA_OIDC_DEVICE_AUTHORIZATION_ENDPOINT = config["device_authorization_endpoint"]
    settings.TESSERA_OIDC_CLI_CLIENT_ID = "tessera-cli"
    settings.TESSERA_OIDC_INTROSPECTION_ENDPOINT = config["introspection_endpoint"]
    settings.AUTHENTICATION_BACKENDS = BACKENDS
    training = teams["training"]
    training.directory_group, training.directory_admin_group = "gpu-training", "gpu-training-admins"
    training.save()
    return provider


def roles(username: str) -> dict[str, str]:
    return dict(Membership.objects.filter(user__username=username).values_list("team__slug", "role"))


def browser_sign_in(live_server, provider, username: str) -> requests.Response:
    """The sign-in page's button, the provider's form, and back: the last answer."""
    session = requests.Session()
    page = session.get(f"{live_server.url}/login/?next=/queue/", timeout=30)
    assert "Sign in with Example Lab SSO" in page.text
    start = page.text.split('class="button primary sso" href="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    at_provider = session.get(f"{live_server.url}{start}", timeout=30)
    assert at_provider.url.startswith(provider.url), at_provider.url
    asked = unquote(at_provider.url)  # the provider's login page, on its way to /o/authorize/?...
    assert "code_challenge=" in asked and "code_challenge_method=S256" in asked, "PKCE"
    return provider.sign_in(session, at_provider, username)


def test_a_person_signs_in_with_the_provider_and_gets_names_and_teams_from_its_claims(
    sso, live_server, django_user_model
):
    landed = browser_sign_in(live_server, sso, "dana")
    assert landed.status_code == 200 and landed.url == f"{live_server.url}/queue/", landed.url
    dana = django_user_model.objects.get(username="dana")
    assert (dana.first_name, dana.last_name, dana.email) == ("Dana", "Ito", "dana@example.org")
    assert not dana.has_usable_password()
    assert roles("dana") == {"ai-lab/training": Role.MEMBER}
    account = DirectoryAccount.objects.get(user=dana)
    assert account.source == "oidc" and account.groups == ["gpu-training"]
    assert account.unix_account == "", "no Unix account claim is configured: jobs run as the username"


def test_a_person_out_of_a_group_loses_the_team_at_the_next_sign_in_and_staff_follows_its_group(
    sso, live_server, settings, django_user_model
):
    settings.DIRECTORY_STAFF_GROUP = "tessera-staff"
    settings.TESSERA_OIDC_UNIX_ACCOUNT_CLAIM = "preferred_username"
    assert browser_sign_in(live_server, sso, "eli").status_code == 200
    eli = django_user_model.objects.get(username="eli")
    assert roles("eli") == {"ai-lab/training": Role.TEAM_ADMIN} and eli.is_staff
    assert DirectoryAccount.objects.get(user=eli).unix_account == "eli"
    sso.leave_group("eli", "gpu-training-admins")
    sso.leave_group("eli", "gpu-training")
    sso.leave_group("eli", "tessera-staff")
    try:
        assert browser_sign_in(live_server, sso, "eli").status_code == 200
        assert roles("eli") == {}
        eli.refresh_from_db()
        assert not eli.is_staff
    finally:
        for group in ("gpu-training", "gpu-training-admins", "tessera-staff"):
            sso.join_group("eli", group)


def test_without_a_provider_the_sign_in_page_has_no_button_and_its_urls_are_404(client, live_server):
    assert "Sign in with" not in client.get("/login/").content.decode()
    assert client.get("/oidc/sign-in/").status_code == 404
    assert client.get("/api/v1/auth/sso/").status_code == 404


def _device_tokens(provider) -> dict:
    """The CLI's tokens from a device sign-in dana approves (what `tessera login --sso` gets)."""
    grant = requests.post(
        provider.config["device_authorization_endpoint"],
        data={"client_id": "tessera-cli", "scope": "openid profile email"},
        timeout=30,
    ).json()
    provider.approve_device("dana", grant["user_code"])
    tokens = requests.post(
        provider.config["token_endpoint"],
        data={
            "grant_type": "urn:ietf:params:oauth:grant-type:device_code",
            "device_code": grant["device_code"],
            "client_id": "tessera-cli",
        },
        timeout=30,
    ).json()
    assert "access_token" in tokens, tokens
    return tokens


def test_the_portal_takes_device_flow_tokens_only_when_issued_to_its_cli_client(sso, live_server, settings):
    # This provider gives the device flow no ID token (Keycloak and Okta do): the access token is introspected.
    tokens = _device_tokens(sso)
    body = {"access_token": tokens["access_token"], "name": "laptop"}
    url = f"{live_server.url}/api/v1/auth/token/sso/"
    settings.TESSERA_OIDC_INTROSPECTION_ENDPOINT = ""
    refused = requests.post(url, json=body, timeout=30)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "authentication_failed", (
        refused.text
    )
    settings.TESSERA_OIDC_INTROSPECTION_ENDPOINT = sso.config["introspection_endpoint"]
    settings.TESSERA_OIDC_CLI_CLIENT_ID = "another-application"  # the token was issued to tessera-cli
    assert requests.post(url, json=body, timeout=30).status_code == 401
    settings.TESSERA_OIDC_CLI_CLIENT_ID = "tessera-cli"
    forged = {**body, "access_token": tokens["access_token"][:-4] + "AAAA"}
    assert requests.post(url, json=forged, timeout=30).status_code == 401
    not_a_jwt = {**body, "id_token": "not-a-jwt"}
    assert requests.post(url, json=not_a_jwt, timeout=30).status_code == 401
    created = requests.post(url, json=body, timeout=30)
    assert created.status_code == 201, created.text
    me = requests.get(
        f"{live_server.url}/api/v1/whoami/",
        headers={"Authorization": f"Bearer {created.json()['token']}"},
        timeout=30,
    )
    assert me.json()["username"] == "dana"


def test_tessera_login_sso_signs_in_by_the_device_flow(sso, live_server, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    env["TESSERA_CONFIG"] = str(tmp_path / "config.json")
    cli = subprocess.Popen(
        [sys.executable, "-m", "cli", "login", "--url", live_server.url, "--sso"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        said = []
        until = time.monotonic() + 60
        while not any("enter the code" in line for line in said):
            assert time.monotonic() < until and cli.poll() is None, said
            said.append(cli.stderr.readline())
        code = said[-1].split("enter the code ", 1)[1].split(".", 1)[0].strip()
        assert said[-2].startswith("To sign in with Example Lab SSO, open http"), said
        sso.approve_device("dana", code)
        out, err = cli.communicate(timeout=60)
    finally:
        cli.kill()
    assert cli.returncode == 0, err
    assert "as dana (ai-lab/training)" in out
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["username"] == "dana" and saved["token"].startswith("tsk_")
