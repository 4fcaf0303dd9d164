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


class Network(models.TextChoices):
    """What a job in an image may reach (agent/containers.py), strictest first: a team's and its priority class's
    setting, the stricter wins."""

    NONE = "none", "None (loopback only)"
    CLUSTER = "cluster", "The cluster (the host's network; the site's firewall keeps it inside)"
    OPEN = "open", "Open (the host's network)"


NETWORK_ORDER = (Network.NONE, Network.CLUSTER, Network.OPEN)


def network_strictest(*settings: str) -> str:
    """The strictest of the given settings (blank ones say nothing); open when none says anything."""
    given = [s for s in settings if s]
    return min(given, key=NETWORK_ORDER.index) if given else Network.OPEN
