"""Nodes and the cluster summary. Other teams' slices are anonymous; the aggregates are everyone's to see."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.conf import settings
from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api_errors import ApiError
from scheduling.agents.live_metrics import live_metrics_for_nodes
from scheduling.cycle.selectors import cluster_summary
from scheduling.inventory.api import serializers as s
from scheduling.inventory.cluster_map import nvlink_peers, slice_holder, visible_team_ids
from scheduling.inventory.models import Gpu, Node, NodeStateChange
from scheduling.inventory.selectors import NodeConditions, node_conditions
from scheduling.inventory.services import node_set_state
from scheduling.jobs.models import Slice


def _node_payload(
    node: Node,
    *,
    links: dict[int, list[int]],
    visible: set[int] | None,
    metrics: dict[int, dict[str, Any]],
    conditions: NodeConditions,
) -> dict[str, Any]:
    gpus = []
    for gpu in node.gpus.all():
        holders = [
            asdict(
                slice_holder(
                    visible=visible,
                    team_id=sl.job.team_id,
                    team_slug=sl.job.team.slug,
                    job_id=sl.job_id,
                    job_name=sl.job.name,
                    username=sl.job.submitter.username,
                    memory_mib=sl.memory_mib,
                    compute_pct=sl.compute_pct,
                    job_state=sl.job.state,
                )
            )
            for sl in gpu.slices.all()
        ]
        gpus.append(
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "model": gpu.model.name,
                "memory_mib": gpu.memory_mib,
                "numa_node": gpu.numa_node,
                "sharing_mode": gpu.sharing_mode,
                "health": gpu.health,
                "compute_capacity_pct": gpu.compute_capacity_pct,
                "allocated_memory_mib": gpu.allocated_memory_mib,
                "allocated_compute_pct": gpu.allocated_compute_pct,
                "nvlink_peers": sorted(links.get(gpu.pk, [])),
                "slices": holders,
                "metrics": metrics.get(gpu.index),
            }
        )
    return {
        "name": node.name,
        "state": node.state,
        "cpu_milli": node.cpu_milli,
        "memory_mib": node.memory_mib,
        "allocated_cpu_milli": node.allocated_cpu_milli,
        "allocated_memory_mib": node.allocated_memory_mib,
        "labels": node.labels,
        "last_heartbeat_at": node.last_heartbeat_at,
        "conditions": {
            "heartbeat_age_s": conditions.heartbeat_age_s,
            "connected": conditions.connected,
            "connection": conditions.connection,
            "connection_reason": conditions.connection_reason,
            "connected_at": conditions.connected_at,
            "disconnected_at": conditions.disconnected_at,
            "lost_after_s": float(settings.TESSERA_NODE_LOST_AFTER_S),
            "last_error": conditions.last_error,
            "last_error_at": conditions.last_error_at,
            "cordoned": conditions.cordoned,
            "draining": conditions.draining,
            "schedulable": conditions.schedulable,
        },
        "gpus": gpus,
    }


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    """Nodes with one entry per GPU and each GPU's slices (other teams' slices anonymous) and NVLink peers."""

    serializer_class = s.NodeSerializer
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    filterset_fields = ["state"]

    def get_queryset(self):
        return Node.objects.order_by("name").prefetch_related(
            Prefetch(
                "gpus",
                queryset=Gpu.objects.select_related("model")
                .order_by("index")
                .prefetch_related(
                    Prefetch("slices", queryset=Slice.objects.select_related("job__team", "job__submitter"))
                ),
            )
        )

    def _payloads(self, nodes: list[Node]) -> list[dict[str, Any]]:
        index_of = {g.pk: g.index for n in nodes for g in n.gpus.all()}
        peers = nvlink_peers(gpu_ids=index_of)
        links = {pk: [index_of[p] for p in found if p in index_of] for pk, found in peers.items()}
        visible = visible_team_ids(self.request.user)
        metrics = live_metrics_for_nodes(node_names=[n.name for n in nodes])
        conditions = node_conditions(nodes=[(n.pk, n.state, n.last_heartbeat_at) for n in nodes])
        return [
            _node_payload(
                n, links=links, visible=visible, metrics=metrics.get(n.name, {}), conditions=conditions[n.pk]
            )
            for n in nodes
        ]

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        data = s.NodeSerializer(self._payloads(list(page)), many=True).data
        return self.get_paginated_response(data)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(s.NodeSerializer(self._payloads([self.get_object()])[0]).data)

    @extend_schema(request=s.NodeStateRequestSerializer, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"], url_path="state")
    def set_state(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Cordon, drain or uncordon the node, with a reason for its audit trail. Staff only."""
        if not request.user.is_staff:
            raise ApiError(
                "Only staff may cordon, drain or uncordon a node.",
                code="permission_denied",
                status_code=status.HTTP_403_FORBIDDEN,
            )
        body = s.NodeStateRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        node = self.get_object()
        node_set_state(
            node=node,
            state=body.validated_data["state"],
            actor=request.user,
            reason=body.validated_data["reason"],
        )
        return Response(s.NodeSerializer(self._payloads([self.get_object()])[0]).data)

    @extend_schema(responses={200: s.NodeStateChangeSerializer(many=True)})
    @action(detail=True, methods=["get"], url_path="state-changes")
    def state_changes(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """The node's audit trail: who cordoned, drained or uncordoned it, when and why; newest first."""
        node = self.get_object()
        changes = NodeStateChange.objects.filter(node=node).select_related("actor").order_by("-at", "-id")
        page = self.paginate_queryset(changes)
        return self.get_paginated_response(s.NodeStateChangeSerializer(page, many=True).data)


class ClusterView(APIView):
    """The whole cluster in numbers: nodes by state, capacity and allocation by GPU model, per-team aggregates."""

    @extend_schema(responses={200: s.ClusterSerializer})
    def get(self, request: Request) -> Response:
        return Response(s.ClusterSerializer(cluster_summary()).data)
