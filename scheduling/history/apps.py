from django.apps import AppConfig


class HistoryConfig(AppConfig):
    name = "scheduling.history"
    label = "history"
    verbose_name = "History"
