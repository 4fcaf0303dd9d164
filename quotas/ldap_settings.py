"""The django-auth-ldap settings (AUTH_LDAP_*) from Tessera's environment variables, read by portal/settings.py
when TESSERA_LDAP_URI is set. docs/operations.md, "Sign-in", lists the variables with a worked example.

A user is found by a search (TESSERA_LDAP_USER_SEARCH_BASE and _FILTER, as the service account or anonymously)
or by a DN template (TESSERA_LDAP_USER_DN_TEMPLATE, a direct bind); groups are searched under
TESSERA_LDAP_GROUP_SEARCH_BASE, as groupOfNames (member DNs), groupOfUniqueNames or posixGroup (memberUid)."""

from __future__ import annotations

from typing import Any

GROUP_TYPES = ("groupOfNames", "groupOfUniqueNames", "posixGroup")


def ldap_settings(env: Any) -> dict[str, Any]:
    """AUTH_LDAP_* for django-auth-ldap, and TESSERA_LDAP_UNIX_ACCOUNT_ATTR."""
    from django.core.exceptions import ImproperlyConfigured

    try:
        import ldap
        from django_auth_ldap.config import (
            GroupOfNamesType,
            GroupOfUniqueNamesType,
            LDAPSearch,
            PosixGroupType,
        )
    except ImportError as exc:  # pragma: no cover - the message is the point
        raise ImproperlyConfigured(
            "TESSERA_LDAP_URI is set but django-auth-ldap is not installed: pip install 'tessera[ldap]' "
            "(python-ldap builds against Debian's libldap2-dev and libsasl2-dev)"
        ) from exc

    out: dict[str, Any] = {
        "AUTH_LDAP_SERVER_URI": env.str("TESSERA_LDAP_URI"),
        "AUTH_LDAP_BIND_DN": env.str("TESSERA_LDAP_BIND_DN", default=""),
        "AUTH_LDAP_BIND_PASSWORD": env.str("TESSERA_LDAP_BIND_PASSWORD", default=""),
        "AUTH_LDAP_START_TLS": env.bool("TESSERA_LDAP_START_TLS", default=False),
        "AUTH_LDAP_USER_ATTR_MAP": {"first_name": "givenName", "last_name": "sn", "email": "mail"},
        # Names, staff status and groups are read again at every sign-in: the directory is the truth.
        "AUTH_LDAP_ALWAYS_UPDATE_USER": True,
        "AUTH_LDAP_MIRROR_GROUPS": False,
        "AUTH_LDAP_FIND_GROUP_PERMS": False,
        "AUTH_LDAP_CACHE_TIMEOUT": 0,
        "TESSERA_LDAP_UNIX_ACCOUNT_ATTR": env.str("TESSERA_LDAP_UNIX_ACCOUNT_ATTR", default="uid"),
    }
    # Per connection, not process-wide (django-auth-ldap sets global options once per process): the CA a
    # connection trusts is the one configured, and a new TLS context (NEWCTX, last) takes it.
    timeout_s = env.float("TESSERA_LDAP_TIMEOUT_S", default=5.0)
    options: dict[Any, Any] = {ldap.OPT_NETWORK_TIMEOUT: timeout_s, ldap.OPT_TIMEOUT: timeout_s}
    ca_file = env.str("TESSERA_LDAP_CA_FILE", default="")
    if ca_file:
        options[ldap.OPT_X_TLS_REQUIRE_CERT] = ldap.OPT_X_TLS_DEMAND
        options[ldap.OPT_X_TLS_CACERTFILE] = ca_file
        options[ldap.OPT_X_TLS_NEWCTX] = 0
    out["AUTH_LDAP_CONNECTION_OPTIONS"] = options

    template = env.str("TESSERA_LDAP_USER_DN_TEMPLATE", default="")
    base = env.str("TESSERA_LDAP_USER_SEARCH_BASE", default="")
    # With no service account, the person's own bind reads their entry and groups (anonymous reads are commonly
    # refused); with one, the service account reads them.
    out["AUTH_LDAP_BIND_AS_AUTHENTICATING_USER"] = not out["AUTH_LDAP_BIND_DN"]
    if template:
        out["AUTH_LDAP_USER_DN_TEMPLATE"] = template
    elif base:
        out["AUTH_LDAP_USER_SEARCH"] = LDAPSearch(
            base, ldap.SCOPE_SUBTREE, env.str("TESSERA_LDAP_USER_FILTER", default="(uid=%(user)s)")
        )
    else:
        raise ImproperlyConfigured(
            "TESSERA_LDAP_URI is set: set TESSERA_LDAP_USER_SEARCH_BASE (a search for the user) or "
            "TESSERA_LDAP_USER_DN_TEMPLATE (e.g. uid=%(user)s,ou=people,dc=example,dc=org)"
        )

    group_base = env.str("TESSERA_LDAP_GROUP_SEARCH_BASE", default="")
    if group_base:
        kind = env.str("TESSERA_LDAP_GROUP_TYPE", default="groupOfNames")
        types = {
            "groupOfNames": GroupOfNamesType,
            "groupOfUniqueNames": GroupOfUniqueNamesType,
            "posixGroup": PosixGroupType,
        }
        if kind not in types:
            raise ImproperlyConfigured(
                f"TESSERA_LDAP_GROUP_TYPE must be one of {', '.join(GROUP_TYPES)} (got {kind!r})"
            )
        out["AUTH_LDAP_GROUP_SEARCH"] = LDAPSearch(group_base, ldap.SCOPE_SUBTREE, f"(objectClass={kind})")
        out["AUTH_LDAP_GROUP_TYPE"] = types[kind](name_attr="cn")
    return out
