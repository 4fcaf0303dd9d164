"""Submitting a job: the row a spec makes, the spec a job was submitted with, and `job_submit` (the queue's one
way in)."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from quotas.models import PriorityClass, Team
from quotas.selectors import team_allowance
from scheduling.choices import ActorKind, JobState
from scheduling.cycle.requests import cycle_request_after_commit
from scheduling.errors import ServiceError
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job, JobEvent
from scheduling.jobs.transitions import job_change_log_on_commit
from scheduling.jobs.validation import job_spec_validate_for_team
from scheduling.realtime import events


def job_from_spec(
    *, submitter: AbstractBaseUser, team: Team, spec: JobSpec, priority_class: PriorityClass
) -> Job:
    """The job row a spec makes (not saved): submit stores it, the what-if asks the engine about it."""
    return Job(
        team=team,
        submitter=submitter,
        name=spec.name,
        command=spec.command,
        env=dict(spec.env),
        gpus=spec.gpus,
        gpu_memory_mib=spec.gpu_memory_mib,
        compute_pct=spec.compute_pct,
        gpu_models=list(spec.gpu_models),
        min_gpu_memory_mib=spec.min_gpu_memory_mib,
        min_compute_capability=spec.min_compute_capability,
        topology=spec.topology,
        nodes=spec.nodes,
        cpu_milli=spec.cpu_milli,
        memory_mib=spec.memory_mib,
        priority_class=priority_class,
        preemptible=priority_class.preemptible if spec.preemptible is None else spec.preemptible,
        max_runtime_s=spec.max_runtime_s,
        checkpoint_interval_s=spec.checkpoint_interval_s,
        requeue_on_node_loss=spec.requeue_on_node_loss,
        workdir=spec.workdir,
        notify=None if spec.notify is None else list(spec.notify),
    )


def job_spec_of(job: Job) -> JobSpec:
    """The spec that submits this job again (its priority class by name): job_from_spec's inverse."""
    return JobSpec(
        name=job.name,
        command=job.command,
        env=dict(job.env or {}),
        gpus=job.gpus,
        gpu_memory_mib=job.gpu_memory_mib,
        compute_pct=job.compute_pct,
        gpu_models=tuple(job.gpu_models or ()),
        min_gpu_memory_mib=job.min_gpu_memory_mib,
        min_compute_capability=job.min_compute_capability,
        topology=job.topology,
        nodes=job.nodes,
        cpu_milli=job.cpu_milli,
        memory_mib=job.memory_mib,
        priority=job.priority_class.name,
        preemptible=job.preemptible,
        max_runtime_s=job.max_runtime_s,
        checkpoint_interval_s=job.checkpoint_interval_s,
        requeue_on_node_loss=job.requeue_on_node_loss,
        workdir=job.workdir,
        notify=None if job.notify is None else tuple(job.notify),
    )


@transaction.atomic
def job_submit(*, submitter: AbstractBaseUser, team: Team, spec: JobSpec) -> Job:
    """Accept a job into the queue. A job within the cluster and its team's limits but over quota now is accepted
    and waits."""
    allowance = team_allowance(team=team, user=submitter)
    if not submitter.is_staff and not allowance.is_member:
        raise ServiceError(f"You are not a member of team {team.slug}.", field="team", code="not_member")
    priority_class = job_spec_validate_for_team(spec=spec, team=team, allowance=allowance)
    job = job_from_spec(submitter=submitter, team=team, spec=spec, priority_class=priority_class)
    job.pending_reason_code, job.pending_reason = "queued", "Waiting for the next scheduling cycle."
    job.save(force_insert=True)
    event = JobEvent.objects.create(
        job=job,
        from_state="",
        to_state=JobState.PENDING,
        actor_kind=ActorKind.USER,
        actor=submitter,
        code="submitted",
        message=f"Submitted by {submitter} to {team.slug}.",
    )
    job_change_log_on_commit(
        job_id=job.id, from_state="", to_state=job.state, code="submitted", message=event.message
    )
    events.job_changed(
        job_id=job.id, team_id=team.id, submitter_id=submitter.pk, state=job.state, code="submitted"
    )
    cycle_request_after_commit()
    return job
