"""Submitting a job: the row a spec makes, the spec a job was submitted with, and `job_submit` (the queue's one
way in)."""

from __future__ import annotations

import secrets

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from quotas.models import PriorityClass, Team
from quotas.selectors import team_allowance
from scheduling.choices import ActorKind, JobState
from scheduling.cycle.requests import cycle_request_after_commit
from scheduling.errors import ServiceError
from scheduling.jobs.array_indexes import ArraySpec
from scheduling.jobs.dependencies import dependencies_check
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job, JobDependency, JobEvent
from scheduling.jobs.selectors import jobs_visible_to
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
        singleton=spec.singleton,
        kind=spec.kind,
        ports=[[name, port] for name, port in spec.ports],
        session_token=secrets.token_urlsafe(32) if spec.ports else "",
        image=spec.image,
        mounts=list(spec.mounts),
        **_array_fields(spec),
    )


def _array_fields(spec: JobSpec) -> dict:
    """An array's columns on its first row: every task pending, as runs (one task: that row is the task)."""
    if not spec.array:
        return {}
    array = ArraySpec.parse(spec.array)
    only = array.indexes.first(2)
    return {
        "array_spec": array.written(),
        "array_pending": array.indexes.written() if len(only) > 1 else "",
        "array_task_id": only[0] if len(only) == 1 else None,
        "array_task_count": len(array.indexes),
        "array_max_running": array.max_running,
    }


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
        # The whole array again from its first row; one of its tasks alone from the others.
        array=job.array_spec if job.array_job_id is not None and job.array_job_id == job.pk else "",
        depends_on=tuple(job.dependencies.order_by("id").values_list("on_id", "when")) if job.pk else (),
        singleton=job.singleton,
        kind=job.kind,
        ports=tuple((str(name), int(port)) for name, port in job.ports or ()),
        image=job.image,
        mounts=tuple(job.mounts or ()),
    )


@transaction.atomic
def job_submit(*, submitter: AbstractBaseUser, team: Team, spec: JobSpec) -> Job:
    """Accept a job into the queue. A job within the cluster and its team's limits but over quota now is accepted
    and waits."""
    allowance = team_allowance(team=team, user=submitter)
    if not submitter.is_staff and not allowance.is_member:
        raise ServiceError(f"You are not a member of team {team.slug}.", field="team", code="not_member")
    priority_class = job_spec_validate_for_team(spec=spec, team=team, allowance=allowance)
    if spec.depends_on:
        named = [job_id for job_id, _ in spec.depends_on]
        visible = jobs_visible_to(user=submitter).filter(pk__in=named).values_list("pk", flat=True)
        tasks = ArraySpec.parse(spec.array).indexes if spec.array else None
        dependencies_check(depends_on=spec.depends_on, visible=visible, tasks=tasks)
    job = job_from_spec(submitter=submitter, team=team, spec=spec, priority_class=priority_class)
    job.pending_reason_code, job.pending_reason = "queued", "Waiting for the next scheduling cycle."
    job.save(force_insert=True)
    if spec.depends_on:
        JobDependency.objects.bulk_create(
            [JobDependency(job=job, on_id=job_id, when=when) for job_id, when in spec.depends_on]
        )
    what = ""
    if job.array_spec:
        job.array_job_id = job.pk
        job.save(update_fields=["array_job_id"])
        what = f": an array of {job.array_task_count:,} tasks ({job.array_spec})"
    event = JobEvent.objects.create(
        job=job,
        from_state="",
        to_state=JobState.PENDING,
        actor_kind=ActorKind.USER,
        actor=submitter,
        code="submitted",
        message=f"Submitted by {submitter} to {team.slug}{what}.",
    )
    job_change_log_on_commit(
        job_id=job.id, from_state="", to_state=job.state, code="submitted", message=event.message
    )
    events.job_changed(
        job_id=job.id, team_id=team.id, submitter_id=submitter.pk, state=job.state, code="submitted"
    )
    cycle_request_after_commit()
    return job
