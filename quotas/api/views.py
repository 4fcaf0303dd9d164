"""Teams (mine), priority classes, personal tokens and whoami. Tenant scoping lives in get_queryset."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import authenticate
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, serializers, status, throttling, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api_errors import ApiError
from portal.api_params import IdFilter, StrictFilterSet, TextFilter
from portal.api_requests import RequestSerializer
from portal.api_support import ClientAddressThrottleMixin
from quotas.api.authentication import BearerTokenAuthentication
from quotas.api.serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    PriorityClassSerializer,
    QuotaChangeRequestSerializer,
    QuotaChangeSerializer,
    QuotaEditSerializer,
    QuotaImpactSerializer,
    QuotaSavedSerializer,
    TeamSerializer,
    UndoRequestSerializer,
    WhoamiSerializer,
)
from quotas.choices import ChangeSource
from quotas.errors import QuotaForbidden, QuotaRefused
from quotas.models import ApiToken, Membership, PriorityClass, Quota, QuotaChange, Team
from quotas.oidc import DirectoryOIDCBackend, cli_sso_enabled
from quotas.selectors import TeamAllowance, team_allowances, team_ids_for_user, team_visible_to
from quotas.services import (
    quota_change_check,
    quota_change_undo,
    quota_may_edit,
    quota_save,
)
from quotas.sign_out import user_sign_out_everywhere
from quotas.tokens import TokenLimitReached, api_token_create, api_token_revoke
from scheduling.cycle.quota_whatif import quota_impact
from scheduling.cycle.selectors import Borrowed, borrowed_by_team, fair_shares_gpus, queue_shares
from scheduling.cycle.snapshot import engine_quotas
from scheduling.inventory.models import GpuModel
from scheduling.jobs.usage import TeamAllocation, allocations_by_team

EDITABLE_FIELDS = (
    "guaranteed_gpus",
    "limit_gpus",
    "guaranteed_gpu_memory_mib",
    "limit_gpu_memory_mib",
    "fair_share_weight",
)


def _quota_dict(q: Quota) -> dict:
    return {
        "gpu_model": q.gpu_model.name if q.gpu_model_id else None,
        "guaranteed_gpus": float(q.guaranteed_gpus),
        "limit_gpus": float(q.limit_gpus) if q.limit_gpus is not None else None,
        "guaranteed_gpu_memory_mib": q.guaranteed_gpu_memory_mib,
        "limit_gpu_memory_mib": q.limit_gpu_memory_mib,
        "fair_share_weight": float(q.fair_share_weight),
        "default_priority_class": q.default_priority_class.name if q.default_priority_class_id else None,
    }


def _edited_row(team: Team, data: dict) -> Quota:
    """The team's row for `data["gpu_model"]` (a new one when it has none) with the given fields set."""
    model = None
    if data.get("gpu_model"):
        model = GpuModel.objects.filter(name=data["gpu_model"]).first()
        if model is None:
            raise ApiError(
                f"No GPU model {data['gpu_model']!r}.", code="unknown_gpu_model", field="gpu_model"
            )
    row = Quota.objects.filter(team=team, gpu_model=model).select_related("team", "gpu_model").first()
    row = row or Quota(team=team, gpu_model=model)
    for name in EDITABLE_FIELDS:
        if name in data:
            setattr(row, name, data[name])
    if "default_priority_class" in data:
        name = data["default_priority_class"]
        pc = PriorityClass.objects.filter(name=name).first() if name else None
        if name and pc is None:
            raise ApiError(
                f"No priority class {name!r}.", code="unknown_priority", field="default_priority_class"
            )
        row.default_priority_class = pc
    return row


def _refusal(exc: DjangoValidationError) -> ApiError:
    """A model's refusal (a limit below its guarantee) as the API says it: the field and the bound."""
    name, messages = next(iter(exc.message_dict.items()))
    return ApiError(messages[0], code="quota_rule", field=None if name == "__all__" else name)


def team_summary(
    *,
    team: Team,
    allocation: TeamAllocation,
    borrowed: Borrowed,
    allowance: TeamAllowance,
    fair_share_gpus: float | None,
    queue_share: dict[str, float] | None = None,
) -> dict:
    quotas = [
        {
            "gpu_model": q.gpu_model.name if q.gpu_model_id else None,
            "guaranteed_gpus": float(q.guaranteed_gpus),
            "limit_gpus": float(q.limit_gpus) if q.limit_gpus is not None else None,
            "guaranteed_gpu_memory_mib": q.guaranteed_gpu_memory_mib,
            "limit_gpu_memory_mib": q.limit_gpu_memory_mib,
            "fair_share_weight": float(q.fair_share_weight),
            "default_priority_class": q.default_priority_class.name if q.default_priority_class_id else None,
        }
        for q in team.quotas.all()
    ]
    priority_classes = [
        {
            "name": g.priority_class.name,
            "value": g.priority_class.value,
            "preemptible": g.priority_class.preemptible,
            "limit_gpus": float(g.limit_gpus) if g.limit_gpus is not None else None,
        }
        for g in allowance.classes
    ]
    return {
        "quotas": quotas,
        "priority_classes": priority_classes,
        "default_priority_class": allowance.default_class.name if allowance.default_class else None,
        "usage": {
            "gpus": round(allocation.gpus, 3),
            "gpu_memory_mib": allocation.gpu_memory_mib,
            "running_jobs": allocation.running_jobs,
            "pending_jobs": allocation.pending_jobs,
        },
        "borrowed": {
            "gpus": round(borrowed.gpus, 3),
            "gpu_memory_mib": borrowed.gpu_memory_mib,
        },
        "fair_share": {
            "gpus": round(fair_share_gpus, 3) if fair_share_gpus is not None else None,
            **(queue_share or {"held_share": 0.0, "usage_share": 0.0, "queue_share": 0.0}),
        },
    }


class TeamFilterSet(StrictFilterSet):
    """By slug, or by parent team id (an id with no team matches nothing; it is not an error)."""

    slug = TextFilter(help_text="Team slug.")
    parent = IdFilter(field_name="parent_id", help_text="The parent team's id.")

    class Meta:
        model = Team
        fields = ["slug", "parent"]


class TeamViewSet(viewsets.ReadOnlyModelViewSet):
    """The caller's teams (staff: all) with quota, the priority classes they may use, what they hold now, what they
    borrow and their fair share."""

    serializer_class = TeamSerializer
    filterset_class = TeamFilterSet

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no user
            return Team.objects.none()
        teams = Team.objects.select_related("parent").prefetch_related(
            "quotas__gpu_model", "quotas__default_priority_class"
        )
        if self.request.user.is_staff:
            return teams
        return teams.filter(memberships__user=self.request.user).distinct()

    def _with_summaries(self, teams: list[Team]) -> list[Team]:
        allocations = allocations_by_team()
        quotas = engine_quotas()
        shares = fair_shares_gpus()
        standing = queue_shares(allocations=allocations, quotas=quotas)
        borrowed = borrowed_by_team(allocations=allocations, quotas=quotas)
        allowances = team_allowances(team_ids=[team.pk for team in teams])
        for team in teams:
            team.summary = team_summary(
                team=team,
                allocation=allocations[team.pk],
                borrowed=borrowed[team.pk],
                allowance=allowances[team.pk],
                fair_share_gpus=shares.get(team.pk),
                queue_share=standing.get(team.pk),
            )
        return teams

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        if self.request and self.request.user.is_authenticated:
            context["roles"] = dict(
                Membership.objects.filter(user=self.request.user).values_list("team_id", "role")
            )
        return context

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        teams = self._with_summaries(list(page if page is not None else queryset))
        data = self.get_serializer(teams, many=True).data
        return self.get_paginated_response(data) if page is not None else Response(data)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        team = self._with_summaries([self.get_object()])[0]
        return Response(self.get_serializer(team).data)

    # -- quota changes: a team the caller may change (staff: any; a team admin: theirs and their organisation's) --

    def _quota_team(self, pk: str | None) -> Team:
        """The team a quota change or preview is about: 404 for a team the caller cannot see (as for every other
        team, its existence is not revealed), 403 for one they see but may not change."""
        team = Team.objects.filter(pk=int(pk)).first() if pk and pk.isdigit() else None
        user = self.request.user
        may_edit = team is not None and quota_may_edit(actor=user, team=team)
        if team is None or not (may_edit or team_visible_to(user=user, team=team)):
            raise NotFound("No such team.")
        if not may_edit:
            raise QuotaForbidden(f"Only staff and team admins of {team.slug} may change its quota.")
        return team

    @extend_schema(
        request=QuotaChangeRequestSerializer,
        responses={200: QuotaSavedSerializer},
        description="Change one of the team's quota rows (the all-models one, or `gpu_model`'s), through the same "
        "service as the portal and the admin site: staff any team; a team admin only lowers their own team's "
        "guarantees, limits and weight, and sets its default priority class (docs/api.md).",
    )
    @action(detail=True, methods=["patch"], url_path="quotas")
    def quotas(self, request: Request, pk: str | None = None) -> Response:
        team = self._quota_team(pk)
        incoming = QuotaChangeRequestSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        row = _edited_row(team, incoming.validated_data)
        try:
            change = quota_save(
                quota=row, actor=request.user, source=ChangeSource.API, note=incoming.validated_data["reason"]
            )
        except DjangoValidationError as exc:
            raise _refusal(exc) from None
        row = Quota.objects.select_related("gpu_model", "default_priority_class").get(pk=row.pk)
        return Response(QuotaSavedSerializer({"change": change, "quota": _quota_dict(row)}).data)

    @extend_schema(
        request=QuotaEditSerializer,
        responses={200: QuotaImpactSerializer},
        description="What the change would do, saving nothing: guarantees against capacity per GPU model, running "
        "jobs that would become (or stop being) borrowed, pending jobs that would start, work that would be "
        "reclaimed. Other teams' jobs are anonymous (job_id null) unless the caller is staff.",
    )
    @action(detail=True, methods=["post"], url_path="quota-preview")
    def quota_preview(self, request: Request, pk: str | None = None) -> Response:
        team = self._quota_team(pk)
        incoming = QuotaEditSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        row = _edited_row(team, incoming.validated_data)
        refused = None
        try:
            quota_change_check(quota=row, actor=request.user)
        except QuotaRefused as exc:
            refused = exc.message
        except DjangoValidationError as exc:
            raise _refusal(exc) from None
        impact = quota_impact(row=row)
        visible = None
        if not request.user.is_staff:
            ids = team_ids_for_user(user=request.user)
            visible = set(Team.objects.filter(pk__in=ids).values_list("slug", flat=True))

        def jobs(changes) -> list[dict]:
            return [
                {
                    "job_id": c.job_id if visible is None or c.team in visible else None,
                    "team": c.team,
                    "gpus": c.gpus,
                    "memory_mib": c.memory_mib,
                }
                for c in changes
            ]

        data = {
            "team": impact.team,
            "scope": impact.scope,
            "capacity": [
                {**line.__dict__, "over_committed": line.over_committed} for line in impact.capacity
            ],
            "before": impact.before.__dict__,
            "after": impact.after.__dict__,
            **{
                name: jobs(getattr(impact, name))
                for name in (
                    "becomes_borrowed",
                    "stops_borrowed",
                    "would_start",
                    "would_not_start",
                    "would_be_evicted",
                )
            },
            "refused": refused,
        }
        return Response(QuotaImpactSerializer(data).data)

    @extend_schema(responses={200: QuotaChangeSerializer(many=True)})
    @action(detail=True, methods=["get"], url_path="quota-changes")
    def quota_changes(self, request: Request, pk: str | None = None) -> Response:
        """The team's quota audit trail, newest first (members of the team, and staff)."""
        team = self.get_object()
        changes = QuotaChange.objects.filter(team=team).select_related("actor", "quota__gpu_model")
        page = self.paginate_queryset(changes)
        data = QuotaChangeSerializer(page if page is not None else changes, many=True).data
        return self.get_paginated_response(data) if page is not None else Response(data)

    @extend_schema(request=UndoRequestSerializer, responses={200: QuotaChangeSerializer})
    @action(detail=True, methods=["post"], url_path=r"quota-changes/(?P<change_id>[0-9]+)/undo")
    def undo_quota_change(self, request: Request, pk: str | None = None, change_id: str = "") -> Response:
        """Undo one change: its inverse through the same service, itself audited ("undo of change #N"); 409 when
        the quota changed since."""
        team = self._quota_team(pk)
        change = QuotaChange.objects.filter(team=team, pk=int(change_id)).first()
        if change is None:
            raise NotFound("No such change of this team's quota.")
        incoming = UndoRequestSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        try:
            undone = quota_change_undo(
                change=change,
                actor=request.user,
                reason=incoming.validated_data["reason"],
                source=ChangeSource.API,
            )
        except DjangoValidationError as exc:
            raise _refusal(exc) from None
        return Response(QuotaChangeSerializer(undone).data)


class PriorityClassViewSet(viewsets.ReadOnlyModelViewSet):
    """Priority classes, highest first. Everyone signed in may read them."""

    serializer_class = PriorityClassSerializer
    queryset = PriorityClass.objects.all()
    filterset_fields = ["name", "preemptible"]


class ApiTokenViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """The caller's personal tokens: create (the token is shown once), list, revoke (DELETE)."""

    serializer_class = ApiTokenSerializer
    filterset_fields = ["name"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        return ApiToken.objects.filter(user=self.request.user)

    @extend_schema(request=ApiTokenCreateSerializer, responses={201: ApiTokenCreatedSerializer})
    def create(self, request: Request) -> Response:
        incoming = ApiTokenCreateSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        try:
            row, token = api_token_create(user=request.user, name=incoming.validated_data["name"])
        except TokenLimitReached as exc:
            raise ApiError(str(exc), code="too_many_tokens", field="name") from None
        row.token = token
        return Response(ApiTokenCreatedSerializer(row).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: ApiTokenSerializer})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        token = api_token_revoke(token=self.get_object())
        return Response(ApiTokenSerializer(token).data)

    @extend_schema(request=None, responses={200: ApiTokenSerializer})
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        token = api_token_revoke(token=self.get_object())
        return Response(ApiTokenSerializer(token).data)


class WhoamiView(APIView):
    """Who the request is authenticated as, and their teams."""

    @extend_schema(responses={200: WhoamiSerializer})
    def get(self, request: Request) -> Response:
        memberships = (
            Membership.objects.filter(user=request.user).select_related("team").order_by("team__slug")
        )
        data = {
            "id": request.user.pk,
            "username": request.user.get_username(),
            "is_staff": request.user.is_staff,
            "auth": "token"
            if isinstance(request.successful_authenticator, BearerTokenAuthentication)
            else "session",
            "teams": [{"team": m.team.slug, "team_id": m.team_id, "role": m.role} for m in memberships],
        }
        return Response(WhoamiSerializer(data).data)


class LoginRateThrottle(ClientAddressThrottleMixin, throttling.SimpleRateThrottle):
    """Password guesses per client address (REST_FRAMEWORK.DEFAULT_THROTTLE_RATES['login'], else 20/min)."""

    scope = "login"

    def get_rate(self) -> str:
        return self.THROTTLE_RATES.get(self.scope) or "20/min"

    def get_cache_key(self, request: Request, view: Any) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class TokenLoginSerializer(RequestSerializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=1024, style={"input_type": "password"}, trim_whitespace=False)
    name = serializers.CharField(max_length=100, required=False, default="tessera CLI")


def _token_created(*, user: Any, name: str) -> Response:
    """A new personal token for a user who has just signed in (201, the token shown once)."""
    try:
        row, token = api_token_create(user=user, name=name)
    except TokenLimitReached as exc:
        raise ApiError(str(exc), code="too_many_tokens", field="name") from None
    row.token = token
    return Response(ApiTokenCreatedSerializer(row).data, status=status.HTTP_201_CREATED)


class TokenLoginView(APIView):
    """Exchange a username and password for a new personal token (what `tessera login` does).

    No session and no CSRF: the password is the credential. Throttled per client address.
    """

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]
    throttle_classes = [LoginRateThrottle]

    @extend_schema(request=TokenLoginSerializer, responses={201: ApiTokenCreatedSerializer})
    def post(self, request: Request) -> Response:
        incoming = TokenLoginSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        user = authenticate(
            # Django's own request, so the sign-in protection (django-axes) counts and locks out this caller
            # exactly as it does on the portal's form.
            request._request,
            username=incoming.validated_data["username"],
            password=incoming.validated_data["password"],
        )
        if user is None or not user.is_active:
            raise ApiError(
                "Wrong username or password.",
                code="authentication_failed",
                status_code=status.HTTP_401_UNAUTHORIZED,
            )
        return _token_created(user=user, name=incoming.validated_data["name"])


class SsoConfigSerializer(serializers.Serializer):
    provider = serializers.CharField(help_text="The provider's name, as the sign-in page shows it.")
    device_authorization_endpoint = serializers.CharField()
    token_endpoint = serializers.CharField()
    client_id = serializers.CharField(help_text="The CLI's client of the provider (a public one).")
    scope = serializers.CharField()


class SsoConfigView(APIView):
    """How `tessera login --sso` signs in: the provider's device flow for the CLI's client (404: no single sign-on
    here, or none for the CLI)."""

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]

    @extend_schema(responses={200: SsoConfigSerializer})
    def get(self, request: Request) -> Response:
        if not cli_sso_enabled():
            raise NotFound(
                "This portal has no single sign-on for the CLI; sign in with a username and password."
            )
        return Response(
            {
                "provider": settings.OIDC_PROVIDER_NAME,
                "device_authorization_endpoint": settings.TESSERA_OIDC_DEVICE_AUTHORIZATION_ENDPOINT,
                "token_endpoint": settings.OIDC_OP_TOKEN_ENDPOINT,
                "client_id": settings.TESSERA_OIDC_CLI_CLIENT_ID,
                "scope": settings.OIDC_RP_SCOPES,
            }
        )


class SsoTokenSerializer(RequestSerializer):
    id_token = serializers.CharField(
        max_length=16_384,
        required=False,
        default="",
        allow_blank=True,
        help_text="The provider's ID token, issued to the CLI (a provider that gives none: its access token is "
        "introspected).",
    )
    access_token = serializers.CharField(max_length=16_384, help_text="Its access token, for the userinfo.")
    name = serializers.CharField(max_length=100, required=False, default="tessera CLI")


class SsoTokenView(APIView):
    """Exchange the provider's tokens from the CLI's device flow for a new personal token: the ID token must be
    the provider's, issued to the CLI's client and unexpired, and the access token its subject's (no ID token: the
    access token introspected as the CLI's). Throttled per client address as the password login is."""

    authentication_classes: list = []
    permission_classes = [permissions.AllowAny]
    throttle_classes = [LoginRateThrottle]

    @extend_schema(request=SsoTokenSerializer, responses={201: ApiTokenCreatedSerializer})
    def post(self, request: Request) -> Response:
        if not cli_sso_enabled():
            raise NotFound("This portal has no single sign-on for the CLI.")
        incoming = SsoTokenSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        user = DirectoryOIDCBackend().user_from_device_tokens(
            id_token=incoming.validated_data["id_token"], access_token=incoming.validated_data["access_token"]
        )
        if user is None or not user.is_active:
            raise ApiError(
                "The provider's tokens were refused (expired, not issued to the CLI, or not this portal's "
                "provider); run `tessera login --sso` again.",
                code="authentication_failed",
                status_code=status.HTTP_401_UNAUTHORIZED,
            )
        return _token_created(user=user, name=incoming.validated_data["name"])


class SignedOutSerializer(serializers.Serializer):
    sessions_ended = serializers.IntegerField(help_text="Portal sessions ended (browsers signed out).")
    tokens_revoked = serializers.IntegerField(
        help_text="Personal API tokens revoked, the caller's own included."
    )


class SignOutEverywhereView(APIView):
    """End every session of the caller and revoke every personal token of theirs, the one this request came with
    included (the same as the account page's "Sign out everywhere"; a password change does it too)."""

    @extend_schema(request=None, responses={200: SignedOutSerializer})
    def post(self, request: Request) -> Response:
        done = user_sign_out_everywhere(user=request.user, why="asked through the API")
        return Response(
            SignedOutSerializer(
                {"sessions_ended": done.sessions_ended, "tokens_revoked": done.tokens_revoked}
            ).data
        )
