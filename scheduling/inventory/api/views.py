"""Nodes and the cluster summary. Other teams' slices are anonymous; the aggregates are everyone's to see."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from quotas.selectors import team_ids_for_user
from scheduling.agents.live_metrics import live_metrics_for_nodes
from scheduling.choices import LinkKind
from scheduling.cycle.selectors import cluster_summary
from scheduling.inventory.api import serializers as s
from scheduling.inventory.models import Gpu, GpuLink, Node
from scheduling.jobs.models import Slice


def _visible_team_ids(user: Any) -> set[int] | None:
    """None means all (staff)."""
    return None if user.is_staff else team_ids_for_user(user=user)


def _node_payload(
    node: Node,
    *,
    links: dict[int, list[int]],
    mine_ids: set[int] | None,
    metrics: dict[int, dict[str, Any]],
) -> dict[str, Any]:
    gpus = []
    for gpu in node.gpus.all():
        holders = []
        for sl in gpu.slices.all():
            mine = mine_ids is None or sl.job.team_id in mine_ids
            holders.append(
                {
                    "job_id": sl.job_id if mine else None,
                    "job_name": sl.job.name if mine else None,
                    "user": sl.job.submitter.username if mine else None,
                    "team": sl.job.team.slug if mine else None,
                    "mine": mine,
                    "memory_mib": sl.memory_mib,
                    "compute_pct": sl.compute_pct,
                }
            )
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
        gpu_ids = [g.pk for n in nodes for g in n.gpus.all()]
        index_of = {g.pk: g.index for n in nodes for g in n.gpus.all()}
        links: dict[int, list[int]] = defaultdict(list)
        for a, b in GpuLink.objects.filter(gpu_a_id__in=gpu_ids, kind=LinkKind.NVLINK).values_list(
            "gpu_a_id", "gpu_b_id"
        ):
            if a in index_of and b in index_of:
                links[a].append(index_of[b])
                links[b].append(index_of[a])
        mine_ids = _visible_team_ids(self.request.user)
        metrics = live_metrics_for_nodes(node_names=[n.name for n in nodes])
        return [
            _node_payload(n, links=links, mine_ids=mine_ids, metrics=metrics.get(n.name, {})) for n in nodes
        ]

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        data = s.NodeSerializer(self._payloads(list(page)), many=True).data
        return self.get_paginated_response(data)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(s.NodeSerializer(self._payloads([self.get_object()])[0]).data)


class ClusterView(APIView):
    """The whole cluster in numbers: nodes by state, capacity and allocation by GPU model, per-team aggregates."""

    @extend_schema(responses={200: s.ClusterSerializer})
    def get(self, request: Request) -> Response:
        return Response(s.ClusterSerializer(cluster_summary()).data)
