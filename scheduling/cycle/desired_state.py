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
from typing import Any, NamedTuple

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import CharField, Value
from django.db.models.functions import Coalesce, NullIf

from agent.protocol import port_env_name
from portal.database import update_from_values
from quotas.choices import network_strictest
from quotas.selectors import team_mounts, team_networks
from scheduling import lock_objects
from scheduling.choices import GangMemberOutcome, SharingMode
from scheduling.cycle import node_loss
from scheduling.cycle.models import NodeSync
from scheduling.inventory.models import Gpu, Node
from scheduling.jobs.models import GangMember, Job, Slice
from scheduling.jobs.selectors import job_team_ids
from scheduling.jobs.sessions import session_path
from scheduling.jobs.states import ACTIVE_STATES
from scheduling.realtime import events


@dataclass(frozen=True)
class DesiredState:
    node: str
    version: int
    jobs: tuple[dict[str, Any], ...]

    def message(self) -> dict[str, Any]:
        return {"type": "desired_state", "node": self.node, "version": self.version, "jobs": list(self.jobs)}


class Card(NamedTuple):
    """One GPU slice of a placement, as its node's agent is told it."""

    uuid: str
    index: int
    sharing_mode: str
    memory_mib: int
    compute_pct: int


class PlacedJob(NamedTuple):
    """The fields of a job its agents are told (a `Job` row's names, unless said)."""

    pk: int
    attempt: int
    name: str
    command: str
    workdir: str
    env: dict[str, Any] | None
    max_runtime_s: int | None
    grace_s: int  # its priority class's preemption_grace_s
    cpu_milli: int
    memory_mib: int
    user: str | None  # the submitter's Unix account (_run_as)
    gpus: int
    nodes: int
    array_job_id: int | None
    array_task_id: int | None
    array_task_count: int | None
    ports: list[list[Any]]  # [[name, port], ...] as asked
    session_token: str
    image: str
    mounts: list[str]  # its team's mounts by name
    team_id: int
    class_network: str  # its priority class's network setting (blank: says nothing)


class Member(NamedTuple):
    """One node of a gang's current attempt."""

    rank: int
    node_id: int
    node_name: str
    address: str
    port: int | None


def _gang_entry(job: PlacedJob, members: list[Member], node_id: int) -> dict[str, Any] | None:
    """The gang as one member's agent needs it: members in rank order, whole GPUs per node as their slots."""
    rank = next((m.rank for m in members if m.node_id == node_id), None)
    if rank is None:
        return None
    return {
        "rank": rank,
        "master_port": members[0].port,
        "members": [{"node": m.node_name, "address": m.address, "slots": job.gpus} for m in members],
    }


class InImage(NamedTuple):
    """What the agent needs of a job in an image besides its spec: its mounts and its network."""

    mounts: list[dict[str, Any]]
    network: str


def _in_images(jobs: list[PlacedJob]) -> dict[int, InImage]:
    """The mounts each job in an image asked for, as its team has them, and its network (the stricter of its
    team's and its class's): three statements whatever the number of jobs."""
    imaged = [job for job in jobs if job.image]
    if not imaged:
        return {}
    team_ids = {job.team_id for job in imaged}
    mounts, networks = team_mounts(team_ids=team_ids), team_networks(team_ids=team_ids)
    out = {}
    for job in imaged:
        given = mounts.get(job.team_id, {})
        out[job.pk] = InImage(
            mounts=[
                {"host_path": m.host_path, "container_path": m.container_path, "read_only": m.read_only}
                for m in (given.get(name) for name in job.mounts or ())
                if m is not None  # a mount removed since it was submitted: the job runs without it
            ],
            network=network_strictest(networks.get(job.team_id, ""), job.class_network),
        )
    return out


def _job_entry(job: PlacedJob, cards: list[Card], in_image: InImage | None = None) -> dict[str, Any]:
    gpus = []
    for c in sorted(cards, key=lambda c: c.index):
        whole = c.sharing_mode == SharingMode.EXCLUSIVE
        gpus.append(
            {
                "uuid": c.uuid,
                "index": c.index,
                "memory_mib": None if whole else c.memory_mib,
                "compute_pct": None if whole else c.compute_pct,
                "sharing": c.sharing_mode,
            }
        )
    env = {str(k): str(v) for k, v in (job.env or {}).items()}
    env.update({"TESSERA_JOB_ID": str(job.pk), "TESSERA_ATTEMPT": str(job.attempt)})
    if job.array_task_id is not None:
        env.update(
            {
                "TESSERA_ARRAY_JOB_ID": str(job.array_job_id),
                "TESSERA_ARRAY_TASK_ID": str(job.array_task_id),
                "TESSERA_ARRAY_TASK_COUNT": str(job.array_task_count),
            }
        )
    if job.ports:
        env.update(session_env(job_id=job.pk, ports=job.ports, token=job.session_token))
    entry = {
        "job_id": str(job.pk),
        "attempt": job.attempt,
        "name": job.name,
        "command": job.command,
        "cwd": job.workdir or None,
        "env": env,
        "gpus": gpus,
        "max_runtime_s": job.max_runtime_s,
        "grace_s": float(job.grace_s),
        "fence_after_s": node_loss.fence_after_s(),
        "cpu_milli": job.cpu_milli,
        "memory_mib": job.memory_mib,
        "user": job.user,
    }
    if job.ports:  # only then: an agent from before sessions is told nothing new
        entry["ports"] = [{"name": name, "port": port} for name, port in job.ports]
    if job.image and in_image is not None:  # likewise: an agent from before images
        entry.update(image=job.image, mounts=in_image.mounts, network=in_image.network)
    return entry


def session_env(*, job_id: int, ports: list[list[Any]], token: str) -> dict[str, str]:
    """What a job serving web ports is told beyond TESSERA_PORT_<NAME> (its agent's): the path the portal serves
    each port under (a server's base URL, e.g. Jupyter's --ServerApp.base_url) and the token the portal's proxy
    sends (`Authorization: token ...`), also as JUPYTER_TOKEN, which Jupyter takes as its own."""
    env = {f"TESSERA_BASE_URL_{port_env_name(name)}": session_path(job_id, name) for name, _ in ports}
    env.update({"TESSERA_SESSION_TOKEN": token, "JUPYTER_TOKEN": token})
    return env


def _run_as() -> Coalesce:
    """The account a job runs as in the agents' `account` mode: the submitter's Unix account as their directory
    names it (quotas.DirectoryAccount), else their username (a local account)."""
    return Coalesce(
        NullIf("submitter__directory_account__unix_account", Value("")),
        f"submitter__{get_user_model().USERNAME_FIELD}",
        output_field=CharField(),
    )


def _desired_jobs_by_node(*, node_ids: list[int] | None) -> dict[int, tuple[dict[str, Any], ...]]:
    """The placements each node should run now, in job-id order (nodes running nothing are left out), for
    these nodes (all when None): a few statements for the whole cluster, whatever its size."""
    # A node's cards by their ids, then their jobs by id, whose state is checked here. Given the node and the
    # jobs' state, the planner (its statistics taken before a cycle's wave of placements: almost no slice, no
    # placed job) joined every slice to every active job's index entry: 9 s for one node's eight cards while an
    # array's tasks started, and each agent's acknowledgement asks for its node's.
    slices = Slice.objects.all()
    if node_ids is not None:
        slices = slices.filter(
            gpu_id__in=list(Gpu.objects.filter(node_id__in=node_ids).values_list("pk", flat=True))
        )
    cards: dict[int, dict[int, list[Card]]] = defaultdict(lambda: defaultdict(list))  # node -> job -> cards
    for node_id, job_id, *card in slices.values_list(
        "gpu__node_id", "job_id", "gpu__uuid", "gpu__index", "gpu__sharing_mode", "memory_mib", "compute_pct"
    ):
        cards[node_id][job_id].append(Card(*card))
    if not cards:
        return {}
    fields = [*PlacedJob._fields]
    fields[fields.index("grace_s")] = "priority_class__preemption_grace_s"
    fields[fields.index("user")] = "run_as"
    fields[fields.index("class_network")] = "priority_class__network"
    job_ids = sorted({job_id for by_job in cards.values() for job_id in by_job})
    placed = (
        Job.objects.filter(pk__in=job_ids)
        .annotate(run_as=_run_as())
        .order_by("pk")
        .values_list("state", *fields)
    )
    jobs = {row[1]: PlacedJob._make(row[1:]) for row in placed if row[0] in ACTIVE_STATES}
    members, failing = _gangs(jobs=[job for job in jobs.values() if job.nodes > 1])
    in_images = _in_images(list(jobs.values()))
    out = {}
    for node_id, by_job in cards.items():
        entries = []
        for job_id in sorted(by_job):
            job = jobs.get(job_id)
            if job is None or job_id in failing:
                # It ended between the two reads (its slices were read as active): not desired. A failing gang:
                # its agents stop the members still running.
                continue
            entry = _job_entry(job, by_job[job_id], in_images.get(job_id))
            gang = _gang_entry(job, members[job_id], node_id) if job_id in members else None
            if gang is not None:
                entry["gang"] = gang
            entries.append(entry)
        out[node_id] = tuple(entries)
    return out


def _gangs(*, jobs: list[PlacedJob]) -> tuple[dict[int, list[Member]], set[int]]:
    """These gangs' current members by job, in rank order, and which gangs have a failed member (the
    selectors `gang_members_of` and `gangs_failing`, in one statement)."""
    if not jobs:
        return {}, set()
    attempts = {job.pk: job.attempt for job in jobs}
    members: dict[int, list[Member]] = defaultdict(list)
    failing = set()
    for job_id, attempt, outcome, *member in (
        GangMember.objects.filter(job_id__in=list(attempts))
        .order_by("job_id", "rank")
        .values_list("job_id", "attempt", "outcome", "rank", "node_id", "node__name", "address", "port")
    ):
        if attempt != attempts[job_id]:
            continue
        members[job_id].append(Member(*member))
        if outcome == GangMemberOutcome.FAILED:
            failing.add(job_id)
    return dict(members), failing


def desired_jobs(*, node: Node) -> tuple[dict[str, Any], ...]:
    """The placements a node should run now, in job-id order."""
    return _desired_jobs_by_node(node_ids=[node.pk]).get(node.pk, ())


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
    the next cycle brings every agent's desired state back in line with the database. It runs after every
    cycle, so it reads the whole cluster in a few statements and writes only the versions that moved (one
    statement), rather than `desired_state_for_node` node by node.
    """
    if nodes is None:
        names = dict(Node.objects.order_by("name").values_list("id", "name"))
    else:
        names = {node.pk: node.name for node in nodes}
    node_ids = None if nodes is None else list(names)
    with transaction.atomic():
        synced = NodeSync.objects.all() if node_ids is None else NodeSync.objects.filter(node_id__in=node_ids)
        missing = names.keys() - set(synced.values_list("node_id", flat=True))
        NodeSync.objects.bulk_create([NodeSync(node_id=pk) for pk in missing], ignore_conflicts=True)
        # Locked before the read, as `desired_state_for_node` does: what it reads is at least as new as what any
        # version was computed from, so a version never moves to older content.
        syncs = {
            node_id: (sync_id, version, digest)
            for sync_id, node_id, version, digest in lock_objects.node_syncs_for_update(
                node_ids=node_ids
            ).values_list("id", "node_id", "desired_version", "desired_digest")
        }
        jobs_by_node = _desired_jobs_by_node(node_ids=node_ids)
        moved: list[tuple[int, int, str]] = []
        changed: list[DesiredState] = []
        for node_id, name in names.items():
            if node_id not in syncs:
                continue  # deleted since
            sync_id, version, digest = syncs[node_id]
            jobs = jobs_by_node.get(node_id, ())
            digest_now = _digest(jobs)
            if digest_now != digest:
                moved.append((sync_id, version + 1, digest_now))
                changed.append(DesiredState(node=name, version=version + 1, jobs=jobs))
        _desired_versions_save(moved)
        # Each changed state goes with its notice: the agents' socket sends it as it is, with no database work
        # of its own for each node (hundreds of nodes change in a cycle that fills a cluster).
        teams = job_team_ids(job_ids=[int(j["job_id"]) for state in changed for j in state.jobs])
        for state in changed:
            events.node_desired_state_changed(
                node_name=state.node,
                state={
                    "version": state.version,
                    "jobs": list(state.jobs),
                    "teams": {j["job_id"]: teams.get(int(j["job_id"]), 0) for j in state.jobs},
                },
            )
    return [state.node for state in changed]


def _desired_versions_save(rows: list[tuple[int, int, str]]) -> None:
    """Write (NodeSync id, desired version, digest) rows (update_from_values: one statement on PostgreSQL)."""
    if not rows:
        return
    update_from_values(NodeSync, ["desired_version", "desired_digest"], rows)


def desired_version_raise(*, node_id: int, above: int) -> None:
    """Move a node's version past one its agent already holds (the agent kept its state across a database
    restore): the agent refuses lower versions, so the next state must be numbered higher."""
    NodeSync.objects.filter(node_id=node_id, desired_version__lte=above).update(
        desired_version=above + 1, desired_digest=""
    )
