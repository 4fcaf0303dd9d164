"""A gang member's final report: the gang succeeds once every member exited 0; at its first failure that member is
named, the others are stopped, and the job fails once all have ended."""

from __future__ import annotations

from typing import Any

from scheduling.agents.reports.outcome import Outcome
from scheduling.choices import ActorKind, GangMemberOutcome, JobState
from scheduling.inventory.models import Node
from scheduling.jobs.gangs import gang_member_end, gang_members_unstarted_stop
from scheduling.jobs.models import GangMember, Job
from scheduling.jobs.notes import job_note
from scheduling.jobs.selectors import gang_first_failure
from scheduling.jobs.transitions import job_transition
from scheduling.realtime import events


def _member_outcome(state: str, reason: str, exit_code: int | None, *, failing: bool) -> str | None:
    """How a member's final report ends it; None where the job's own rules apply instead (a member lost or
    stopped while its gang runs requeues the whole gang, as do GPUs the node does not have)."""
    if state == "exited" and exit_code == 0:
        return GangMemberOutcome.SUCCEEDED
    if state == "launch_failed" and reason.startswith("GPU(s) not on this node") and not failing:
        return None
    if state in ("killed", "launch_failed") or (state == "exited" and exit_code is not None):
        return GangMemberOutcome.FAILED
    return GangMemberOutcome.STOPPED if failing else None


def gang_member_end_apply(job: Job, node: Node, state: str, reason: str, data: dict) -> Outcome | None:
    """One member of a multi-node job ended. The gang succeeds once every member exited 0; at the first failure
    it is decided failed: that member is named, the other members' nodes drop the job (their agents stop theirs
    with the job's grace), and the job fails once all have ended. None: not a member's end (the job's rules)."""
    member = GangMember.objects.filter(job=job, attempt=job.attempt, node=node).select_related("node").first()
    if member is None:
        return None
    if member.outcome != GangMemberOutcome.RUNNING:
        return Outcome(True)  # a repeat, or a member already counted as stopped
    first_failure = gang_first_failure(job=job)
    exit_code = data.get("exit_code")
    outcome = _member_outcome(state, reason, exit_code, failing=first_failure is not None)
    if outcome is None:
        return None
    if job.state == JobState.PLACED:
        # Its start report was lost (an agent restart): record that it ran before recording how it ended.
        job_transition(
            job=job, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT, code="started", data=data
        )
    gang_member_end(member=member, outcome=outcome, reported_state=state, exit_code=exit_code, reason=reason)
    members = list(GangMember.objects.filter(job=job, attempt=job.attempt).select_related("node"))
    data = {**data, "rank": member.rank}
    if outcome == GangMemberOutcome.FAILED and first_failure is None:
        first_failure = member
        job.exit_code = exit_code
        job.save(update_fields=["exit_code"])
        stopped = gang_members_unstarted_stop(job=job)
        running = [m for m in members if m.outcome == GangMemberOutcome.RUNNING and m not in stopped]
        others = ", ".join(f"rank {m.rank} on {m.node.name}" for m in running) or "none still running"
        grace_s = job.priority_class.preemption_grace_s
        _gang_event(
            job,
            code="gang_member_failed",
            message=f"{member.describe()}: the gang fails. Stopping the other members ({others}) with "
            f"{grace_s:g} s grace.",
            data={**data, "stopping": [m.node.name for m in running], "grace_s": grace_s},
        )
        for m in running:
            events.node_desired_state_changed(node_name=m.node.name)
        members = list(GangMember.objects.filter(job=job, attempt=job.attempt).select_related("node"))
    still_running = [m for m in members if m.outcome == GangMemberOutcome.RUNNING]
    if still_running:
        if outcome == GangMemberOutcome.SUCCEEDED:
            _gang_event(
                job,
                code="gang_member_exited",
                message=f"{member.describe()}; waiting for {len(still_running)} more member(s).",
                data=data,
            )
        return Outcome(True, changed=True)
    ended = "; ".join(m.describe() for m in members)
    if first_failure is None:
        job.exit_code = 0
        job.save(update_fields=["exit_code"])
        job_transition(
            job=job,
            to_state=JobState.SUCCEEDED,
            actor_kind=ActorKind.AGENT,
            code="exited",
            message=f"All {len(members)} members exited with code 0 ({', '.join(m.node.name for m in members)}).",
            data={**data, "members": _members_data(members)},
        )
    else:
        job_transition(
            job=job,
            to_state=JobState.FAILED,
            actor_kind=ActorKind.AGENT,
            code="gang_failed",
            message=f"Failed: {first_failure.describe()}. All {len(members)} members have ended: {ended}.",
            data={
                **data,
                "failed_node": first_failure.node.name,
                "failed_rank": first_failure.rank,
                "exit_code": first_failure.exit_code,
                "members": _members_data(members),
            },
        )
    return Outcome(True, changed=True)


def _gang_event(job: Job, *, code: str, message: str, data: dict[str, Any]) -> None:
    """A gang member's end that moves the job nowhere yet: recorded, and shown to whoever follows the job."""
    job_note(job=job, code=code, message=message, actor_kind=ActorKind.AGENT, data=data)


def _members_data(members: list[GangMember]) -> list[dict[str, Any]]:
    return [
        {
            "node": m.node.name,
            "rank": m.rank,
            "outcome": m.outcome,
            "state": m.reported_state,
            "exit_code": m.exit_code,
        }
        for m in members
    ]
