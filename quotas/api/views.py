"""Teams (mine), priority classes, personal tokens and whoami. Tenant scoping lives in get_queryset."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import authenticate
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, serializers, status, throttling, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api_params import IdFilter, StrictFilterSet, TextFilter
from portal.api_support import ApiError, ClientAddressThrottleMixin
from quotas.api.authentication import BearerTokenAuthentication
from quotas.api.serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    PriorityClassSerializer,
    TeamSerializer,
    WhoamiSerializer,
)
from quotas.models import ApiToken, Membership, PriorityClass, Team
from quotas.selectors import TeamAllowance, team_allowances
from quotas.tokens import TokenLimitReached, api_token_create, api_token_revoke
from scheduling.cycle.selectors import Borrowed, borrowed_by_team, fair_shares_gpus, queue_shares
from scheduling.cycle.snapshot import engine_quotas
from scheduling.jobs.usage import TeamAllocation, allocations_by_team


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


class TokenLoginSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=1024, style={"input_type": "password"}, trim_whitespace=False)
    name = serializers.CharField(max_length=100, required=False, default="tessera CLI")


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
        try:
            row, token = api_token_create(user=user, name=incoming.validated_data["name"])
        except TokenLimitReached as exc:
            raise ApiError(str(exc), code="too_many_tokens", field="name") from None
        row.token = token
        return Response(ApiTokenCreatedSerializer(row).data, status=status.HTTP_201_CREATED)
