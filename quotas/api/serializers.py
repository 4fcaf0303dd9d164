"""Shapes of teams, priority classes, tokens and the current user in the API."""

from __future__ import annotations

from rest_framework import serializers

from quotas.models import ApiToken, PriorityClass, Team


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


class ApiTokenCreateSerializer(serializers.Serializer):
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
