"""Tessera's portal: settings, ASGI entry point, URLs and the `tessera` command line.

Nothing is imported here: `tessera` (the CLI) loads neither Django nor Celery. Django processes load the Celery
app when the portal app is ready (portal.apps); `celery -A portal` finds `portal.celery` by itself.
"""
