from django.apps import AppConfig


class PortalConfig(AppConfig):
    """The project itself. Once Django is set up, every process (web, worker, beat, the demo, a shell) has the
    Celery app configured from the settings and every app's tasks registered with it, so a writer can queue a
    task by name (scheduling.cycle.requests) without importing the code the task runs."""

    name = "portal"
    verbose_name = "Portal"

    def ready(self) -> None:
        from portal import checks  # noqa: F401  (registers the deploy checks)
        from portal.celery import app

        app.autodiscover_tasks(force=True)
