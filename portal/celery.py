"""The Celery application; configuration comes from Django settings (CELERY_* names)."""

import os

from celery import Celery
from celery.signals import before_task_publish

from portal.health import beat_note_publish

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("tessera")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Beat's healthcheck reads when it last sent its periodic cycle request (portal.health).
before_task_publish.connect(beat_note_publish, weak=False)
