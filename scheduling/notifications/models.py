"""Who wants to hear of what (NotificationSettings), and each message owed to someone (Notification: an outbox
row written in the transaction that made the event, delivered after it commits, retried until it goes)."""

from django.conf import settings
from django.db import models
from django.db.models import Q

JOB_EVENTS = ("start", "end", "fail", "preempt")
ADMIN_EVENTS = ("node_lost", "gpu_xid")


def _default_admin_events() -> list[str]:
    return list(ADMIN_EVENTS)


class NotificationSettings(models.Model):
    """A user's defaults: the job events they are told of when a job names none (`notify`), how, and for staff
    which cluster events."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notify_settings"
    )
    job_events = models.JSONField(default=list, blank=True, help_text=f"Of {', '.join(JOB_EVENTS)}.")
    email = models.BooleanField("by email", default=True, help_text="By email, to the user's address.")
    webhook_url = models.URLField(
        "webhook URL", max_length=500, blank=True, help_text="A Slack-compatible incoming webhook."
    )
    admin_events = models.JSONField(
        default=_default_admin_events, blank=True, help_text=f"Staff only: of {', '.join(ADMIN_EVENTS)}."
    )

    class Meta:
        verbose_name = "notification settings"
        verbose_name_plural = "notification settings"

    def __str__(self) -> str:
        return f"{self.user} notifications"


class Notification(models.Model):
    EMAIL, WEBHOOK = "email", "webhook"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE)
    job = models.ForeignKey(
        "scheduling.Job", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    kind = models.CharField(max_length=20, help_text=f"{', '.join(JOB_EVENTS + ADMIN_EVENTS)}")
    channel = models.CharField(max_length=10, choices=[(EMAIL, "email"), (WEBHOOK, "webhook")])
    target = models.CharField(max_length=500, help_text="The email address or the webhook URL.")
    subject = models.CharField(max_length=200)
    body = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True, help_text="Given up after the last attempt.")
    last_error = models.CharField(max_length=300, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(sent_at__isnull=True, failed_at__isnull=True),
                name="notification_due",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} by {self.channel} to {self.target}"
