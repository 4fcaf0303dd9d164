"""Real directory servers for the sign-in tests: OpenLDAP (Debian's `slapd`, on a free loopback port with a
configuration and a database of its own: nothing of the machine's own slapd is read or changed; StartTLS with a
certificate made for the run; seeded with people and groups), and an OpenID Connect provider
(django-oauth-toolkit in a process of its own, tests/oidc_provider/)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support import free_port, wait_for

SLAPD = shutil.which("slapd") or "/usr/sbin/slapd"
SCHEMAS = ("core", "cosine", "nis", "inetorgperson")
SUFFIX = "dc=example,dc=org"
ROOT_DN = f"cn=admin,{SUFFIX}"
ROOT_PW = "slapd-root-pw"
SERVICE_DN = f"cn=tessera,ou=services,{SUFFIX}"
SERVICE_PW = "tessera-service-pw"
PEOPLE = f"ou=people,{SUFFIX}"
GROUPS = f"ou=groups,{SUFFIX}"

# uid, given name, surname, uidNumber: each signs in with the password "<uid>-pw".
PERSONS = (("ada", "Ada", "Lovelace", 20001), ("ben", "Ben", "Okafor", 20002), ("cy", "Cy", "Tanaka", 20003))
MEMBERS = {
    "gpu-training": ("ada", "ben"),
    "gpu-training-admins": ("ada", "cy"),  # groupOfNames needs a member: cy stays when ada leaves
    "gpu-inference": ("cy",),
    "tessera-staff": ("cy", "ben"),
}


def slapd_missing() -> str | None:
    """Why the directory tests cannot run here (None: they can)."""
    if not Path(SLAPD).exists():
        return "OpenLDAP's slapd is not installed (Debian: apt-get install slapd; .ci/run installs it)"
    try:
        import django_auth_ldap  # noqa: F401
        import ldap  # noqa: F401
    except ImportError:
        return "django-auth-ldap is not installed (pip install -e '.[ldap]'; it builds with libldap2-dev)"
    missing = [s for s in SCHEMAS if not Path(f"/etc/ldap/schema/{s}.schema").exists()]
    return f"slapd's schemas {missing} are missing under /etc/ldap/schema" if missing else None


def _while_running(process: subprocess.Popen, log: Path, probe):
    """`probe` for wait_for, failing at once with the server's log if the server has exited."""

    def attempt():
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with {process.returncode}: {log.read_text()}")
        return probe()

    return attempt


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def person_dn(uid: str) -> str:
    return f"uid={uid},{PEOPLE}"


def group_dn(name: str) -> str:
    return f"cn={name},{GROUPS}"


@dataclass
class Slapd:
    uri: str
    ca_file: Path
    other_ca_file: Path  # a CA that did not sign the server's certificate
    process: subprocess.Popen

    def connection(self):
        import ldap

        conn = ldap.initialize(self.uri)
        conn.simple_bind_s(ROOT_DN, ROOT_PW)
        return conn

    def remove_member(self, group: str, uid: str) -> None:
        import ldap

        self.connection().modify_s(group_dn(group), [(ldap.MOD_DELETE, "member", [person_dn(uid).encode()])])

    def reset_groups(self) -> None:
        """Every group's members as seeded (a test that changed them leaves the next one the same directory)."""
        import ldap

        conn = self.connection()
        for name, members in MEMBERS.items():
            conn.modify_s(
                group_dn(name), [(ldap.MOD_REPLACE, "member", [person_dn(m).encode() for m in members])]
            )


def _certificate(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


def _config(directory: Path, cert: Path, key: Path) -> Path:
    lines = [f"include /etc/ldap/schema/{s}.schema" for s in SCHEMAS]
    lines += [
        f"pidfile {directory}/slapd.pid",
        f"argsfile {directory}/slapd.args",
        "modulepath /usr/lib/ldap",
        "moduleload back_mdb",
        f"TLSCertificateFile {cert}",
        f"TLSCertificateKeyFile {key}",
        "database mdb",
        "maxsize 16777216",
        f'suffix "{SUFFIX}"',
        f'rootdn "{ROOT_DN}"',
        f"rootpw {ROOT_PW}",
        f"directory {directory}/db",
        # Passwords are for binding only; the service account and signed-in people read the rest.
        "access to attrs=userPassword by anonymous auth by self write by * none",
        "access to * by users read by anonymous auth",
    ]
    path = directory / "slapd.conf"
    path.write_text("\n".join(lines) + "\n")
    (directory / "db").mkdir()
    return path


def _entries() -> list[tuple[str, dict[str, list[bytes]]]]:
    def attrs(**values) -> dict[str, list[bytes]]:
        return {
            k: [v.encode() for v in (vs if isinstance(vs, list | tuple) else [vs])]
            for k, vs in values.items()
        }

    out = [
        (SUFFIX, attrs(objectClass=["dcObject", "organization"], dc="example", o="Example Lab")),
        (PEOPLE, attrs(objectClass="organizationalUnit", ou="people")),
        (GROUPS, attrs(objectClass="organizationalUnit", ou="groups")),
        (f"ou=services,{SUFFIX}", attrs(objectClass="organizationalUnit", ou="services")),
        (
            SERVICE_DN,
            attrs(
                objectClass=["organizationalRole", "simpleSecurityObject"],
                cn="tessera",
                userPassword=SERVICE_PW,
            ),
        ),
    ]
    for uid, given, surname, number in PERSONS:
        out.append(
            (
                person_dn(uid),
                attrs(
                    objectClass=["inetOrgPerson", "posixAccount"],
                    uid=uid,
                    cn=f"{given} {surname}",
                    givenName=given,
                    sn=surname,
                    mail=f"{uid}@example.org",
                    uidNumber=str(number),
                    gidNumber=str(number),
                    homeDirectory=f"/home/{uid}",
                    userPassword=f"{uid}-pw",
                ),
            )
        )
    for name, members in MEMBERS.items():
        out.append(
            (
                group_dn(name),
                attrs(objectClass="groupOfNames", cn=name, member=[person_dn(m) for m in members]),
            )
        )
    return out


def slapd_run(directory: Path, *, deadline_s: float = 20.0) -> Iterator[Slapd]:
    """Start slapd in `directory`, seed it, yield it, stop it (a generator for a fixture)."""
    import ldap
    import ldap.modlist

    cert, key = _certificate(directory, "server")
    other_ca, _ = _certificate(directory, "other")
    config = _config(directory, cert, key)
    uri = f"ldap://127.0.0.1:{free_port()}"
    log = open(directory / "slapd.log", "wb")  # noqa: SIM115 - closed after the server stops
    process = subprocess.Popen([SLAPD, "-f", str(config), "-h", f"{uri}/", "-d", "0"], stdout=log, stderr=log)
    server = Slapd(uri=uri, ca_file=cert, other_ca_file=other_ca, process=process)
    try:

        def connected():
            try:
                return server.connection()
            except ldap.SERVER_DOWN:
                return None

        conn = wait_for(
            f"slapd on {uri}",
            _while_running(process, directory / "slapd.log", connected),
            timeout_s=deadline_s,
        )
        for dn, entry in _entries():
            conn.add_s(dn, ldap.modlist.addModlist(entry))
        yield server
    finally:
        _stop(process)
        log.close()


@dataclass
class OidcProvider:
    url: str
    config: dict  # its discovery document
    db: Path
    process: subprocess.Popen

    def leave_group(self, username: str, group: str) -> None:
        """Take the person out of a group, as the provider's admin would (in its database)."""
        import sqlite3

        with sqlite3.connect(self.db) as conn:
            conn.execute(
                "DELETE FROM auth_user_groups WHERE user_id = (SELECT id FROM auth_user WHERE username = ?)"
                " AND group_id = (SELECT id FROM auth_group WHERE name = ?)",
                (username, group),
            )

    def join_group(self, username: str, group: str) -> None:
        import sqlite3

        with sqlite3.connect(self.db) as conn:
            conn.execute(
                "INSERT OR IGNORE INTO auth_user_groups (user_id, group_id) SELECT u.id, g.id FROM auth_user u,"
                " auth_group g WHERE u.username = ? AND g.name = ?",
                (username, group),
            )

    def sign_in(self, session, response, username: str):
        """Sign in on the provider's login form that `response` shows; the response after it (redirects followed)."""
        import html
        import re

        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.text).group(1)
        next_url = html.unescape(re.search(r'name="next" value="([^"]*)"', response.text).group(1))
        return session.post(
            response.url,
            data={
                "csrfmiddlewaretoken": token,
                "username": username,
                "password": f"{username}-pw",
                "next": next_url,
            },
            headers={"Referer": response.url},
            timeout=30,
        )

    def approve_device(self, username: str, user_code: str) -> None:
        """What the person does in a browser for `tessera login --sso`: sign in, enter the code, accept."""
        import re

        import requests

        session = requests.Session()
        page = self.sign_in(session, session.get(f"{self.url}/o/device/", timeout=30), username)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        confirm = session.post(
            page.url,
            data={"csrfmiddlewaretoken": token, "user_code": user_code},
            headers={"Referer": page.url},
            timeout=30,
        )
        assert confirm.status_code == 200 and "device-confirm" in confirm.url, (
            confirm.status_code,
            confirm.url,
        )
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', confirm.text).group(1)
        done = session.post(
            confirm.url,
            data={"csrfmiddlewaretoken": token, "action": "accept"},
            headers={"Referer": confirm.url},
            timeout=30,
        )
        assert done.status_code == 200, done.status_code


def oidc_provider_missing() -> str | None:
    """Why the OpenID Connect tests cannot run here (None: they can)."""
    try:
        import mozilla_django_oidc  # noqa: F401
        import oauth2_provider  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed (make install: the dev extra has django-oauth-toolkit)"
    return None


def oidc_provider_run(
    directory: Path, *, redirect_uri: str, deadline_s: float = 60.0
) -> Iterator[OidcProvider]:
    """Start the test provider (tests/oidc_provider/) in `directory`, yield it, stop it (a generator for a fixture)."""
    import os
    import sys

    import requests

    key = directory / "provider.key"
    subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    db = directory / "provider.sqlite3"
    env = {**os.environ, "OIDC_PROVIDER_DB": str(db), "OIDC_PROVIDER_KEY": str(key), "OIDC_PROVIDER_URL": url}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    log = open(directory / "provider.log", "wb")  # noqa: SIM115 - closed after the server stops
    root = Path(__file__).resolve().parents[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.oidc_provider.serve", str(port), redirect_uri],
        cwd=root,
        env=env,
        stdout=log,
        stderr=log,
    )
    try:

        def discovered():
            try:
                answer = requests.get(f"{url}/o/.well-known/openid-configuration", timeout=5)
            except requests.ConnectionError:
                return None
            return answer if answer.status_code == 200 else None

        answer = wait_for(
            f"the provider on {url}",
            _while_running(process, directory / "provider.log", discovered),
            timeout_s=deadline_s,
        )
        config = answer.json()
        # django-oauth-toolkit's discovery document does not list these (Keycloak's and Okta's do).
        config.setdefault("device_authorization_endpoint", f"{url}/o/device-authorization/")
        config.setdefault("introspection_endpoint", f"{url}/o/introspect/")
        yield OidcProvider(url=url, config=config, db=db, process=process)
    finally:
        _stop(process)
        log.close()
