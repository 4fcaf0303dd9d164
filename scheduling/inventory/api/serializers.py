"""Shapes of nodes, GPUs, their slices and the cluster summary in the API."""

from __future__ import annotations

from rest_framework import serializers

from portal.api_requests import RequestSerializer
from scheduling.inventory.services import NODE_STATE_REASON_MAX, SETTABLE_NODE_STATES


class SliceHolderSerializer(serializers.Serializer):
    job_id = serializers.IntegerField(allow_null=True)
    job_name = serializers.CharField(allow_null=True)
    user = serializers.CharField(allow_null=True)
    team = serializers.CharField(allow_null=True)
    mine = serializers.BooleanField()
    memory_mib = serializers.IntegerField()
    compute_pct = serializers.IntegerField()
    releasing = serializers.BooleanField(
        help_text="Held by a job that ended while its node was silent, until its stop is confirmed or its fence "
        "has surely passed."
    )


class GpuMetricsSerializer(serializers.Serializer):
    sampled_at = serializers.FloatField(
        allow_null=True, help_text="When the agent sampled it (Unix seconds)."
    )
    util_pct = serializers.FloatField(allow_null=True, help_text="SM utilisation, mean over the last second.")
    mem_util_pct = serializers.FloatField(allow_null=True, help_text="Memory-bandwidth utilisation.")
    memory_used_mib = serializers.IntegerField(allow_null=True)
    memory_total_mib = serializers.IntegerField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)
    temperature_c = serializers.IntegerField(allow_null=True)
    sm_clock_mhz = serializers.IntegerField(allow_null=True, help_text="SM clock (MHz).")
    health = serializers.CharField(allow_null=True)


class GpuSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    uuid = serializers.CharField()
    model = serializers.CharField()
    memory_mib = serializers.IntegerField()
    numa_node = serializers.IntegerField()
    sharing_mode = serializers.CharField()
    health = serializers.CharField()
    compute_capacity_pct = serializers.IntegerField()
    allocated_memory_mib = serializers.IntegerField()
    allocated_compute_pct = serializers.IntegerField()
    nvlink_peers = serializers.ListField(child=serializers.IntegerField())
    slices = SliceHolderSerializer(many=True)
    metrics = GpuMetricsSerializer(
        allow_null=True,
        help_text="The GPU's newest sample from its node agent; null when none arrived in the last 30 s.",
    )


class NodeConditionsSerializer(serializers.Serializer):
    heartbeat_age_s = serializers.FloatField(
        allow_null=True, help_text="Seconds since its agent was last heard; null: never."
    )
    connected = serializers.BooleanField(
        help_text="Its agent was heard within two heartbeat intervals (TESSERA_AGENT_HEARTBEAT_S) and its "
        "socket has not closed since its last hello."
    )
    connection = serializers.ChoiceField(
        choices=["connected", "never_connected", "silent", "disconnected"],
        help_text="connected; never_connected (no agent ever spoke); silent (no heartbeat for two intervals: "
        "after TESSERA_NODE_LOST_AFTER_S the node is lost); disconnected (its socket closed).",
    )
    connection_reason = serializers.CharField(
        help_text="In words: 'heartbeat 3 s ago', 'never connected', 'agent silent for 40 s', "
        "'disconnected at 2025-01-01 10:00:00 UTC (4 min ago)'."
    )
    connected_at = serializers.DateTimeField(allow_null=True, help_text="Its agent's last hello.")
    disconnected_at = serializers.DateTimeField(allow_null=True, help_text="When its socket last closed.")
    lost_after_s = serializers.FloatField(
        help_text="Silent this long, the node is lost and its jobs requeued."
    )
    last_error = serializers.CharField(
        allow_null=True,
        help_text="Its newest problem: a refused report, MPS unavailable, a GPU reported degraded or failed, "
        "GPUs missing from its inventory. null: none.",
    )
    last_error_at = serializers.DateTimeField(allow_null=True)
    cordoned = serializers.BooleanField()
    draining = serializers.BooleanField()
    schedulable = serializers.BooleanField(help_text="The scheduler places new work there (state ready).")


class NodeSerializer(serializers.Serializer):
    name = serializers.CharField()
    state = serializers.CharField()
    cpu_milli = serializers.IntegerField()
    memory_mib = serializers.IntegerField()
    allocated_cpu_milli = serializers.IntegerField()
    allocated_memory_mib = serializers.IntegerField()
    labels = serializers.DictField()
    last_heartbeat_at = serializers.DateTimeField(allow_null=True)
    conditions = NodeConditionsSerializer(
        help_text="Heartbeat age, connected or why not, its last error, cordoned or draining: the rule the "
        "portal's node tiles and `tessera nodes` show."
    )
    gpus = GpuSerializer(many=True)


class ModelCapacitySerializer(serializers.Serializer):
    model = serializers.CharField()
    gpus = serializers.IntegerField()
    ready_gpus = serializers.IntegerField()
    memory_mib = serializers.IntegerField()
    allocated_memory_mib = serializers.IntegerField()
    allocated_gpus = serializers.FloatField(help_text="Whole-GPU equivalents allocated.")
    free_whole_gpus = serializers.IntegerField(help_text="Cards with nothing allocated on ready nodes.")


class TeamAggregateSerializer(serializers.Serializer):
    team = serializers.CharField()
    guaranteed_gpus = serializers.FloatField(allow_null=True)
    fair_share_gpus = serializers.FloatField(allow_null=True)
    allocated_gpus = serializers.FloatField()
    borrowed_gpus = serializers.FloatField(help_text="What the team holds beyond its guarantee, in GPUs.")
    running_jobs = serializers.IntegerField()
    pending_jobs = serializers.IntegerField()


class ClusterSerializer(serializers.Serializer):
    nodes = serializers.DictField(child=serializers.IntegerField(), help_text="Node count by state.")
    gpus = serializers.IntegerField()
    memory_mib = serializers.IntegerField()
    allocated_memory_mib = serializers.IntegerField()
    allocated_gpus = serializers.FloatField()
    pending_jobs = serializers.IntegerField()
    running_jobs = serializers.IntegerField()
    models = ModelCapacitySerializer(many=True)
    teams = TeamAggregateSerializer(many=True, help_text="Anonymous aggregates per team: no jobs, no people.")


class NodeStateRequestSerializer(RequestSerializer):
    state = serializers.ChoiceField(
        choices=list(SETTABLE_NODE_STATES),
        help_text="cordoned: place no new work; draining: the same, while its jobs finish; ready: uncordon.",
    )
    reason = serializers.CharField(
        max_length=NODE_STATE_REASON_MAX, help_text="Why: kept in the node's audit trail."
    )


class NodeStateChangeSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    actor = serializers.CharField(allow_null=True, source="actor.username", default=None)
    from_state = serializers.CharField()
    to_state = serializers.CharField()
    reason = serializers.CharField()
