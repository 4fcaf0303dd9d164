"""`tessera login --sso`: the site's single sign-on from a terminal, by the OAuth device flow (RFC 8628). The CLI
asks the provider for a code, the person enters it in any browser where they can sign in, and the provider's
tokens are exchanged with the portal for a personal API token, the same kind a password login gets."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import requests

from cli.client import TIMEOUT_S, ApiError, Client

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
MAX_WAIT_S = 900.0  # providers' device codes live 5-15 minutes; past this one is surely expired


def _provider_post(url: str, data: dict[str, str]) -> tuple[int, dict[str, Any]]:
    try:
        response = requests.post(url, data=data, timeout=TIMEOUT_S, headers={"Accept": "application/json"})
    except requests.RequestException as exc:
        raise ApiError(f"Cannot reach the sign-on provider at {url}: {exc.__class__.__name__}") from None
    try:
        body = response.json()
    except ValueError:
        body = {}
    return response.status_code, body if isinstance(body, dict) else {}


def sso_token(
    *, url: str, name: str, say: Callable[[str], None] = lambda text: print(text, file=sys.stderr)
) -> str:
    """A new personal token for whoever completes the provider's device sign-in (ApiError: refused or expired)."""
    portal = Client(url=url)
    config = portal.get("/api/v1/auth/sso/")
    status, grant = _provider_post(
        config["device_authorization_endpoint"], {"client_id": config["client_id"], "scope": config["scope"]}
    )
    if status != 200 or "device_code" not in grant:
        raise ApiError(
            f"{config['provider']} refused to start a sign-in: {grant.get('error_description') or grant.get('error') or status}"
        )
    where = grant.get("verification_uri_complete") or grant["verification_uri"]
    say(f"To sign in with {config['provider']}, open {where}")
    say(f"and enter the code {grant['user_code']}. Waiting...")
    interval_s = float(grant.get("interval") or 5)
    until = time.monotonic() + min(float(grant.get("expires_in") or MAX_WAIT_S), MAX_WAIT_S)
    while True:
        time.sleep(interval_s)  # the provider asks for this pause between polls (RFC 8628, 3.5)
        status, tokens = _provider_post(
            config["token_endpoint"],
            {
                "grant_type": DEVICE_GRANT,
                "device_code": grant["device_code"],
                "client_id": config["client_id"],
            },
        )
        error = tokens.get("error")
        if status == 200 and tokens.get("access_token"):
            break
        if error == "authorization_pending" and time.monotonic() < until:
            continue
        if error == "slow_down" and time.monotonic() < until:
            interval_s += 5
            continue
        if error == "access_denied":
            raise ApiError("The sign-in was denied in the browser.", status=401)
        raise ApiError(
            "The sign-in code expired before it was entered; run `tessera login --sso` again."
            if error in ("expired_token", "authorization_pending", "slow_down")
            else f"{config['provider']} refused the sign-in: {tokens.get('error_description') or error or status}",
            status=401,
        )
    created = portal.post(
        "/api/v1/auth/token/sso/",
        {"id_token": tokens.get("id_token") or "", "access_token": tokens["access_token"], "name": name},
    )
    return created["token"]
