"""Shapes of jobs, queue entries, events, logs and usage in the API.

Serializers only shape data: submit parsing is scheduling.jobs.spec's, writes are scheduling.jobs.submit's and
transitions'.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from scheduling.choices import JobKind, JobState
from scheduling.jobs.array_indexes import TASKS_PATTERN
from scheduling.jobs.fields import MAX_ARRAY_CHARS
from scheduling.jobs.models import Job, JobEvent
from scheduling.jobs.selectors import (
    ArraySummary,
    array_summaries,
    can_cancel_job,
    job_request_fields,
    jobs_node_silence,
    pending_reason,
)
from scheduling.jobs.sessions import session_links
from scheduling.jobs.spec import spec_to_mapping
from scheduling.jobs.submit import job_spec_of


class JobRequestSerializer(serializers.Serializer):
    gpus = serializers.IntegerField()
    gpu_memory_mib = serializers.IntegerField()
    compute_pct = serializers.IntegerField()
    gpu_models = serializers.ListField(child=serializers.CharField())
    min_gpu_memory_mib = serializers.IntegerField()
    min_compute_capability = serializers.DecimalField(max_digits=3, decimal_places=1)
    topology = serializers.CharField()
    nodes = serializers.IntegerField()
    cpu_milli = serializers.IntegerField()
    memory_mib = serializers.IntegerField()
    max_runtime_s = serializers.IntegerField(allow_null=True)
    checkpoint_interval_s = serializers.IntegerField(
        allow_null=True, help_text="How often the job checkpoints; null: an eviction loses all its work."
    )


class NodeConditionSerializer(serializers.Serializer):
    code = serializers.ChoiceField(
        choices=["node_not_responding", "releasing"],
        help_text="node_not_responding: the job's node has been silent past the node-lost timeout; releasing: "
        "the job has ended and its cards there wait for its stop to be confirmed.",
    )
    node = serializers.CharField()
    since = serializers.DateTimeField(help_text="When the portal last heard the node.")
    until = serializers.DateTimeField(
        help_text="When the job has surely stopped there, if the node stays silent."
    )
    message = serializers.CharField()


class JobArraySerializer(serializers.Serializer):
    id = serializers.IntegerField(
        help_text="The array's id: its line's job id (?array=<id> lists its tasks)."
    )
    task_id = serializers.IntegerField(
        allow_null=True,
        help_text="This task's index (TESSERA_ARRAY_TASK_ID); null on the line of tasks to come.",
    )
    tasks = serializers.CharField(help_text="The tasks as submitted, e.g. 0-999%50.")
    task_count = serializers.IntegerField()
    max_running = serializers.IntegerField(allow_null=True, help_text="At most this many run at once (%N).")
    counts = serializers.DictField(
        child=serializers.IntegerField(),
        allow_null=True,
        help_text="On the array's line: every task counted once, by state (tasks not yet placed are pending).",
    )


class JobCancelSerializer(serializers.Serializer):
    # Runs as the schema can say them; what it cannot (a range that runs backwards, a task named twice) is
    # refused by the view with the code `array_syntax`.
    tasks = serializers.RegexField(
        TASKS_PATTERN,
        required=False,
        max_length=MAX_ARRAY_CHARS,
        help_text="Only these tasks of the array, e.g. 3-7 or 1,4,9 (else an array's line cancels all of it).",
        error_messages={"invalid": "tasks are written 3-7, 0-99:10 or 1,4,9."},
    )


class JobShareSerializer(serializers.Serializer):
    shared = serializers.BooleanField(
        help_text="true: the job's team may open its web ports; false: only you."
    )


class JobPortSerializer(serializers.Serializer):
    name = serializers.CharField()
    port = serializers.IntegerField(help_text="The port asked for (its node may have given another).")
    path = serializers.CharField(help_text="Where the portal serves it: /jobs/<id>/open/<name>/.")
    state = serializers.ChoiceField(choices=["ready", "starting", "waiting", "ended"])


class JobSerializer(serializers.Serializer):
    """A job as lists show it. Declared field by field (not a ModelSerializer): submit answers with it, and
    building model fields on every request costs more than the rest of the serialisation."""

    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    team = serializers.CharField(source="team.slug", read_only=True)
    team_id = serializers.IntegerField(read_only=True)
    user = serializers.CharField(source="submitter.username", read_only=True)
    state = serializers.ChoiceField(choices=JobState.choices, read_only=True)
    command = serializers.CharField(read_only=True)
    request = serializers.SerializerMethodField()
    priority = serializers.CharField(source="priority_class.name", read_only=True)
    priority_value = serializers.IntegerField(source="priority_class.value", read_only=True)
    preemptible = serializers.BooleanField(read_only=True)
    borrowed = serializers.BooleanField(read_only=True, help_text="Runs on borrowed capacity: reclaimable.")
    attempt = serializers.IntegerField(read_only=True)
    submitted_at = serializers.DateTimeField(read_only=True)
    placed_at = serializers.DateTimeField(read_only=True, allow_null=True)
    started_at = serializers.DateTimeField(read_only=True, allow_null=True)
    finished_at = serializers.DateTimeField(read_only=True, allow_null=True)
    exit_code = serializers.IntegerField(read_only=True, allow_null=True)
    pending_reason_code = serializers.SerializerMethodField()
    pending_reason = serializers.SerializerMethodField()
    queue_position = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="Place in the queue at the last scheduling cycle."
    )
    estimated_start_at = serializers.DateTimeField(read_only=True, allow_null=True)
    node_condition = serializers.SerializerMethodField(
        help_text="Set while the job's node is silent (the job may still run there), or while an ended job's cards "
        "on a silent node are being released; null otherwise."
    )
    array = serializers.SerializerMethodField(
        help_text="Null unless the job is an array or one of its tasks."
    )
    kind = serializers.ChoiceField(choices=JobKind.choices, read_only=True)
    image = serializers.CharField(
        read_only=True, help_text="The container image it runs in; blank: it runs on its node itself."
    )
    mounts = serializers.ListField(
        child=serializers.CharField(), read_only=True, help_text="Its team's mounts it asked for, by name."
    )
    ports = serializers.SerializerMethodField(
        help_text="Its web ports: each opened at `path` on the portal (by its owner, and its team when "
        "`session_shared`); `state` ready (its server answers), starting, waiting (the job is not running yet) "
        "or ended."
    )
    session_shared = serializers.BooleanField(read_only=True)
    idle_reclaim_at = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="Set once the job was warned that its GPUs sit idle: when they are given back (a session "
        "stopped, a batch job requeued while others wait) unless used again; null otherwise.",
    )

    @extend_schema_field(JobPortSerializer(many=True))
    def get_ports(self, job: Job) -> list[dict[str, Any]]:
        return job_ports_fields(job)

    def get_pending_reason_code(self, job: Job) -> str:
        """Why it waits, as a code; scheduler_stalled when no scheduling cycle ran for three intervals."""
        return pending_reason(job)[0]

    def get_pending_reason(self, job: Job) -> str:
        return pending_reason(job)[1]

    @extend_schema_field(JobRequestSerializer)
    def get_request(self, job: Job) -> dict[str, Any]:
        return job_request_fields(job)  # already in its JSON form (see JobRequestSerializer)

    @extend_schema_field(NodeConditionSerializer(allow_null=True))
    def get_node_condition(self, job: Job) -> dict[str, Any] | None:
        if job.state in (JobState.PENDING, JobState.PREEMPTED, JobState.LOST):
            return None  # holds no cards
        # Read once per response for all the jobs it lists: the silent nodes, then which of the jobs are on them.
        conditions = self.context.get("node_conditions") if isinstance(self.context, dict) else None
        if conditions is None or job.pk not in conditions["asked"]:
            listed = getattr(self.parent, "instance", None) if self.parent is not None else None
            jobs = list(listed) if listed is not None and job in listed else [job]
            conditions = {"asked": {j.pk for j in jobs}, "found": jobs_node_silence(jobs=jobs)}
            if isinstance(self.context, dict):
                self.context["node_conditions"] = conditions
        condition = conditions["found"].get(job.pk)
        return None if condition is None else NodeConditionSerializer(condition.as_dict()).data

    @extend_schema_field(JobArraySerializer(allow_null=True))
    def get_array(self, job: Job) -> dict[str, Any] | None:
        if job.array_job_id is None or job.array_job_id != job.pk:
            return job_array_fields(job, None)
        # The array's line: its tasks counted by state, read once per response for every array it lists.
        summaries = self.context.get("array_summaries") if isinstance(self.context, dict) else None
        if summaries is None or job.pk not in summaries:
            listed = getattr(self.parent, "instance", None) if self.parent is not None else None
            jobs = list(listed) if listed is not None and job in listed else [job]
            summaries = array_summaries(jobs=jobs)
            if isinstance(self.context, dict):
                self.context["array_summaries"] = summaries
        return job_array_fields(job, summaries[job.pk])


def job_array_fields(job: Job, summary: ArraySummary | None) -> dict[str, Any] | None:
    """A job's `array` (JobArraySerializer): None unless it is an array or one of its tasks; counts on the
    array's line."""
    if job.array_job_id is None:
        return None
    return {
        "id": job.array_job_id,
        "task_id": job.array_task_id,
        "tasks": job.array_spec,
        "task_count": job.array_task_count,
        "max_running": job.array_max_running,
        "counts": summary.counts if summary is not None else None,
    }


_DATETIME = serializers.DateTimeField()


def _moment(value: Any) -> str | None:
    return None if value is None else _DATETIME.to_representation(value)


def job_ports_fields(job: Job) -> list[dict[str, Any]]:
    """A job's `ports` (JobPortSerializer's fields)."""
    asked = {str(name): int(port) for name, port in job.ports or ()}
    return [
        {"name": link.name, "port": asked[link.name], "path": link.path, "state": link.state}
        for link in session_links(job)
    ]


def job_payload(job: Job) -> dict[str, Any]:
    """`JobSerializer(job).data` without building a serializer: the submit response, on the hot path.

    A test holds the two equal field for field."""
    return {
        "id": job.id,
        "name": job.name,
        "team": job.team.slug,
        "team_id": job.team_id,
        "user": job.submitter.username,
        "state": job.state,
        "command": job.command,
        "request": job_request_fields(job),
        "priority": job.priority_class.name,
        "priority_value": job.priority_class.value,
        "preemptible": job.preemptible,
        "borrowed": job.borrowed,
        "attempt": job.attempt,
        "submitted_at": _moment(job.submitted_at),
        "placed_at": _moment(job.placed_at),
        "started_at": _moment(job.started_at),
        "finished_at": _moment(job.finished_at),
        "exit_code": job.exit_code,
        "pending_reason_code": pending_reason(job)[0],
        "pending_reason": pending_reason(job)[1],
        "queue_position": job.queue_position,
        "estimated_start_at": _moment(job.estimated_start_at),
        "node_condition": None,  # a job just submitted holds no cards
        "array": job_array_fields(job, array_summaries(jobs=[job]).get(job.pk)),
        "kind": job.kind,
        "image": job.image,
        "mounts": list(job.mounts or ()),
        "ports": job_ports_fields(job),
        "session_shared": job.session_shared,
        "idle_reclaim_at": _moment(job.idle_reclaim_at),
    }


class JobSliceSerializer(serializers.Serializer):
    node = serializers.CharField(source="gpu.node.name")
    gpu_index = serializers.IntegerField(source="gpu.index")
    gpu_uuid = serializers.CharField(source="gpu.uuid")
    gpu_model = serializers.CharField(source="gpu.model.name")
    memory_mib = serializers.IntegerField()
    compute_pct = serializers.IntegerField()


class JobDetailSerializer(JobSerializer):
    env = serializers.DictField(child=serializers.CharField(), read_only=True)
    requeue_on_node_loss = serializers.BooleanField(read_only=True)
    workdir = serializers.CharField(read_only=True)
    notify = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        allow_null=True,
        help_text="Events the submitter is told of; null: their default.",
    )
    slices = JobSliceSerializer(many=True, read_only=True)
    spec = serializers.SerializerMethodField(help_text="The job as a spec, for 'copy & edit'.")
    can_cancel = serializers.SerializerMethodField()

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_spec(self, job: Job) -> dict[str, Any]:
        spec = job_spec_of(job)
        return spec_to_mapping(spec, team=job.team.slug)

    def get_can_cancel(self, job: Job) -> bool:
        request = self.context.get("request")
        return bool(request and can_cancel_job(user=request.user, job=job))


class JobSubmitSerializer(serializers.Serializer):
    """The job spec as JSON (YAML is accepted too with Content-Type: application/yaml). Sizes take units."""

    name = serializers.CharField(max_length=200)
    team = serializers.CharField(required=False, help_text="Team slug; optional when you are in one team.")
    command = serializers.JSONField(help_text="A shell command, or a list of arguments.")
    env = serializers.DictField(child=serializers.CharField(), required=False)
    gpus = serializers.IntegerField(required=False, min_value=0, help_text="Whole GPUs per node.")
    gpu_memory = serializers.CharField(
        required=False, help_text="Per GPU slice, e.g. '10GiB', '512MiB', '80GB'."
    )
    compute_pct = serializers.IntegerField(required=False, min_value=0, max_value=100)
    gpu_models = serializers.ListField(child=serializers.CharField(), required=False)
    min_gpu_memory = serializers.CharField(required=False, help_text="e.g. '40GiB'")
    min_compute_capability = serializers.CharField(required=False, help_text="e.g. '8.0'")
    topology = serializers.ChoiceField(choices=["none", "numa", "nvlink"], required=False)
    nodes = serializers.IntegerField(required=False, min_value=1)
    cpu = serializers.CharField(required=False, help_text="Cores ('4', '0.5') or millicores ('500m').")
    memory = serializers.CharField(required=False, help_text="Host memory per node, e.g. '64GiB'.")
    priority = serializers.CharField(required=False)
    preemptible = serializers.BooleanField(required=False)
    max_runtime = serializers.CharField(required=False, help_text="e.g. '2h', '30m', '90s', '1h30m'.")
    checkpoint_interval = serializers.CharField(
        required=False,
        help_text="How often the job checkpoints, 1m-7d in whole seconds, e.g. '30m', '2h' or '600' (seconds): "
        "preemption and reclaim prefer victims that lose the least work.",
    )
    requeue_on_node_loss = serializers.BooleanField(required=False)
    workdir = serializers.CharField(
        required=False, help_text="Absolute directory the job starts in on its node (default: the agent's)."
    )
    notify = serializers.CharField(
        required=False,
        help_text="Tell the submitter when it starts, ends, fails or is preempted: 'start,end,fail,preempt', "
        "'all' or 'none' (default: their own setting).",
    )


class JobEventSerializer(serializers.ModelSerializer):
    actor = serializers.SerializerMethodField()
    from_state = serializers.CharField(read_only=True, help_text="Empty for the submit event.")
    to_state = serializers.CharField(read_only=True)

    class Meta:
        model = JobEvent
        fields = ["id", "at", "from_state", "to_state", "actor_kind", "actor", "code", "message", "data"]
        read_only_fields = fields

    def get_actor(self, event: JobEvent) -> str | None:
        return event.actor.username if event.actor_id else None


# How the logs endpoint gives the bytes: as text (for reading), or exactly (base64).
LOG_ENCODINGS = ("text", "base64")


class JobLogSerializer(serializers.Serializer):
    job_id = serializers.IntegerField()
    stream = serializers.CharField()
    offset = serializers.IntegerField(help_text="Where `text` starts in the log, in bytes.")
    next_offset = serializers.IntegerField(help_text="Ask from here to follow the log.")
    size = serializers.IntegerField()
    encoding = serializers.ChoiceField(choices=LOG_ENCODINGS, help_text="As asked with ?encoding=.")
    text = serializers.CharField(
        allow_blank=True,
        required=False,
        help_text="encoding=text: the bytes as UTF-8, invalid bytes replaced.",
    )
    data = serializers.CharField(
        allow_blank=True, required=False, help_text="encoding=base64: the exact bytes, base64."
    )
    complete = serializers.BooleanField(
        help_text="The job has finished and its node's last lines have arrived: the log will not grow."
    )


class QueueEntrySerializer(serializers.Serializer):
    """A pending job as everyone sees it; name, user, command and id only for the caller's own teams."""

    position = serializers.IntegerField(
        help_text="Place in the whole queue (filters do not renumber it): the last scheduling cycle's, or, for a "
        "job no cycle has seen yet, after every positioned job in submit order."
    )
    mine = serializers.BooleanField(help_text="True when the job belongs to one of your teams.")
    id = serializers.IntegerField(allow_null=True)
    name = serializers.CharField(allow_null=True)
    user = serializers.CharField(allow_null=True)
    team = serializers.CharField(allow_null=True)
    priority = serializers.CharField()
    priority_value = serializers.IntegerField()
    request = JobRequestSerializer()
    gpu_equivalents = serializers.FloatField(allow_null=True)
    submitted_at = serializers.DateTimeField()
    wait_s = serializers.IntegerField()
    pending_reason_code = serializers.CharField(allow_blank=True)
    pending_reason = serializers.CharField(allow_blank=True, allow_null=True)
    pending_reason_general = serializers.CharField(
        help_text="Why it waits in general words, from the code alone: all another team's entry says of it."
    )
    estimated_start_at = serializers.DateTimeField(allow_null=True)


class UsageRowSerializer(serializers.Serializer):
    team = serializers.CharField(required=False)
    user = serializers.CharField(required=False)
    day = serializers.DateField(required=False)
    model = serializers.CharField(
        required=False, help_text="GPU model of the cards held; empty when not known."
    )
    gpu_hours = serializers.FloatField(help_text="Whole-GPU-equivalent hours: a quarter card for 4 h is 1.0.")
    gpu_memory_gib_hours = serializers.FloatField()
    jobs = serializers.IntegerField()
