"""Each node's desired state, derived from the database: the placements (job, attempt, GPU slices) it should run.

A member of a multi-node job also gets the gang (its rank, every member's address and slots, the rendezvous
port), from which its agent sets MASTER_ADDR, WORLD_SIZE, ... and writes a hostfile. A gang with a failed member
leaves every node's desired state, so the agents stop the other members with the job's grace.

The version grows only when the content changes (a digest is kept in NodeSync), so agents can drop an older
state that arrives late, and computing it twice is harmless. Agents receive the whole state, never a diff.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from scheduling import lock_objects
from scheduling.choices import SharingMode
from scheduling.cycle import node_loss
from scheduling.cycle.models import NodeSync
from scheduling.inventory.models import Node
from scheduling.jobs.models import GangMember, Job, Slice
from scheduling.jobs.selectors import gang_members_of, gangs_failing
from scheduling.jobs.states import ACTIVE_STATES
from scheduling.realtime import events

# The agent names time-slicing `time_sliced`; everything else matches.
_AGENT_SHARING = {SharingMode.TIMESLICE: "time_sliced"}


@dataclass(frozen=True)
class DesiredState:
    node: str
    version: int
    jobs: tuple[dict[str, Any], ...]

    def message(self) -> dict[str, Any]:
        return {"type": "desired_state", "node": self.node, "version": self.version, "jobs": list(self.jobs)}


def _gang_entry(job: Job, members: list[GangMember], node: Node) -> dict[str, Any] | None:
    """The gang as one member's agent needs it: members in rank order, whole GPUs per node as their slots."""
    rank = next((m.rank for m in members if m.node_id == node.pk), None)
    if rank is None:
        return None
    return {
        "rank": rank,
        "master_port": members[0].port,
        "members": [{"node": m.node.name, "address": m.address, "slots": job.gpus} for m in members],
    }


def _job_entry(job: Job, slices: list[Slice]) -> dict[str, Any]:
    gpus = []
    for s in sorted(slices, key=lambda s: s.gpu.index):
        whole = s.gpu.sharing_mode == SharingMode.EXCLUSIVE
        gpus.append(
            {
                "uuid": s.gpu.uuid,
                "index": s.gpu.index,
                "memory_mib": None if whole else s.memory_mib,
                "compute_pct": None if whole else s.compute_pct,
                "sharing": _AGENT_SHARING.get(s.gpu.sharing_mode, s.gpu.sharing_mode),
            }
        )
    env = {str(k): str(v) for k, v in (job.env or {}).items()}
    env.update({"TESSERA_JOB_ID": str(job.pk), "TESSERA_ATTEMPT": str(job.attempt)})
    return {
        "job_id": str(job.pk),
        "attempt": job.attempt,
        "name": job.name,
        "command": job.command,
        "cwd": job.workdir or None,
        "env": env,
        "gpus": gpus,
        "max_runtime_s": job.max_runtime_s,
        "grace_s": float(job.priority_class.preemption_grace_s),
        "fence_after_s": node_loss.fence_after_s(),
        "cpu_milli": job.cpu_milli,
        "memory_mib": job.memory_mib,
        "user": job.submitter.get_username() if job.submitter_id else None,
    }


def desired_jobs(*, node: Node) -> tuple[dict[str, Any], ...]:
    """The placements a node should run now, in job-id order."""
    by_job: dict[int, list[Slice]] = defaultdict(list)
    for s in Slice.objects.filter(gpu__node=node, job__state__in=ACTIVE_STATES).select_related("gpu"):
        by_job[s.job_id].append(s)
    jobs = list(
        Job.objects.filter(pk__in=by_job).select_related("priority_class", "submitter").order_by("pk")
    )
    gangs = [job.pk for job in jobs if job.nodes > 1]
    members = gang_members_of(job_ids=gangs) if gangs else {}
    failing = gangs_failing(job_ids=gangs) if gangs else set()
    entries = []
    for job in jobs:
        if job.pk in failing:
            continue  # its agents stop the members still running
        entry = _job_entry(job, by_job[job.pk])
        gang = _gang_entry(job, members[job.pk], node) if job.pk in members else None
        if gang is not None:
            entry["gang"] = gang
        entries.append(entry)
    return tuple(entries)


def _digest(jobs: tuple[dict[str, Any], ...]) -> str:
    return hashlib.sha256(json.dumps(jobs, sort_keys=True, default=str).encode()).hexdigest()


def desired_state_for_node(*, node: Node) -> tuple[DesiredState, bool]:
    """The node's desired state and whether its version moved just now (the content changed)."""
    with transaction.atomic():
        NodeSync.objects.get_or_create(node=node)
        sync = lock_objects.node_sync_for_update(node_id=node.pk).get()
        jobs = desired_jobs(node=node)
        digest = _digest(jobs)
        changed = digest != sync.desired_digest
        if changed:
            sync.desired_version += 1
            sync.desired_digest = digest
            sync.save(update_fields=["desired_version", "desired_digest"])
        return DesiredState(node=node.name, version=sync.desired_version, jobs=jobs), changed


def desired_state_sync(*, nodes: list[Node] | None = None) -> list[str]:
    """Recompute desired states (all nodes by default); tell the agents of those that changed, after commit.

    This is the level-triggered catch-all: whatever path changed a job (a cancel, a finish, an admin edit),
    the next cycle brings every agent's desired state back in line with the database.
    """
    changed = []
    for node in nodes if nodes is not None else Node.objects.all():
        _, moved = desired_state_for_node(node=node)
        if moved:
            changed.append(node.name)
            with transaction.atomic():
                events.node_desired_state_changed(node_name=node.name)
    return changed


def desired_version_raise(*, node_id: int, above: int) -> None:
    """Move a node's version past one its agent already holds (the agent kept its state across a database
    restore): the agent refuses lower versions, so the next state must be numbered higher."""
    NodeSync.objects.filter(node_id=node_id, desired_version__lte=above).update(
        desired_version=above + 1, desired_digest=""
    )
