"""/api/v1/notifications/: the caller's notification defaults (GET, PUT)."""

from __future__ import annotations

from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api_requests import RequestSerializer
from portal.parsers import SafeJSONParser
from scheduling.notifications.models import ADMIN_EVENTS, JOB_EVENTS
from scheduling.notifications.services import MAX_EVENT_WORDS, notification_settings_save, settings_of
from scheduling.notifications.webhooks import WEBHOOK_URL_MAX, WEBHOOK_URL_PATTERN


class _Boolean(serializers.BooleanField):
    """true or false, and nothing else (DRF's BooleanField also takes 0, "yes", "on")."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class _Text(serializers.CharField):
    """Text only (DRF's CharField also takes 0 or true as "0", "True")."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class NotificationSettingsSerializer(RequestSerializer):
    job_events = serializers.ListField(
        child=serializers.ChoiceField(choices=JOB_EVENTS),
        max_length=MAX_EVENT_WORDS,
        help_text="Told of these for jobs that name none (a job's own `notify` wins).",
    )
    email = _Boolean(help_text="By email to the account's address.")
    webhook_url = _Text(
        allow_blank=True,
        max_length=WEBHOOK_URL_MAX,
        validators=[
            RegexValidator(
                f"^{WEBHOOK_URL_PATTERN}$",
                message="Must be an https URL naming its host (https://host/...), with no spaces.",
            )
        ],  # empty: allow_blank
        help_text="A Slack-compatible webhook, or empty for none: an https URL of a host on the public internet "
        "(plain http, and loopback, private, link-local or reserved addresses, only for hosts the site allows; "
        "else 400 `destination_not_allowed`). A redirect is not followed.",
    )
    admin_events = serializers.ListField(
        child=serializers.ChoiceField(choices=ADMIN_EVENTS),
        max_length=MAX_EVENT_WORDS,
        required=False,
        help_text="Staff only.",
    )


def _body(prefs) -> dict:
    return {
        "job_events": list(prefs.job_events or []),
        "email": prefs.email,
        "webhook_url": prefs.webhook_url,
        "admin_events": list(prefs.admin_events or []),
    }


class NotificationSettingsView(APIView):
    """How the caller is told of their jobs' starts, ends, failures and preemptions (and, for staff, of lost nodes
    and GPU XID errors)."""

    parser_classes = [SafeJSONParser]  # lists and an empty webhook read one way: JSON

    @extend_schema(responses=NotificationSettingsSerializer)
    def get(self, request: Request) -> Response:
        return Response(_body(settings_of(request.user)))

    @extend_schema(request=NotificationSettingsSerializer, responses=NotificationSettingsSerializer)
    def put(self, request: Request) -> Response:
        given = NotificationSettingsSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        data = given.validated_data
        prefs = notification_settings_save(  # a refusal (ServiceError) is the API's 400, naming the field
            user=request.user,
            job_events=data["job_events"],
            email=data["email"],
            webhook_url=data["webhook_url"],
            admin_events=data.get("admin_events") if request.user.is_staff else None,
        )
        return Response(_body(prefs))
