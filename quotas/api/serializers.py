"""Shapes of teams, priority classes, tokens and the current user in the API."""

from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from portal.api_requests import RequestSerializer
from quotas.models import ApiToken, PriorityClass, QuotaChange, Team


class PriorityClassSerializer(serializers.ModelSerializer):
    class Meta:
        model = PriorityClass
        fields = [
            "id",
            "name",
            "value",
            "preemptible",
            "preemption_grace_s",
            "open_to_all_teams",
            "description",
        ]


class QuotaSummarySerializer(serializers.Serializer):
    gpu_model = serializers.CharField(allow_null=True)
    guaranteed_gpus = serializers.FloatField()
    limit_gpus = serializers.FloatField(allow_null=True)
    guaranteed_gpu_memory_mib = serializers.IntegerField()
    limit_gpu_memory_mib = serializers.IntegerField(allow_null=True)
    fair_share_weight = serializers.FloatField()
    default_priority_class = serializers.CharField(allow_null=True)


class TeamPriorityClassSerializer(serializers.Serializer):
    name = serializers.CharField()
    value = serializers.IntegerField()
    preemptible = serializers.BooleanField()
    limit_gpus = serializers.FloatField(
        allow_null=True,
        help_text="The most GPUs the team may hold at this class at once; null: only its quota limits it.",
    )


class TeamUsageSerializer(serializers.Serializer):
    gpus = serializers.FloatField(help_text="Whole-GPU equivalents held now.")
    gpu_memory_mib = serializers.IntegerField()
    running_jobs = serializers.IntegerField()
    pending_jobs = serializers.IntegerField()


class TeamBorrowedSerializer(serializers.Serializer):
    """What the team holds beyond its guarantee (guaranteed 4 GPUs, holding 8: 4), as the scheduler counts it."""

    gpus = serializers.FloatField()
    gpu_memory_mib = serializers.IntegerField()


class FairShareSerializer(serializers.Serializer):
    gpus = serializers.FloatField(
        allow_null=True,
        help_text="The team's fair share of the cluster in GPUs: its guarantee plus a weight-proportional part of "
        "what nobody is guaranteed.",
    )
    held_share = serializers.FloatField(
        help_text="GPU memory or compute held now relative to the guarantee, whichever is larger (1.0 = at it)."
    )
    usage_share = serializers.FloatField(
        help_text="Decayed past compute usage relative to running exactly at the guarantee (1.0 = at it)."
    )
    queue_share = serializers.FloatField(
        help_text="max(held_share, usage_share) / fair-share weight: the scheduler orders jobs of one priority by "
        "it, lowest first."
    )


class TeamSerializer(serializers.ModelSerializer):
    parent = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    role = serializers.SerializerMethodField()
    quotas = QuotaSummarySerializer(many=True, source="summary.quotas", read_only=True)
    priority_classes = TeamPriorityClassSerializer(
        many=True,
        source="summary.priority_classes",
        read_only=True,
        help_text="The priority classes the team may use, highest first: those open to all teams, those granted "
        "to it or its organisation, and its default.",
    )
    default_priority_class = serializers.CharField(
        source="summary.default_priority_class",
        read_only=True,
        allow_null=True,
        help_text="The class a job gets when it names none.",
    )
    usage = TeamUsageSerializer(source="summary.usage", read_only=True)
    borrowed = TeamBorrowedSerializer(source="summary.borrowed", read_only=True)
    fair_share = FairShareSerializer(source="summary.fair_share", read_only=True)

    class Meta:
        model = Team
        fields = [
            "id",
            "slug",
            "display_name",
            "parent",
            "role",
            "quotas",
            "priority_classes",
            "default_priority_class",
            "usage",
            "borrowed",
            "fair_share",
        ]

    def get_role(self, team: Team) -> str | None:
        return self.context.get("roles", {}).get(team.pk)


class ApiTokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = ["id", "prefix", "created_at", "last_used_at", "revoked_at"]


class TextField(serializers.CharField):
    """Text, and only text: DRF's CharField would take 0 or true and store "0" or "True"."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class ApiTokenCreateSerializer(RequestSerializer):
    name = TextField(max_length=100)


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once; only its hash is stored.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]


class MembershipBriefSerializer(serializers.Serializer):
    team = serializers.CharField()
    team_id = serializers.IntegerField()
    role = serializers.CharField()


class WhoamiSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
    is_staff = serializers.BooleanField()
    auth = serializers.CharField(help_text="How this request authenticated: token or session.")
    teams = MembershipBriefSerializer(many=True)


class QuotaEditSerializer(RequestSerializer):
    """A change to one of a team's quota rows: the fields given change, the others stay."""

    gpu_model = serializers.CharField(
        required=False,
        allow_null=True,
        default=None,
        max_length=100,
        help_text="The per-GPU-model row to change (its model's name); null or absent: the all-models quota.",
    )
    guaranteed_gpus = serializers.DecimalField(max_digits=9, decimal_places=3, min_value=0, required=False)
    limit_gpus = serializers.DecimalField(
        max_digits=9,
        decimal_places=3,
        min_value=0,
        required=False,
        allow_null=True,
        help_text="null: no limit.",
    )
    guaranteed_gpu_memory_mib = serializers.IntegerField(min_value=0, max_value=2**53, required=False)
    limit_gpu_memory_mib = serializers.IntegerField(
        min_value=0, max_value=2**53, required=False, allow_null=True, help_text="null: no limit."
    )
    fair_share_weight = serializers.DecimalField(
        max_digits=6, decimal_places=2, min_value=Decimal("0.01"), required=False
    )
    default_priority_class = serializers.CharField(
        required=False, allow_null=True, max_length=50, help_text="A priority class's name; null: none set."
    )


class QuotaChangeRequestSerializer(QuotaEditSerializer):
    reason = serializers.CharField(
        help_text="Why (required; kept in the audit trail, at most 300 characters: a longer one is refused with "
        "code out_of_range)."
    )


class UndoRequestSerializer(RequestSerializer):
    reason = serializers.CharField(
        help_text="Why (required; at most 300 characters with 'undo of change #N: ')."
    )


class QuotaChangeSerializer(serializers.ModelSerializer):
    actor = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    gpu_model = serializers.SerializerMethodField()
    changes = serializers.DictField(
        child=serializers.DictField(allow_null=True),
        help_text='{"field": {"old": ..., "new": ...}}; memory in MiB, GPUs and weights as decimal strings.',
    )

    class Meta:
        model = QuotaChange
        fields = ["id", "changed_at", "actor", "source", "gpu_model", "changes", "note", "undo_of"]

    def get_gpu_model(self, change: QuotaChange) -> str | None:
        return change.quota.gpu_model.name if change.quota and change.quota.gpu_model_id else None


class QuotaSavedSerializer(serializers.Serializer):
    change = QuotaChangeSerializer(allow_null=True, help_text="null: nothing changed.")
    quota = QuotaSummarySerializer()


class CapacityLineSerializer(serializers.Serializer):
    scope = serializers.CharField()
    gpus = serializers.IntegerField()
    memory_mib = serializers.IntegerField()
    guaranteed_gpus_before = serializers.FloatField()
    guaranteed_gpus_after = serializers.FloatField()
    guaranteed_memory_mib_before = serializers.IntegerField()
    guaranteed_memory_mib_after = serializers.IntegerField()
    over_committed = serializers.BooleanField()


class JobChangeSerializer(serializers.Serializer):
    job_id = serializers.IntegerField(allow_null=True, help_text="null for another team's job (anonymous).")
    team = serializers.CharField()
    gpus = serializers.FloatField()
    memory_mib = serializers.IntegerField()


class TeamStandingSerializer(serializers.Serializer):
    guaranteed_gpus = serializers.FloatField()
    held_gpus = serializers.FloatField()
    borrowed_gpus = serializers.FloatField()


class QuotaImpactSerializer(serializers.Serializer):
    team = serializers.CharField()
    scope = serializers.CharField()
    capacity = CapacityLineSerializer(many=True)
    before = TeamStandingSerializer()
    after = TeamStandingSerializer()
    becomes_borrowed = JobChangeSerializer(many=True)
    stops_borrowed = JobChangeSerializer(many=True)
    would_start = JobChangeSerializer(many=True)
    would_not_start = JobChangeSerializer(many=True)
    would_be_evicted = JobChangeSerializer(many=True)
    refused = serializers.CharField(
        allow_null=True,
        help_text="Why saving this change would be refused for the caller (null: it would not).",
    )
