"""Jobs, the queue and usage. Tenant scoping is in get_queryset; writes go through services.

Visibility: staff see everything; everyone else sees their teams' jobs in full and other teams' work only as
anonymous queue entries.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Prefetch
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api_errors import ApiError
from portal.api_params import MOMENT_HELP, MOMENT_SCHEMA, TEXT_SCHEMA, int_param, moment_param, query_value
from portal.api_support import CsvRenderer, SubmitRateThrottle
from portal.parsers import SafeJSONParser
from quotas.models import Team
from quotas.selectors import idempotency_record_for, team_by_slug, team_slugs_for_user
from quotas.services import idempotency_record_create
from scheduling.agents import joblogs
from scheduling.errors import ServiceError
from scheduling.jobs.api import serializers as s
from scheduling.jobs.api import spec_schema  # noqa: F401 - registers the submit body's schema
from scheduling.jobs.api.filtersets import JobFilterSet, QueueFilterSet
from scheduling.jobs.array_indexes import ARRAY_SYNTAX, ArrayError, ArrayTooLarge, TaskIndexes
from scheduling.jobs.array_tasks import array_cancel, job_cancel_as_listed
from scheduling.jobs.chargeback import MAX_WINDOW, usage_rows
from scheduling.jobs.documents import MAX_DEPTH, MAX_SPEC_BYTES, MAX_VALUES
from scheduling.jobs.fields import OUT_OF_RANGE
from scheduling.jobs.models import Job, Slice
from scheduling.jobs.selectors import (
    array_lines,
    can_cancel_job,
    job_logs_complete,
    jobs_visible_to,
    queue,
    queue_entries,
)
from scheduling.jobs.sessions import session_share
from scheduling.jobs.spec import SpecError, spec_check_card_limits, spec_from_mapping, spec_from_text
from scheduling.jobs.states import ACTIVE_STATES
from scheduling.jobs.submit import job_submit
from scheduling.realtime import listeners

MAX_IDEMPOTENCY_KEY_CHARS = 200


USAGE_MEASURES = ("gpu_hours", "gpu_memory_gib_hours", "jobs")  # after the group columns
# What the usage API groups by (the model: of the cards held), and by default.
USAGE_GROUPS = ("team", "user", "day", "model")
USAGE_DEFAULT_GROUPS = "team,user,day"
# Every way to write group_by: one to four of USAGE_GROUPS, each at most once, in any order.
USAGE_GROUPINGS = [",".join(p) for n in (1, 2, 3, 4) for p in itertools.permutations(USAGE_GROUPS, n)]


MAX_LOG_TAIL_LINES = 10_000


class SpecJSONParser(SafeJSONParser):
    """A job spec posted as JSON: the spec's own bounds (scheduling.jobs.documents) apply before it is decoded."""

    max_body_bytes = MAX_SPEC_BYTES
    body_field = "spec"
    max_depth = MAX_DEPTH
    max_values = MAX_VALUES


@dataclass(frozen=True)
class YamlDocument:
    """A YAML body, unread: its own type, so no JSON body can pass for one."""

    raw: bytes


class YamlParser(BaseParser):
    """Job specs posted as YAML (`Content-Type: application/yaml`); parsed by scheduling.jobs.spec."""

    media_type = "application/yaml"
    max_body_bytes = MAX_SPEC_BYTES  # a longer body is refused before it is read (portal.parsers)
    body_field = "spec"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        # One byte past the limit is enough for the spec reader to refuse it; the rest is never read.
        return YamlDocument(stream.read(MAX_SPEC_BYTES + 1) if stream is not None else b"")


def _resolve_team(*, user: Any, slug: str | None) -> Team:
    """The team a submit goes to. An unknown team reads like one you are not in, so slugs cannot be probed."""
    if slug is None:
        slugs = team_slugs_for_user(user=user, limit=21)
        if len(slugs) != 1:
            several = ", ".join(sorted(slugs[:20])) + (", ..." if len(slugs) > 20 else "")
            raise SpecError(
                f"Name the team: you belong to several ({several})."
                if slugs
                else "Name the team: you belong to none.",
                field="team",
            )
        slug = slugs[0]
    team = team_by_slug(slug=slug)
    if team is None:
        if user.is_staff:
            raise SpecError(f"Unknown team {slug!r}.", field="team")
        raise ServiceError(f"You are not a member of team {slug}.", field="team", code="not_member")
    return team


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Submit jobs from a spec, list and filter them, see one in detail, cancel, read its events and logs."""

    filterset_class = JobFilterSet
    parser_classes = [SpecJSONParser, YamlParser]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no user
            return Job.objects.none()
        jobs = jobs_visible_to(user=self.request.user).order_by("-submitted_at", "-id")
        if self.action == "list" and "array" not in self.request.query_params:
            jobs = array_lines(jobs)  # an array is one line; ?array=<id> lists its tasks
        if self.action == "retrieve":
            jobs = jobs.prefetch_related(
                Prefetch("slices", queryset=Slice.objects.select_related("gpu__node", "gpu__model"))
            )
        return jobs

    def get_serializer_class(self):
        if self.action == "retrieve":
            return s.JobDetailSerializer
        if self.action == "create":
            return s.JobSubmitSerializer
        if self.action == "events":
            return s.JobEventSerializer
        return s.JobSerializer

    def get_throttles(self):
        if self.action == "create":
            return [SubmitRateThrottle()]
        return super().get_throttles()

    @extend_schema(
        request={"application/json": s.JobSubmitSerializer, "application/yaml": s.JobSubmitSerializer},
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY_CHARS},
                OpenApiParameter.HEADER,
                description="Retries with the same key get the first response; another body gets 409.",
            )
        ],
        responses={201: s.JobSerializer},
    )
    def create(self, request: Request) -> Response:
        key = request.headers.get("Idempotency-Key")
        if key is not None and not (0 < len(key) <= MAX_IDEMPOTENCY_KEY_CHARS):
            raise ApiError(
                f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters.",
                field="Idempotency-Key",
                limit=MAX_IDEMPOTENCY_KEY_CHARS,
            )
        if key is None:
            return self._submit(request)
        request_hash = hashlib.sha256(
            request.method.encode() + request.path.encode() + request.body
        ).hexdigest()
        replay = self._replay(request.user, key, request_hash)
        if replay is not None:
            return replay
        try:
            with transaction.atomic():
                response = self._submit(request)
                idempotency_record_create(
                    user=request.user,
                    key=key,
                    request_hash=request_hash,
                    response_status=response.status_code,
                    response_body=response.data,
                )
        except IntegrityError:
            # A concurrent retry with the same key won; our job was rolled back with the record.
            replay = self._replay(request.user, key, request_hash)
            if replay is None:
                raise
            return replay
        return response

    def _replay(self, user: Any, key: str, request_hash: str) -> Response | None:
        record = idempotency_record_for(user=user, key=key)
        if record is None:
            return None
        if record.request_hash != request_hash:
            raise ApiError(
                "This Idempotency-Key was used with a different request; use a new key.",
                code="idempotency_conflict",
                field="Idempotency-Key",
                status_code=status.HTTP_409_CONFLICT,
            )
        return Response(
            record.response_body, status=record.response_status, headers={"Idempotent-Replayed": "true"}
        )

    def _submit(self, request: Request) -> Response:
        data = request.data
        parsed = spec_from_text(data.raw) if isinstance(data, YamlDocument) else spec_from_mapping(data)
        team = _resolve_team(user=request.user, slug=parsed.team)
        try:
            job = job_submit(submitter=request.user, team=team, spec=parsed.spec)
        except ServiceError as exc:
            if exc.field == "gpu_memory":
                spec_check_card_limits(parsed.spec)  # the same refusal, with the card size as its limit
            raise
        return Response(s.job_payload(job), status=status.HTTP_201_CREATED)

    @extend_schema(request=s.JobCancelSerializer, responses={200: s.JobSerializer})
    # JSON only: a YAML body (the spec's other form) was read as no body at all, its `tasks` ignored, and the whole
    # array cancelled; now it is refused (415) and nothing is cancelled.
    @action(detail=True, methods=["post"], parser_classes=[SafeJSONParser])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Cancel a job: your own as a member, any of the team's as its admin, any as staff. An array's line
        cancels the whole array; `tasks` (e.g. `3-7`) cancels only those tasks of it."""
        job = self.get_object()
        if not can_cancel_job(user=request.user, job=job):
            raise ApiError(
                "Only the submitter, a team admin or staff may cancel this job.",
                code="permission_denied",
                status_code=status.HTTP_403_FORBIDDEN,
            )
        body = s.JobCancelSerializer(data=request.data if isinstance(request.data, dict) else {})
        body.is_valid(raise_exception=True)
        tasks = None
        if "tasks" in body.validated_data:
            most = settings.TESSERA_MAX_ARRAY_TASKS
            try:
                tasks = TaskIndexes.parse(body.validated_data["tasks"], max_tasks=most)
            except ArrayTooLarge as exc:
                raise ApiError(f"tasks {exc}.", code=OUT_OF_RANGE, field="tasks", limit=most) from None
            except ArrayError as exc:
                raise ApiError(f"tasks {exc}.", code=ARRAY_SYNTAX, field="tasks") from None
        if tasks is not None:
            array_cancel(job=job, actor=request.user, tasks=tasks)
            job = self.get_queryset().get(pk=job.array_job_id)
        else:
            job = job_cancel_as_listed(job=job, actor=request.user)
            job = self.get_queryset().get(pk=job.pk)
        return Response(s.JobSerializer(job, context={"request": request}).data)

    @extend_schema(request=s.JobShareSerializer, responses={200: s.JobSerializer})
    @action(detail=True, methods=["post"], parser_classes=[SafeJSONParser])
    def share(self, request: Request, pk: str | None = None) -> Response:
        """Let the job's team open its web ports too (`shared: true`), or only its submitter again (`false`).
        Only the submitter may."""
        job = self.get_object()
        body = s.JobShareSerializer(data=request.data if isinstance(request.data, dict) else {})
        body.is_valid(raise_exception=True)
        try:
            session_share(user=request.user, job_id=job.pk, shared=body.validated_data["shared"])
        except ServiceError as exc:
            if exc.code == "not_found":
                raise ApiError(
                    exc.message, code="permission_denied", status_code=status.HTTP_403_FORBIDDEN
                ) from None
            # A job serving no web ports has nothing to share: the job, not the request, is at odds (409).
            raise ApiError(
                exc.message, code=exc.code, field=exc.field, status_code=status.HTTP_409_CONFLICT
            ) from None
        return Response(
            s.JobSerializer(self.get_queryset().get(pk=job.pk), context={"request": request}).data
        )

    @extend_schema(responses={200: s.JobEventSerializer(many=True)})
    @action(detail=True, methods=["get"], filterset_class=None)
    def events(self, request: Request, pk: str | None = None) -> Response:
        """The job's audit trail, oldest first."""
        job = self.get_object()
        events = job.events.select_related("actor").order_by("at", "id")
        page = self.paginate_queryset(events)
        return self.get_paginated_response(s.JobEventSerializer(page, many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("stream", str, enum=list(joblogs.STREAMS), description="Default stdout."),
            OpenApiParameter(
                "tail",
                {"type": "integer", "minimum": 0, "maximum": MAX_LOG_TAIL_LINES},
                description=f"Last N lines (default 100, at most {MAX_LOG_TAIL_LINES}).",
            ),
            OpenApiParameter(
                "offset",
                {"type": "integer", "minimum": 0, "maximum": 2**62},
                description="Read from this byte offset instead of tailing.",
            ),
            OpenApiParameter(
                "limit_bytes",
                {"type": "integer", "minimum": 1, "maximum": joblogs.MAX_READ_BYTES},
                description=f"With offset: at most this many bytes ({joblogs.MAX_READ_BYTES}).",
            ),
            OpenApiParameter(
                "encoding",
                str,
                enum=list(s.LOG_ENCODINGS),
                description="`text` (default): the bytes as UTF-8 in `text`, invalid bytes replaced. `base64`: "
                "the exact bytes, base64 in `data`.",
            ),
        ],
        responses={200: s.JobLogSerializer},
    )
    @action(detail=True, methods=["get"], filterset_class=None, pagination_class=None)
    def logs(self, request: Request, pk: str | None = None) -> Response:
        """The job's output: the tail by default, or bytes from an offset (follow with next_offset)."""
        job = self.get_object()
        stream = query_value(request, "stream") or "stdout"
        if stream not in joblogs.STREAMS:
            raise ApiError(f"stream must be one of {', '.join(joblogs.STREAMS)}.", field="stream")
        encoding = query_value(request, "encoding") or "text"
        if encoding not in s.LOG_ENCODINGS:
            raise ApiError(
                f"encoding must be one of {', '.join(s.LOG_ENCODINGS)} (got {encoding[:40]!r}).",
                field="encoding",
            )
        # Each bound is checked whenever its parameter is given, as the schema states it, though `limit_bytes`
        # counts only with `offset` and `tail` only without.
        offset = int_param(request, "offset", low=0, high=2**62, default=None)
        limit = int_param(
            request, "limit_bytes", low=1, high=joblogs.MAX_READ_BYTES, default=joblogs.MAX_READ_BYTES
        )
        lines = int_param(request, "tail", low=0, high=MAX_LOG_TAIL_LINES, default=100)
        if job.state in ACTIVE_STATES:  # a reader following it: its agent is asked for new lines often
            listeners.log_reader_note(job_id=job.pk, user_id=request.user.pk)
        if offset is not None:
            data, size = joblogs.log_read(job_id=job.pk, stream=stream, offset=offset, limit_bytes=limit)
            start = min(offset, size)
        else:
            data, size = joblogs.log_tail(job_id=job.pk, stream=stream, lines=lines)
            start = size - len(data)
        body = {
            "job_id": job.pk,
            "stream": stream,
            "offset": start,
            "next_offset": start + len(data),
            "size": size,
            "encoding": encoding,
            "complete": job_logs_complete(job=job),
        }
        if encoding == "base64":
            body["data"] = base64.b64encode(data).decode("ascii")
        else:
            body["text"] = data.decode("utf-8", errors="replace")
        return Response(s.JobLogSerializer(body).data)


class QueueView(generics.GenericAPIView):
    """Pending jobs in the engine's order. Other teams' entries are anonymous: no id, name, user or reason text."""

    filterset_class = QueueFilterSet
    serializer_class = s.QueueEntrySerializer

    def get_queryset(self):
        return queue()

    @extend_schema(responses={200: s.QueueEntrySerializer(many=True)})
    def get(self, request: Request) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        entries = queue_entries(user=request.user, jobs=page)
        return self.get_paginated_response(s.QueueEntrySerializer(entries, many=True).data)


class UsageView(APIView):
    """GPU-hours in whole-GPU equivalents by team, user and/or day, as JSON or CSV (?format=csv).

    Members see their teams' usage; staff see everyone's.
    """

    renderer_classes = [JSONRenderer, CsvRenderer, BrowsableAPIRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "since", MOMENT_SCHEMA, description=f"Default 30 days before until. {MOMENT_HELP}"
            ),
            OpenApiParameter("until", MOMENT_SCHEMA, description=f"Exclusive; default now. {MOMENT_HELP}"),
            OpenApiParameter(
                "group_by",
                {"type": "string", "enum": USAGE_GROUPINGS},
                description="Comma list of team, user, day, model, each at most once (default team,user,day).",
            ),
            OpenApiParameter("team", TEXT_SCHEMA, description="Only this team (slug)."),
            OpenApiParameter("user", TEXT_SCHEMA, description="Only this user."),
            OpenApiParameter("format", str, enum=["json", "csv"]),
        ],
        responses={
            (200, "application/json"): s.UsageRowSerializer(many=True),
            (200, "text/csv"): OpenApiTypes.STR,
        },
    )
    def get(self, request: Request) -> Response:
        # An empty ?format= reaches here (DRF's negotiation answers a format it has no renderer for with 404).
        chosen = query_value(request, "format")
        if chosen is not None and chosen not in ("json", "csv"):
            raise ApiError(f"format must be json or csv (got {chosen!r}).", field="format")
        now = timezone.now()
        until = moment_param(request, "until") or now
        since = moment_param(request, "since") or until - timedelta(days=30)
        if since >= until:
            raise ApiError("since must be before until.", code="incompatible", field="since")
        if until - since > MAX_WINDOW:
            raise ApiError(
                f"The window may span at most {MAX_WINDOW.days} days.",
                code="out_of_range",
                field="since",
                limit=f"{MAX_WINDOW.days}d",
            )
        raw_groups = query_value(request, "group_by") or USAGE_DEFAULT_GROUPS
        if raw_groups not in USAGE_GROUPINGS:
            raise ApiError(
                f"group_by takes a comma list of {', '.join(USAGE_GROUPS)}, each at most once (got {raw_groups[:60]!r}).",
                field="group_by",
            )
        group_by = tuple(raw_groups.split(","))
        self.csv_columns = [g for g in USAGE_GROUPS if g in group_by] + list(USAGE_MEASURES)
        jobs = jobs_visible_to(user=request.user)
        if team := query_value(request, "team"):
            jobs = jobs.filter(team__slug=team)
        if user := query_value(request, "user"):
            jobs = jobs.filter(submitter__username=user)
        rows = usage_rows(jobs=jobs, since=since, until=min(until, now), group_by=group_by)
        data = s.UsageRowSerializer(rows, many=True).data
        headers = {}
        if getattr(request.accepted_renderer, "format", "") == "csv":
            headers["Content-Disposition"] = 'attachment; filename="tessera-usage.csv"'
        return Response(data, headers=headers)
