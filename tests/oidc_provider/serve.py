"""Run the test OpenID Connect provider: `python -m tests.oidc_provider.serve PORT REDIRECT_URI` with
OIDC_PROVIDER_DB, OIDC_PROVIDER_KEY and OIDC_PROVIDER_URL set (tests/directory_servers.py does). It migrates its
database, adds the people, their groups and two clients (the portal's confidential one and the CLI's public
device-flow one), then serves until terminated."""

from __future__ import annotations

import os
import sys

# (username, given name, family name, groups): each signs in with the password "<username>-pw".
PEOPLE = (
    ("dana", "Dana", "Ito", ("gpu-training",)),
    ("eli", "Eli", "Moreau", ("gpu-training", "gpu-training-admins", "tessera-staff")),
)
WEB_CLIENT_ID, WEB_CLIENT_SECRET = "tessera-web", "tessera-web-secret"
CLI_CLIENT_ID = "tessera-cli"


def seed(redirect_uri: str) -> None:
    from django.contrib.auth.models import Group, User
    from oauth2_provider.models import Application

    for username, given, family, groups in PEOPLE:
        user = User.objects.create_user(
            username=username,
            password=f"{username}-pw",
            first_name=given,
            last_name=family,
            email=f"{username}@example.org",
        )
        user.groups.set([Group.objects.get_or_create(name=g)[0] for g in groups])
    Application.objects.create(
        name="Tessera",
        client_id=WEB_CLIENT_ID,
        client_secret=WEB_CLIENT_SECRET,
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=redirect_uri,
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=True,
    )
    Application.objects.create(
        name="Tessera CLI",
        client_id=CLI_CLIENT_ID,
        client_type=Application.CLIENT_PUBLIC,
        authorization_grant_type=Application.GRANT_DEVICE_CODE,
        algorithm=Application.RS256_ALGORITHM,
    )


def main() -> None:
    port, redirect_uri = int(sys.argv[1]), sys.argv[2]
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.oidc_provider.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.core.servers.basehttp import run
    from django.core.wsgi import get_wsgi_application

    call_command("migrate", verbosity=0)
    seed(redirect_uri)
    run("127.0.0.1", port, get_wsgi_application(), threading=True)


if __name__ == "__main__":
    main()
