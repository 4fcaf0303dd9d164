"""A gang's members: who runs which rank where, its rendezvous port, and how each member ended."""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone

from scheduling.choices import GangMemberOutcome
from scheduling.errors import ServiceError
from scheduling.inventory.models import Node
from scheduling.jobs.models import GangMember, Job


class NoRendezvousPort(ServiceError):
    pass


def gang_members_place(*, job: Job, nodes: list[Node]) -> list[GangMember]:
    """Record the members of a multi-node job's new placement: ranks in node-name order (the order the placement
    event lists them), each node's address as of now, and on rank 0 a rendezvous port from
    TESSERA_GANG_PORT_FIRST..LAST that no other live gang uses on that address. Raises NoRendezvousPort when all
    are taken (the placement is refused and retried next cycle)."""
    ordered = sorted(nodes, key=lambda n: n.name)
    master = ordered[0].reachable_address
    taken = set(GangMember.objects.filter(rank=0, address=master).values_list("port", flat=True))
    first, last = settings.TESSERA_GANG_PORT_FIRST, settings.TESSERA_GANG_PORT_LAST
    port = next((p for p in range(first, last + 1) if p not in taken), None)
    if port is None:
        raise NoRendezvousPort(
            f"every rendezvous port {first}-{last} on {master} is held by a running gang", code="no_port"
        )
    return GangMember.objects.bulk_create(
        [
            GangMember(
                job=job,
                attempt=job.attempt,
                node=node,
                rank=rank,
                address=node.reachable_address,
                port=port if rank == 0 else None,
            )
            for rank, node in enumerate(ordered)
        ]
    )


def gang_member_started(*, job: Job, node: Node) -> bool:
    """Its agent reported the member started (once); returns whether this was news."""
    return bool(
        GangMember.objects.filter(job=job, attempt=job.attempt, node=node, started_at__isnull=True).update(
            started_at=timezone.now()
        )
    )


def gang_member_end(
    *, member: GangMember, outcome: str, reported_state: str, exit_code: int | None, reason: str = ""
) -> GangMember:
    """Record how one member ended. The caller holds the job's row lock, so reports about one gang apply one
    after the other."""
    member.outcome = outcome
    member.reported_state = reported_state[:20]
    member.exit_code = exit_code
    member.reason = reason[:200]
    member.ended_at = timezone.now()
    member.save(update_fields=["outcome", "reported_state", "exit_code", "reason", "ended_at"])
    return member


def gang_members_unstarted_stop(*, job: Job) -> list[GangMember]:
    """A member failed: members whose agents never reported them started will not be started now (their nodes'
    desired states drop the job), so they have ended, stopped, without a report."""
    unstarted = list(
        GangMember.objects.filter(
            job=job, attempt=job.attempt, outcome=GangMemberOutcome.RUNNING, started_at__isnull=True
        ).select_related("node")
    )
    for member in unstarted:
        gang_member_end(
            member=member, outcome=GangMemberOutcome.STOPPED, reported_state="not_started", exit_code=None
        )
    return unstarted
