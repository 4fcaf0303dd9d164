"""`manage.py check --deploy` fails while SECRET_KEY is the embedded demo key (issue: it only warned), and warns when
/metrics lets loopback in while no proxy is trusted (behind a proxy on the same host every client is 127.0.0.1)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError


def test_check_deploy_fails_on_the_embedded_demo_key(settings):
    settings.SECRET_KEY = settings.EMBEDDED_SECRET_KEY
    with pytest.raises(SystemCheckError, match="tessera.E001"):
        call_command("check", deploy=True, stdout=io.StringIO(), stderr=io.StringIO())


def test_check_deploy_does_not_raise_e001_with_a_key_of_its_own(settings):
    settings.SECRET_KEY = "a-long-random-production-key-" + "x" * 40
    out = io.StringIO()
    try:
        call_command("check", deploy=True, stdout=out, stderr=out)
    except SystemCheckError as exc:  # other deploy settings (TLS) may still be reported; not this one
        assert "tessera.E001" not in str(exc)
    else:
        assert "tessera.E001" not in out.getvalue()


def _deploy_check_says(settings) -> str:
    settings.SECRET_KEY = "a-long-random-production-key-" + "x" * 40
    out = io.StringIO()
    try:
        call_command("check", deploy=True, stdout=out, stderr=out)
    except SystemCheckError as exc:  # other deploy settings (TLS) may be errors here; only W001 matters
        return str(exc)
    return out.getvalue()


def test_check_deploy_warns_when_metrics_trust_loopback_and_no_proxy_is_trusted(settings):
    settings.TESSERA_METRICS_ALLOW_NETWORKS = ["127.0.0.1/32", "::1/128"]  # the default
    settings.TRUSTED_PROXIES = []
    said = _deploy_check_says(settings)
    assert "tessera.W001" in said and "TRUSTED_PROXIES" in said


@pytest.mark.parametrize(
    ("allowed", "proxies"),
    [(["127.0.0.1/32", "::1/128"], ["127.0.0.1"]), (["10.0.5.0/24"], []), ([], [])],
    ids=["a-trusted-proxy", "a-scrapers-network-only", "the-token-only"],
)
def test_check_deploy_does_not_warn_with_a_trusted_proxy_or_without_loopback(settings, allowed, proxies):
    settings.TESSERA_METRICS_ALLOW_NETWORKS = allowed
    settings.TRUSTED_PROXIES = proxies
    assert "tessera.W001" not in _deploy_check_says(settings)
