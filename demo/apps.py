from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo's management commands; it has no models."""

    name = "demo"
    verbose_name = "Demo"
