"""The LDAP sign-in backend (django-auth-ldap, configured by quotas/ldap_settings.py): after the directory accepts
the password, the user's teams, staff flag and Unix account are brought to what it says (quotas/directory.py)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django_auth_ldap.backend import LDAPBackend

from quotas.choices import DirectorySource
from quotas.directory import DirectoryUser, directory_sign_in, group_names


class DirectoryLDAPBackend(LDAPBackend):
    def authenticate_ldap_user(self, ldap_user: Any, password: str) -> Any:
        user = super().authenticate_ldap_user(ldap_user, password)
        if user is None:
            return None
        groups = ldap_user.group_names if self.settings.GROUP_SEARCH is not None else ()
        account = ldap_user.attrs.get(settings.TESSERA_LDAP_UNIX_ACCOUNT_ATTR.lower(), [""])[0]
        directory_sign_in(
            user=user,
            directory=DirectoryUser(
                source=DirectorySource.LDAP,
                subject=ldap_user.dn,
                groups=group_names(groups),
                unix_account=account,
            ),
        )
        return user
