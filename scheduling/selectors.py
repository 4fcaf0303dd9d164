"""Reads for the inventory and jobs."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import F, Q, QuerySet, Sum

from quotas.selectors import team_ids_for_user
from scheduling.choices import JobState, LinkKind
from scheduling.models import Gpu, GpuLink, Job, Node


def jobs_visible_to(*, user: AbstractBaseUser) -> QuerySet[Job]:
    """Jobs a user may see in full: staff see all, others their teams' jobs."""
    jobs = Job.objects.select_related("team", "submitter", "priority_class")
    if user.is_staff:
        return jobs
    return jobs.filter(team_id__in=team_ids_for_user(user=user))


def queue() -> QuerySet[Job]:
    """Pending jobs in the order the last scheduling cycle saw them."""
    return (
        Job.objects.filter(state=JobState.PENDING)
        .select_related("team", "submitter", "priority_class")
        .order_by(F("queue_position").asc(nulls_last=True), "submitted_at", "id")
    )


def cluster_nodes() -> QuerySet[Node]:
    return Node.objects.prefetch_related("gpus__model", "gpus__slices")


def nvlink_pairs_for_node(*, node: Node) -> set[tuple[int, int]]:
    """NVLink-joined pairs of GPU indexes on a node."""
    links = GpuLink.objects.filter(gpu_a__node=node, kind=LinkKind.NVLINK).values_list(
        "gpu_a__index", "gpu_b__index"
    )
    return {(min(a, b), max(a, b)) for a, b in links}


def nvlink_cliques_for_node(*, node: Node, gpus: Iterable[Gpu]) -> list[set[int]]:
    """Greedy all-to-all NVLink groups among the given GPUs (good enough for validation bounds)."""
    pairs = nvlink_pairs_for_node(node=node)
    indexes = sorted(g.index for g in gpus)
    cliques: list[set[int]] = []
    for i in indexes:
        for clique in cliques:
            if all((min(i, j), max(i, j)) in pairs for j in clique):
                clique.add(i)
                break
        else:
            cliques.append({i})
    return cliques


def gpu_capacity_totals() -> dict[str, int]:
    agg = Gpu.objects.aggregate(
        memory_mib=Sum("memory_mib"),
        allocated_memory_mib=Sum("allocated_memory_mib"),
        allocated_compute_pct=Sum("allocated_compute_pct"),
    )
    agg["gpus"] = Gpu.objects.count()
    return {k: v or 0 for k, v in agg.items()}


def overcommitted_gpus() -> QuerySet[Gpu]:
    """GPUs whose ledger exceeds capacity: must always be empty (the first invariant)."""
    return Gpu.objects.filter(
        Q(allocated_memory_mib__gt=F("memory_mib")) | Q(allocated_compute_pct__gt=F("compute_capacity_pct"))
    )
