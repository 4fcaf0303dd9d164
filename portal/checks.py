"""System checks of Tessera's own settings (`manage.py check`; `--deploy` adds the ones for production)."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Tags, register


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
