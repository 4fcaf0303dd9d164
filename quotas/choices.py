"""Enumerations of the quotas app."""

from django.db import models


class Role(models.TextChoices):
    MEMBER = "member", "Member"
    TEAM_ADMIN = "team_admin", "Team admin"


class ChangeSource(models.TextChoices):
    ADMIN = "admin", "Admin site"
    API = "api", "API"
    PORTAL = "portal", "Portal"
    SYSTEM = "system", "System"


class DirectorySource(models.TextChoices):
    LDAP = "ldap", "LDAP"
    OIDC = "oidc", "OpenID Connect"
