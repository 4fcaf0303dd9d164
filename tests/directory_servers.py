"""A real OpenLDAP server for the sign-in tests: Debian's `slapd`, started on a free loopback port with a
configuration and a database of its own (nothing of the machine's own slapd is read or changed), StartTLS with a
certificate made for the run, and seeded with people and groups."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support import free_port

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
        until = time.monotonic() + deadline_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"slapd exited with {process.returncode}: {(directory / 'slapd.log').read_text()}"
                )
            try:
                conn = server.connection()
                break
            except ldap.SERVER_DOWN:
                if time.monotonic() > until:
                    raise RuntimeError(f"slapd did not answer on {uri} within {deadline_s} s") from None
                time.sleep(0.05)
        for dn, entry in _entries():
            conn.add_s(dn, ldap.modlist.addModlist(entry))
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
