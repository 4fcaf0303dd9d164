"""System checks of Tessera's own settings (`manage.py check`; `--deploy` adds the ones for production)."""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register


@register(Tags.security, deploy=True)
def secret_key_is_not_the_demo_key(app_configs, **kwargs) -> list[Error]:
    """Production must set SECRET_KEY: with the embedded demo key anyone can sign sessions and tokens."""
    if settings.SECRET_KEY == settings.EMBEDDED_SECRET_KEY:
        return [
            Error(
                "SECRET_KEY is the embedded demo key, which is public: anyone could sign sessions with it.",
                hint="Set SECRET_KEY (or SECRET_KEY_FILE) to a long random value, e.g. from "
                "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`.",
                id="tessera.E001",
            )
        ]
    return []


_LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


@register(Tags.security, deploy=True)
def metrics_trust_loopback_behind_no_trusted_proxy(app_configs, **kwargs) -> list[Warning]:
    """/metrics lets loopback in without its token (TESSERA_METRICS_ALLOW_NETWORKS' default). Behind a reverse
    proxy on the same host every request arrives from 127.0.0.1, so unless TRUSTED_PROXIES names that proxy (and
    the client's own address is read from its X-Forwarded-For) the metrics are open to anyone."""
    if settings.TRUSTED_PROXIES:
        return []
    loopback = []
    for entry in settings.TESSERA_METRICS_ALLOW_NETWORKS:
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            continue
        if any(network.version == lo.version and network.overlaps(lo) for lo in _LOOPBACK):
            loopback.append(entry)
    if not loopback:
        return []
    return [
        Warning(
            f"/metrics is open without its token to loopback ({', '.join(loopback)} in "
            "TESSERA_METRICS_ALLOW_NETWORKS) and TRUSTED_PROXIES is unset: behind a proxy on this host every "
            "client arrives from 127.0.0.1, and would read the metrics.",
            hint="Set TRUSTED_PROXIES to the proxies' addresses (127.0.0.1 for one on this host, which is harmless "
            "with none), or TESSERA_METRICS_ALLOW_NETWORKS to the scraper's network only (or empty, with "
            "TESSERA_METRICS_TOKEN).",
            id="tessera.W001",
        )
    ]
