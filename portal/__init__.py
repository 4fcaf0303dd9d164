"""Tessera's portal: settings, ASGI entry point and URLs.

Nothing is imported here: `tessera` (the CLI, `cli/`) reads `portal.submit_flags` and loads neither Django nor
Celery. Django processes load the Celery app when the portal app is ready (portal.apps); `celery -A portal`
finds `portal.celery` by itself.
"""
