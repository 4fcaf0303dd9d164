"""Sign-in through the site's LDAP directory (a real slapd, tests/directory_servers.py): people sign in with the
directory's password on the form and for an API token, teams and staff status follow the directory's groups at
each sign-in, the Unix account is kept for the agents, wrong passwords are locked out as local ones are, and local
accounts can be limited to break-glass superusers."""

from __future__ import annotations

import environ
import pytest
from django.test import Client

from quotas.choices import Role
from quotas.ldap_settings import ldap_settings
from quotas.models import DirectoryAccount, Membership
from quotas.services import membership_set
from tests.directory_servers import GROUPS, PEOPLE, SERVICE_DN, SERVICE_PW, slapd_missing, slapd_run

pytestmark = pytest.mark.skipif(slapd_missing() is not None, reason=slapd_missing() or "")

BACKENDS = [
    "frontend.auth.SignInProtectionBackend",
    "quotas.ldap.DirectoryLDAPBackend",
    "frontend.auth.LocalAccountBackend",
]


@pytest.fixture(scope="module")
def slapd(tmp_path_factory):
    yield from slapd_run(tmp_path_factory.mktemp("slapd"))


@pytest.fixture
def directory(slapd, settings, teams, monkeypatch):
    """The portal configured for the directory as a site would, from the environment (a search as the service
    account, groupOfNames groups); the training team follows gpu-training (admins: gpu-training-admins)."""

    def configure(**variables: str) -> None:
        base = {
            "TESSERA_LDAP_URI": slapd.uri,
            "TESSERA_LDAP_BIND_DN": SERVICE_DN,
            "TESSERA_LDAP_BIND_PASSWORD": SERVICE_PW,
            "TESSERA_LDAP_USER_SEARCH_BASE": PEOPLE,
            "TESSERA_LDAP_GROUP_SEARCH_BASE": GROUPS,
        }
        for name in list(base) + [
            "TESSERA_LDAP_USER_DN_TEMPLATE",
            "TESSERA_LDAP_START_TLS",
            "TESSERA_LDAP_CA_FILE",
        ]:
            monkeypatch.delenv(name, raising=False)
        for name, value in {**base, **variables}.items():
            if value:
                monkeypatch.setenv(name, value)
        for name, value in ldap_settings(environ.FileAwareEnv()).items():
            setattr(settings, name, value)
        settings.AUTHENTICATION_BACKENDS = BACKENDS

    configure()
    training = teams["training"]
    training.directory_group, training.directory_admin_group = "gpu-training", "gpu-training-admins"
    training.save()
    inference = teams["inference"]
    inference.directory_group = "gpu-inference"
    inference.save()
    slapd.configure = configure
    yield slapd
    slapd.reset_groups()


def sign_in(username: str, password: str | None = None) -> int:
    """The sign-in form's answer: 302 signed in, 200 refused, 429 locked out."""
    response = Client().post("/login/", {"username": username, "password": password or f"{username}-pw"})
    return response.status_code


def roles(username: str) -> dict[str, str]:
    return dict(Membership.objects.filter(user__username=username).values_list("team__slug", "role"))


def test_a_directory_user_signs_in_on_the_form_with_names_teams_and_unix_account_from_the_directory(
    directory, django_user_model
):
    assert sign_in("ada") == 302
    ada = django_user_model.objects.get(username="ada")
    assert (ada.first_name, ada.last_name, ada.email) == ("Ada", "Lovelace", "ada@example.org")
    assert not ada.has_usable_password(), "the directory keeps the password, the portal does not"
    assert roles("ada") == {"ai-lab/training": Role.TEAM_ADMIN}, "the admins' group outranks the members'"
    account = DirectoryAccount.objects.get(user=ada)
    assert (account.source, account.subject, account.unix_account) == ("ldap", f"uid=ada,{PEOPLE}", "ada")
    assert set(account.groups) == {"gpu-training", "gpu-training-admins"}
    assert sign_in("ben") == 302 and roles("ben") == {"ai-lab/training": Role.MEMBER}
    # Her password is the directory's: the portal's password page says so instead of asking for one it has not.
    client = Client()
    client.force_login(ada)
    page = client.get("/password/").content.decode()
    assert (
        "Your password is your directory" in page
        and "<code>ada</code>" in page
        and 'name="old_password"' not in page
    )


def test_a_user_removed_from_a_group_loses_the_team_at_the_next_sign_in_and_hand_kept_teams_stay(
    directory, teams, django_user_model
):
    assert sign_in("ben") == 302
    ben = django_user_model.objects.get(username="ben")
    membership_set(user=ben, team=teams["training"].parent)  # the organisation: a team kept by hand
    directory.remove_member("gpu-training", "ben")
    assert roles("ben")["ai-lab/training"] == Role.MEMBER, "nothing changes before the next sign-in"
    assert sign_in("ben") == 302
    assert roles("ben") == {"ai-lab": Role.MEMBER}
    # Ada leaves the admins' group but stays a member: her role follows.
    directory.remove_member("gpu-training-admins", "ada")
    assert sign_in("ada") == 302 and roles("ada") == {"ai-lab/training": Role.MEMBER}


def test_staff_status_follows_the_staff_group_when_one_is_named(directory, settings, django_user_model):
    assert sign_in("cy") == 302
    assert not django_user_model.objects.get(username="cy").is_staff, "no staff group named: staff is by hand"
    settings.DIRECTORY_STAFF_GROUP = "tessera-staff"
    assert sign_in("cy") == 302
    assert django_user_model.objects.get(username="cy").is_staff
    # The admins' group alone makes a team admin, a member too.
    assert roles("cy") == {"ai-lab/inference": Role.MEMBER, "ai-lab/training": Role.TEAM_ADMIN}
    directory.remove_member("tessera-staff", "cy")
    assert sign_in("cy") == 302
    assert not django_user_model.objects.get(username="cy").is_staff


def test_a_wrong_directory_password_is_locked_out_as_a_local_one_is(directory, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert sign_in("ada", "wrong") == 200
    assert sign_in("ada", "wrong") == 429
    assert sign_in("ada") == 429, "even the right password, until the cool-off ends"
    assert sign_in("nobody-here", "x") == 200, "an unknown name is refused like a wrong password"


def test_the_api_token_login_takes_the_directory_password_and_the_token_reads_the_teams_jobs(directory):
    client = Client()
    response = client.post(
        "/api/v1/auth/token/", {"username": "ben", "password": "ben-pw"}, content_type="application/json"
    )
    assert response.status_code == 201, response.content
    token = response.json()["token"]
    jobs = client.get("/api/v1/jobs/", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert jobs.status_code == 200
    assert roles("ben") == {"ai-lab/training": Role.MEMBER}


def test_a_direct_bind_through_a_dn_template_and_starttls_with_the_sites_ca(directory):
    directory.configure(
        TESSERA_LDAP_BIND_DN="",
        TESSERA_LDAP_BIND_PASSWORD="",
        TESSERA_LDAP_USER_SEARCH_BASE="",
        TESSERA_LDAP_USER_DN_TEMPLATE=f"uid=%(user)s,{PEOPLE}",
        TESSERA_LDAP_START_TLS="true",
        TESSERA_LDAP_CA_FILE=str(directory.ca_file),
    )
    assert sign_in("ada") == 302 and roles("ada") == {"ai-lab/training": Role.TEAM_ADMIN}
    # A server whose certificate the configured CA did not sign is refused: no sign-in in the clear instead.
    directory.configure(
        TESSERA_LDAP_BIND_DN="",
        TESSERA_LDAP_BIND_PASSWORD="",
        TESSERA_LDAP_USER_SEARCH_BASE="",
        TESSERA_LDAP_USER_DN_TEMPLATE=f"uid=%(user)s,{PEOPLE}",
        TESSERA_LDAP_START_TLS="true",
        TESSERA_LDAP_CA_FILE=str(directory.other_ca_file),
    )
    assert sign_in("ben") == 200
    assert not Membership.objects.filter(user__username="ben").exists()


def test_local_accounts_can_be_limited_to_break_glass_superusers(directory, settings, alice, admin_user):
    assert sign_in("alice") == 302
    settings.LOCAL_SIGN_IN = "superusers"
    assert sign_in("alice") == 200, "a local researcher signs in through the directory now"
    assert sign_in("admin") == 302, "the break-glass admin still can"
    assert sign_in("ada") == 302
