"""The Celery application; configuration comes from Django settings (CELERY_* names)."""

import os

from celery import Celery
from celery.signals import before_task_publish, setup_logging, worker_process_init

from portal.heap import startup_heap_freeze
from scheduling.coordination import beat_note_publish

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("tessera")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@setup_logging.connect(weak=False)
def _portal_logging(**_) -> None:
    """The worker and beat log as the portal does (settings.LOGGING: format, LOG_LEVEL, LOG_FORMAT). Connected,
    this receiver replaces Celery's own setup, which would take over the root logger with its format."""
    import logging.config

    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)


# Beat's healthcheck (portal.health) reads when it last sent its periodic cycle request.
before_task_publish.connect(beat_note_publish, weak=False)


@worker_process_init.connect(weak=False)
def _freeze_startup_heap(**_) -> None:
    """Each worker child, once forked, keeps the heap it inherited out of full collections (portal/heap.py)."""
    startup_heap_freeze()
