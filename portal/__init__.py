"""Tessera's portal: settings, ASGI entry point, URLs and the `tessera` command line."""

from portal.celery import app as celery_app

__all__ = ("celery_app",)
