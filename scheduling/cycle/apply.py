"""Writing a cycle's decisions: `apply_decisions()`, in one transaction under the lease's fencing epoch.

Row locks and the GPU ledger's guarded UPDATEs mean a stale or racing cycle can never double-book a GPU; browsers
hear of it after commit, and agents from the desired-state sync that follows every cycle (`runner.run_cycles`:
`desired_state_sync` sends each changed node its new state in one pass over the cluster).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import transaction

from portal.database import update_from_values
from scheduling import lock_objects
from scheduling.choices import ActorKind, JobState, NodeState
from scheduling.cycle.array_split import array_tasks_split
from scheduling.cycle.lease import epoch_claim
from scheduling.engine import types as eng
from scheduling.inventory.models import Gpu, Node
from scheduling.jobs.batches import PlacementWrite, SliceWant, jobs_place
from scheduling.jobs.dependencies import dependency_holds
from scheduling.jobs.gangs import NoRendezvousPort, gang_members_place
from scheduling.jobs.ledger import SliceDoesNotFit, slice_allocate
from scheduling.jobs.models import Job, Slice
from scheduling.jobs.selectors import gangs_failing
from scheduling.jobs.states import ACTIVE_STATES
from scheduling.jobs.transitions import job_dependency_never_met, job_moving, job_transition
from scheduling.jobs.wording import job_ref
from scheduling.realtime import events

log = logging.getLogger(__name__)


@dataclass
class ApplyResult:
    epoch: int
    placed: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)
    conflicts: dict[int, str] = field(default_factory=dict)  # job id -> why its placement was refused
    pending_updated: int = 0
    relabelled: int = 0  # running jobs whose "on borrowed capacity" label changed with their team's standing


def _fault_point(name: str, detail: str = "") -> None:
    """Fault injection for the failure tests: TESSERA_FAULT_<NAME>_DELAY_S pauses the cycle here, inside its
    transaction, so a test can kill the worker mid-write. Unset (always, in production) it does nothing."""
    delay = float(os.environ.get(f"TESSERA_FAULT_{name.upper()}_DELAY_S", "0") or 0)
    if delay > 0:
        log.warning("fault injection: pausing %.1f s at %s %s", delay, name, detail)
        time.sleep(delay)


@dataclass
class _Freed:
    """What one cycle's evictions free for one preemptor: GPUs per victim team and the longest grace."""

    code: str = "preempted"
    gpus_by_team: dict[str, float] = field(default_factory=dict)
    grace_s: float = 0.0
    moved: int = 0  # of the jobs it waits for, those that restart elsewhere

    def sentence(self) -> str:
        gpus = sum(self.gpus_by_team.values())
        teams = ", ".join(sorted(self.gpus_by_team))
        noun = "GPU" if gpus == 1 else "GPUs"
        if self.moved:
            jobs = "job" if self.moved == 1 else "jobs"
            what = f"{gpus:g} {noun} of team {teams} to be freed ({self.moved} {jobs} moving elsewhere)"
        elif self.code == "reclaimed":
            what = f"{gpus:g} {noun} to be reclaimed from team {teams}"
        else:
            what = f"{gpus:g} {noun} held by lower-priority work of team {teams} to stop"
        return f"waiting for {what}; their grace ends in about {self.grace_s:g} s"


MOVED = "moved"


def _moved_words(ev: eng.Eviction) -> str:
    """'Moved to a100-02 to free an NVLink node for team llm's guaranteed 8-GPU job #12' (the engine names jobs
    by id; the portal writes them #id)."""
    why = job_ref(ev.why or f"moved to {', '.join(ev.to_nodes)}")
    return why[:1].upper() + why[1:]


def _placed_message(job: Job, placement: eng.Placement, freed: _Freed | None) -> str:
    where = ", ".join(f"{a.node}/gpu{a.gpu_index}" for a in placement.assignments)
    if not placement.borrowed:
        kind = "within its team's guarantee"
    elif job.priority_class.preemptible:
        kind = "on borrowed capacity: it may be reclaimed when another team needs its guarantee back"
    else:
        kind = (
            "on borrowed capacity: although its class is never preempted, it may be reclaimed when another "
            "team needs its guarantee back"
        )
    message = f"Placed on {where} ({kind})."
    if freed is not None:
        message += f" It starts once they leave: {freed.sentence()}."
    return message


def _placed_record(job: Job, placement: eng.Placement, epoch: int, freed: _Freed | None) -> tuple[str, dict]:
    """The placement event's message and data."""
    return _placed_message(job, placement, freed), {
        "epoch": epoch,
        "nodes": sorted({a.node for a in placement.assignments}),
        "gpus": [[a.node, a.gpu_index, a.memory_mib, a.compute_milli] for a in placement.assignments],
        "borrowed": placement.borrowed,
    }


def _slice_pct(compute_milli: int) -> int:
    return math.ceil(compute_milli / 10)


def _placement_write(
    job: Job,
    placement: eng.Placement,
    gpus: dict[tuple[str, int], Gpu],
    epoch: int,
    freed: _Freed | None,
) -> PlacementWrite | None:
    """The placement as jobs_place writes it; None for what it does not take (a gang, a GPU gone)."""
    if job.nodes > 1 or any((a.node, a.gpu_index) not in gpus for a in placement.assignments):
        return None
    message, data = _placed_record(job, placement, epoch, freed)
    return PlacementWrite(
        job=job,
        slices=[
            SliceWant(
                gpu=gpus[(a.node, a.gpu_index)],
                memory_mib=a.memory_mib,
                compute_pct=_slice_pct(a.compute_milli),
            )
            for a in placement.assignments
        ],
        borrowed=placement.borrowed,
        message=message,
        data=data,
    )


def _place(
    job: Job,
    placement: eng.Placement,
    gpus: dict[tuple[str, int], Gpu],
    epoch: int,
    freed: _Freed | None = None,
) -> None:
    """Place one job (inside its own savepoint). Raises SliceDoesNotFit when the ledger refuses, NoRendezvousPort
    when a gang finds no free rendezvous port."""
    message, data = _placed_record(job, placement, epoch, freed)
    job_transition(
        job=job,
        to_state=JobState.PLACED,
        actor_kind=ActorKind.SCHEDULER,
        code="placed",
        message=message,
        data=data,
    )
    if placement.borrowed != job.borrowed:
        job.borrowed = placement.borrowed
        job.save(update_fields=["borrowed"])
    for a in placement.assignments:
        gpu = gpus.get((a.node, a.gpu_index))
        if gpu is None:
            raise SliceDoesNotFit(f"{a.node}/gpu{a.gpu_index} no longer exists.", code="gone")
        slice_allocate(job=job, gpu=gpu, memory_mib=a.memory_mib, compute_pct=_slice_pct(a.compute_milli))
    if job.nodes > 1:
        gang_members_place(
            job=job, nodes=list({gpus[(a.node, a.gpu_index)].node for a in placement.assignments})
        )


def apply_decisions(*, decisions: eng.Decisions, epoch: int, full_pending: int | None = None) -> ApplyResult:
    """Write one cycle's decisions in one transaction, or nothing at all.

    `full_pending` (the jobs its snapshot saw waiting) for a full cycle, None for an incremental pass, which saw
    only part of the queue: it writes the reasons of the jobs it saw but no queue positions, and leaves
    dependencies to the next full cycle.

    Refused whole (StaleEpoch) unless `epoch` is the newest issued and not yet applied. Within it, a placement
    whose job is no longer pending, whose node is no longer ready, or that the GPU ledger refuses is skipped
    (recorded in `conflicts`; the job stays pending for the next cycle). Browsers are told after commit; agents
    by the desired-state sync that follows the cycle.
    """
    result = ApplyResult(epoch=epoch)
    with transaction.atomic():
        epoch_claim(epoch, full_pending=full_pending)
        decisions = array_tasks_split(decisions)  # the array tasks placed become rows (cycle/arrays.py)

        placement_nodes = {a.node for p in decisions.placements for a in p.assignments}
        eviction_ids = [int(e.job_id) for e in decisions.evictions]
        placement_ids = [int(p.job_id) for p in decisions.placements]
        # What each victim holds, read once: the nodes to tell and the GPUs its preemptor waits for.
        victim_nodes_of: dict[int, set[str]] = {}
        victim_pct_of: dict[int, int] = {}
        for job_id, node_name, pct in Slice.objects.filter(job_id__in=eviction_ids).values_list(
            "job_id", "gpu__node__name", "compute_pct"
        ):
            victim_nodes_of.setdefault(job_id, set()).add(node_name)
            victim_pct_of[job_id] = victim_pct_of.get(job_id, 0) + pct
        victim_nodes = set().union(*victim_nodes_of.values())
        nodes = {n.name: n for n in lock_objects.nodes_for_placement(names=placement_nodes | victim_nodes)}
        jobs = {j.pk: j for j in lock_objects.jobs_for_update(ids=eviction_ids + placement_ids)}
        # A gang with a failed member is ending already (failed): evicting it would requeue a failed job.
        ending = gangs_failing(job_ids=eviction_ids) if eviction_ids else set()

        freed: dict[int, _Freed] = {}
        for ev in decisions.evictions:
            job = jobs.get(int(ev.job_id))
            if job is None or job.state not in ACTIVE_STATES or job.pk in ending:
                continue
            on_nodes = victim_nodes_of.get(job.pk, set())
            for_whom = freed.setdefault(int(ev.preemptor_id), _Freed(code=ev.code or "preempted"))
            team = job.team.slug
            for_whom.gpus_by_team[team] = (
                for_whom.gpus_by_team.get(team, 0.0) + victim_pct_of.get(job.pk, 0) / 100
            )
            for_whom.grace_s = max(for_whom.grace_s, ev.grace_s)
            data = {
                "preemptor": ev.preemptor_id,
                "grace_s": ev.grace_s,
                "nodes": sorted(on_nodes),
                "epoch": epoch,
            }
            if ev.code == MOVED:
                for_whom.moved += 1
                message = (
                    f"{_moved_words(ev)}; {ev.grace_s:g} s grace before SIGKILL, then it restarts there."
                )
                data |= {"to_nodes": list(ev.to_nodes), "why": ev.why}
            else:
                verb = "Reclaimed for" if ev.code == "reclaimed" else "Preempted by"
                message = f"{verb} job #{ev.preemptor_id}; {ev.grace_s:g} s grace before SIGKILL."
            job_transition(
                job=job,
                to_state=JobState.PREEMPTED,
                actor_kind=ActorKind.SCHEDULER,
                code=ev.code or "preempted",
                message=message,
                data=data,
            )
            if ev.code == MOVED:
                job_moving(job=job, until=datetime.now(tz=UTC) + timedelta(seconds=ev.grace_s))
            result.evicted.append(job.pk)

        gpus = _gpus_of(nodes=[nodes[name] for name in placement_nodes if name in nodes])
        ready = {n for n, node in nodes.items() if node.state == NodeState.READY}
        order = {p.job_id: k for k, p in enumerate(decisions.placements)}
        batch: list[tuple[PlacementWrite, eng.Placement]] = []
        one_by_one: list[tuple[Job, eng.Placement]] = []
        for placement in decisions.placements:
            job = jobs.get(int(placement.job_id))
            if job is None or job.state != JobState.PENDING:
                result.conflicts[int(placement.job_id)] = "no longer pending"
                continue
            unready = sorted({a.node for a in placement.assignments} - ready)
            if unready:
                result.conflicts[job.pk] = f"node {', '.join(unready)} is no longer ready"
                continue
            write = _placement_write(job, placement, gpus, epoch, freed.get(job.pk))
            if write is None:
                one_by_one.append((job, placement))
            else:
                batch.append((write, placement))
        # Single-node placements in one set-based write; if the ledger refuses any card, one at a time instead
        # (gangs always), each in its own savepoint, so only the refused placement is skipped.
        if batch and jobs_place(placements=[w for w, _ in batch]):
            result.placed += [w.job.pk for w, _ in batch]
        else:
            one_by_one += [(w.job, p) for w, p in batch]
        for job, placement in sorted(one_by_one, key=lambda jp: order[jp[1].job_id]):
            try:
                with transaction.atomic():
                    _place(job, placement, gpus, epoch, freed.get(job.pk))
            except (SliceDoesNotFit, NoRendezvousPort) as exc:
                job.refresh_from_db()
                result.conflicts[job.pk] = exc.message
                continue
            result.placed.append(job.pk)

        result.relabelled = _write_borrowed(decisions.borrowed)
        full = full_pending is not None
        held = _held_by_dependencies(placed=set(result.placed)) if full else {}
        result.pending_updated = _write_pending(
            decisions, placed=set(result.placed), conflicts=result.conflicts, held=held, full=full
        )
        if result.placed or result.evicted:
            _fault_point("commit", f"with placements {result.placed} and evictions {result.evicted} written")
    return result


def _gpus_of(*, nodes: list[Node]) -> dict[tuple[str, int], Gpu]:
    """The cards of these (locked) nodes by (node name, index), with what the ledger's guard reads: 4,000 cards
    with their nodes joined took a fifth of a second at 1,000 nodes, for columns the apply never reads."""
    by_id = {node.pk: node for node in nodes}
    gpus = {}
    for gpu in (
        Gpu.objects.filter(node_id__in=list(by_id))
        .order_by()
        .only(
            "node_id",
            "index",
            "memory_mib",
            "sharing_mode",
            "compute_capacity_pct",
            "allocated_memory_mib",
            "allocated_compute_pct",
        )
    ):
        gpu.node = by_id[gpu.node_id]
        gpus[(gpu.node.name, gpu.index)] = gpu
    return gpus


def _write_borrowed(borrowed: frozenset[str]) -> int:
    """The running jobs' "on borrowed capacity" labels, as the cycle left their teams standing (only changes are
    written; browsers hear of them after commit)."""
    ids = {int(j) for j in borrowed}
    active = Job.objects.filter(state__in=ACTIVE_STATES)
    now_borrowed = list(active.filter(borrowed=False, pk__in=ids).values_list("pk", "team_id", "state"))
    now_within = list(active.filter(borrowed=True).exclude(pk__in=ids).values_list("pk", "team_id", "state"))
    if now_borrowed:
        Job.objects.filter(pk__in=[pk for pk, _, _ in now_borrowed]).update(borrowed=True)
    if now_within:
        Job.objects.filter(pk__in=[pk for pk, _, _ in now_within]).update(borrowed=False)
    events.jobs_changed(
        changes=[
            (pk, team_id, None, state, "borrowed-label", "")
            for pk, team_id, state in now_borrowed + now_within
        ]
    )
    return len(now_borrowed) + len(now_within)


def _held_by_dependencies(*, placed: set[int]) -> dict[int, tuple[str, str]]:
    """The pending jobs that wait for other jobs (or as singletons), with their reasons; those whose dependency
    can never be met end now, failed as `dependency_never_satisfied`, their owner told."""
    holds = dependency_holds()
    never = Job.objects.select_for_update(of=("self",)).filter(
        pk__in=list(holds.never), state=JobState.PENDING
    )
    for job in never.order_by("id") if holds.never else ():
        if job.pk not in placed:
            job_dependency_never_met(job=job, why=holds.never[job.pk])
    return holds.waiting


def _write_pending(
    decisions: eng.Decisions,
    *,
    placed: set[int],
    conflicts: dict[int, str],
    held: dict[int, tuple[str, str]] | None = None,
    full: bool = True,
) -> int:
    """Pending reasons, queue positions and estimated starts, written only where they changed. An incremental
    pass (`full` False) ranked only part of the queue: it reads and writes just the jobs it saw, positions kept."""
    wanted: dict[int, tuple[str, str, int | None, datetime | None]] = {}
    for p in decisions.pending:
        eta = datetime.fromtimestamp(p.estimated_start, tz=UTC) if p.estimated_start is not None else None
        wanted[int(p.job_id)] = (p.status.code[:50], p.status.reason, p.position, eta)
    for job_id, (code, reason) in (held or {}).items():
        wanted[job_id] = (
            code,
            reason,
            None,
            None,
        )  # not in the queue's order until what it waits for happens
    seen = None if full else set(wanted) | placed | set(conflicts)
    _write_reserved(decisions, placed=placed, seen=seen)
    for job_id, why in conflicts.items():
        if job_id not in wanted:
            wanted[job_id] = (
                "conflict",
                f"Its placement was refused ({why}); retrying next cycle.",
                None,
                None,
            )
    wanted = {k: v for k, v in wanted.items() if k not in placed}
    if not wanted:
        return 0
    changed: list[tuple[int, str, str, int | None, datetime | None]] = []
    # Read without locking, as plain values: at 20,000 pending, locking every row (a write to each) or building
    # model instances cost more than writing the few that changed. The write re-checks that each is still pending.
    # Every pending job is read, and those the cycle did not see skipped: naming the 20,000 it saw made a statement
    # of 20,000 placeholders, which took longer to build and parse than to answer.
    rows = Job.objects.filter(state=JobState.PENDING)
    if not full:
        rows = rows.filter(pk__in=list(wanted))
    rows = rows.order_by("id").values_list(
        "pk",
        "team_id",
        "submitter_id",
        "state",
        "pending_reason_code",
        "pending_reason",
        "queue_position",
        "estimated_start_at",
    )
    told: list[tuple[int, int, int | None, str, str, str]] = []
    now = datetime.now(tz=UTC)
    for pk, team_id, submitter_id, state, code_was, reason_was, position_was, eta_was in rows:
        if pk not in wanted:
            continue  # submitted after the cycle's snapshot
        code, reason, position, eta = wanted[pk]
        if not full:
            position = position_was
        if eta is not None:
            eta = eta.replace(microsecond=0)
        if (code, reason, position) == (code_was, reason_was, position_was) and _eta_same(eta_was, eta, now):
            continue
        changed.append((pk, code, reason, position, eta))
        if code_was != code:
            told.append((pk, team_id, submitter_id, state, code, reason))
    _update_pending_rows(changed)
    events.jobs_changed(changes=told)
    return len(changed)


def _write_reserved(decisions: eng.Decisions, *, placed: set[int], seen: set[int] | None = None) -> None:
    """Each waiting job's reservation as the next cycle reads it (`reserved_nodes`): the nodes it holds now, kept
    while they make sense. Only changes are written; a job placed or no longer holding one gets an empty list.
    `seen`: the jobs an incremental pass saw (None: all); the others' reservations are left as they are."""
    now = {
        int(r.job_id): sorted({a.node for a in r.assignments})
        for r in decisions.reservations
        if int(r.job_id) not in placed
    }
    held = dict(
        Job.objects.filter(state=JobState.PENDING)
        .exclude(reserved_nodes=[])
        .values_list("id", "reserved_nodes")
    )
    if seen is not None:
        held = {pk: nodes for pk, nodes in held.items() if pk in seen}
    changed = {pk: nodes for pk, nodes in now.items() if held.get(pk) != nodes}
    changed |= {pk: [] for pk in held if pk not in now}
    for pk, nodes in changed.items():
        Job.objects.filter(pk=pk, state=JobState.PENDING).update(reserved_nodes=nodes)


# An estimated start is rewritten only when it moves by more than this, or by more than ETA_TOLERANCE_SHARE of the
# wait still ahead: it is "roughly when", recomputed each cycle from a clock that moved on, so without a tolerance
# every queued job's row was rewritten every cycle (18,000 rows, 2.3 s of a cycle's apply at 20,000 pending).
ETA_TOLERANCE_S = 60.0
ETA_TOLERANCE_SHARE = 0.1


def _eta_same(was: datetime | None, now_eta: datetime | None, now: datetime) -> bool:
    if was is None or now_eta is None:
        return was is now_eta
    ahead_s = max(0.0, (was - now).total_seconds())
    return abs((now_eta - was).total_seconds()) <= max(ETA_TOLERANCE_S, ETA_TOLERANCE_SHARE * ahead_s)


def _update_pending_rows(rows: list[tuple[int, str, str, int | None, datetime | None]]) -> None:
    """Write (id, code, reason, position, eta) rows with update_from_values (on PostgreSQL one UPDATE ... FROM
    unnest(...)): a queue's positions move for every job behind a placed one, so a cycle at 20,000 pending rewrites
    most of them, and Django's bulk_update (a CASE per column per row) took seconds for that."""
    if not rows:
        return
    update_from_values(
        Job,
        ["pending_reason_code", "pending_reason", "queue_position", "estimated_start_at"],
        rows,
        where=f"t.state = '{JobState.PENDING}'",  # a job placed or cancelled since it was read keeps its row
    )
