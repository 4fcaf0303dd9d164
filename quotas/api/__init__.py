"""The quotas app's REST API: teams, priority classes, personal tokens, whoami."""
