"""Jobs, the slices of GPUs they hold, the members of a multi-node job's placement, and each job's audit trail."""

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from scheduling.choices import ActorKind, GangMemberOutcome, JobKind, JobState, Topology
from scheduling.inventory.models import Gpu, Node


class Job(models.Model):
    team = models.ForeignKey("quotas.Team", on_delete=models.PROTECT, related_name="jobs")
    submitter = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200)
    command = models.TextField()
    env = models.JSONField("environment", default=dict, blank=True)

    # The request. Whole GPUs (gpus >= 1) or one slice of one GPU (gpus == 0 with memory and/or compute).
    gpus = models.PositiveSmallIntegerField(
        "GPUs per node", default=0, help_text="Whole GPUs per node (0 for a slice)."
    )
    gpu_memory_mib = models.PositiveIntegerField(
        "slice GPU memory (MiB)", default=0, help_text="Slice: GPU memory on one GPU."
    )
    compute_pct = models.PositiveSmallIntegerField(
        "slice compute (%)",
        default=0,
        validators=[MaxValueValidator(100)],
        help_text="Slice: compute share of one GPU.",
    )
    gpu_models = models.JSONField(
        "GPU models", default=list, blank=True, help_text="Allowed GPU models; empty = any."
    )
    min_gpu_memory_mib = models.PositiveIntegerField("minimum GPU memory per card (MiB)", default=0)
    min_compute_capability = models.DecimalField(max_digits=3, decimal_places=1, default=Decimal("0"))
    topology = models.CharField(max_length=10, choices=Topology.choices, default=Topology.NONE)
    nodes = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1)], help_text="Gang size."
    )
    cpu_milli = models.PositiveIntegerField("CPU (millicores)", default=1000, help_text="Per node.")
    memory_mib = models.PositiveBigIntegerField(
        "host memory (MiB)", default=4096, help_text="Host memory per node."
    )
    priority_class = models.ForeignKey("quotas.PriorityClass", on_delete=models.PROTECT, related_name="jobs")
    preemptible = models.BooleanField(default=True)
    max_runtime_s = models.PositiveIntegerField("runtime limit (seconds)", null=True, blank=True)
    checkpoint_interval_s = models.PositiveIntegerField(
        "checkpoint interval (seconds)",
        null=True,
        blank=True,
        help_text="How often it checkpoints; empty: an eviction loses all its work. Victims that lose the least "
        "are preferred.",
    )
    notify = models.JSONField(
        null=True,
        blank=True,
        help_text="The events its owner is told of (start, end, fail, preempt); null: the owner's default.",
    )
    requeue_on_node_loss = models.BooleanField(
        default=True, help_text="Requeue (else fail) when its node is lost."
    )
    workdir = models.CharField(
        "working directory",
        max_length=4096,
        blank=True,
        help_text="Absolute directory it starts in on the node; empty: the agent's.",
    )

    # Where it stands.
    # Indexed with submitted_at (Meta.indexes), which serves lookups by state alone too.
    state = models.CharField(max_length=20, choices=JobState.choices, default=JobState.PENDING)
    submitted_at = models.DateTimeField(auto_now_add=True, help_text="Kept across requeues: queue age.")
    placed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    borrowed = models.BooleanField(default=False, help_text="Runs beyond its team's guarantee: reclaimable.")
    attempt = models.PositiveSmallIntegerField(default=0, help_text="Placements so far (requeues + 1).")
    moves = models.PositiveSmallIntegerField(
        default=0,
        help_text="Times it was moved to make room for a bigger job: not counted against its requeues.",
    )
    moving_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Being moved: it stops where it ran (its grace ends then) and restarts where its place is held.",
    )
    reserved_nodes = models.JSONField(
        default=list,
        blank=True,
        help_text="Pending: the nodes its reservation holds (kept while it makes sense).",
    )
    # A job array (scheduling/cycle/arrays.py): every row of one array carries its id (the first row's); the
    # first row also holds the tasks not yet placed, as runs (`array_pending`), until it becomes the last task.
    array_job_id = models.PositiveIntegerField("array", null=True, blank=True, db_index=True)
    array_task_id = models.PositiveIntegerField("array task", null=True, blank=True)
    array_spec = models.CharField("tasks of the array", max_length=10_000, blank=True)
    array_pending = models.TextField("array tasks not yet placed", blank=True)
    array_task_count = models.PositiveIntegerField("tasks in the array", null=True, blank=True)
    array_max_running = models.PositiveIntegerField("most tasks running at once", null=True, blank=True)
    singleton = models.BooleanField(
        default=False,
        help_text="Waits while an earlier job of its owner with its name is live (Slurm's singleton).",
    )
    kind = models.CharField(max_length=20, choices=JobKind.choices, default=JobKind.BATCH)
    # Web ports the job serves, [[name, port], ...] as asked; opened through the portal (frontend/sessions.py).
    ports = models.JSONField(default=list, blank=True)
    # The secret the session proxy sends as `Authorization: token ...` (the job's JUPYTER_TOKEN): made at submit
    # for a job with ports, never shown. Other jobs on the node lack it.
    session_token = models.CharField(max_length=64, blank=True, editable=False)
    # A container image it runs in (blank: on the node itself), and its team's mounts it asked for, by name.
    image = models.CharField(max_length=512, blank=True, default="")
    mounts = models.JSONField(default=list, blank=True)
    session_shared = models.BooleanField(
        "shared with the team", default=False, help_text="Its team's members may open its web ports too."
    )
    # Where its current attempt's ports are: {"attempt": n, "ports": {name: port on the node}, "ready": [names]}.
    ports_bound = models.JSONField(default=dict, blank=True)
    # Idle GPUs given back (scheduling/cycle/idle.py): when its owner last said "still using it" (the idle clock
    # counts from then), and, once warned of an idle spell, when its GPUs are given back unless it is used again.
    idle_reset_at = models.DateTimeField("still in use, said at", null=True, blank=True)
    idle_reclaim_at = models.DateTimeField("idle: given back at", null=True, blank=True)
    # A batch job requeued for idleness waits out of the engine's queue until then, so the work that waited for its
    # cards goes first (it would otherwise take them straight back at its own priority).
    hold_until = models.DateTimeField("held back until", null=True, blank=True)
    pending_reason_code = models.CharField("why it waits (code)", max_length=50, blank=True)
    pending_reason = models.TextField("why it waits", blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [
            models.Index(fields=["state", "submitted_at"], name="job_state_submitted"),
            # The history page's queue times: jobs started in a window, read from the index alone.
            # (Key columns rather than INCLUDE, which SQLite lacks: the same index-only scans on PostgreSQL.)
            models.Index(
                fields=["started_at", "submitted_at", "team"],
                condition=Q(started_at__isnull=False),
                name="job_started_at",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(nodes=1) | Q(gpus__gte=1),
                name="job_gang_needs_gpus",
            ),
            models.CheckConstraint(
                condition=Q(gpus=0) | (Q(gpu_memory_mib=0) & Q(compute_pct=0)),
                name="job_whole_or_slice",
            ),
            models.CheckConstraint(condition=Q(compute_pct__lte=100), name="job_compute_pct_at_most_100"),
            models.CheckConstraint(condition=Q(nodes__gte=1), name="job_nodes_at_least_1"),
            models.CheckConstraint(
                condition=Q(checkpoint_interval_s__isnull=True) | Q(checkpoint_interval_s__gt=0),
                name="job_checkpoint_interval_positive",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    @property
    def is_slice(self) -> bool:
        return self.gpus == 0 and (self.gpu_memory_mib > 0 or self.compute_pct > 0)


class Slice(models.Model):
    """A part of one GPU held by a job: the whole card for whole-GPU jobs."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="slices")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="slices", verbose_name="GPU")
    memory_mib = models.PositiveIntegerField("GPU memory (MiB)")
    compute_pct = models.PositiveSmallIntegerField("compute (%)")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "gpu"], name="slice_unique_job_gpu"),
            models.CheckConstraint(
                condition=Q(memory_mib__gt=0) | Q(compute_pct__gt=0), name="slice_not_empty"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job} on {self.gpu}: {self.memory_mib} MiB, {self.compute_pct}%"


class GangMember(models.Model):
    """One node of a multi-node job's current placement: its rank, the address its peers use, and how it ended.

    Rows live while the placement holds its slices (they go with them). Rank 0 holds the gang's rendezvous port
    (MASTER_PORT); no two live gangs rendezvous on the same address and port.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="gang_members")
    attempt = models.PositiveSmallIntegerField(help_text="The job's attempt this member belongs to.")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="gang_members")
    rank = models.PositiveSmallIntegerField(
        help_text="NODE_RANK: position in the gang, 0 = the rendezvous host."
    )
    address = models.CharField(max_length=253, help_text="The node's address when the gang was placed.")
    port = models.PositiveIntegerField(
        null=True, blank=True, help_text="Rank 0 only: the gang's MASTER_PORT."
    )
    outcome = models.CharField(
        max_length=20, choices=GangMemberOutcome.choices, default=GangMemberOutcome.RUNNING
    )
    started_at = models.DateTimeField(null=True, blank=True, help_text="When its agent reported it started.")
    exit_code = models.IntegerField(null=True, blank=True)
    reported_state = models.CharField(
        max_length=20, blank=True, help_text="The agent's final job_status state."
    )
    reason = models.CharField(max_length=200, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt", "node"], name="gangmember_unique_node"),
            models.UniqueConstraint(fields=["job", "attempt", "rank"], name="gangmember_unique_rank"),
            models.CheckConstraint(
                condition=(Q(rank=0) & Q(port__isnull=False)) | (Q(rank__gt=0) & Q(port__isnull=True)),
                name="gangmember_port_on_rank_0",
            ),
            models.UniqueConstraint(
                fields=["address", "port"], condition=Q(rank=0), name="gangmember_unique_rendezvous"
            ),
            models.CheckConstraint(
                condition=Q(outcome=GangMemberOutcome.RUNNING) | Q(ended_at__isnull=False),
                name="gangmember_ended_has_time",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job} rank {self.rank} on {self.node.name}: {self.outcome}"

    def describe(self) -> str:
        """How this member ended, in words: 'rank 1 on gpu-07 exited with code 3'."""
        where = f"rank {self.rank} on {self.node.name}"
        if self.reported_state == "exited" and self.exit_code is not None:
            return f"{where} exited with code {self.exit_code}"
        detail = f" ({self.reason})" if self.reason else ""
        code = f", code {self.exit_code}" if self.exit_code is not None else ""
        return f"{where} was {self.reported_state.replace('_', ' ') or self.outcome}{detail}{code}"


class JobEvent(models.Model):
    """Append-only audit of a job: every state change, with who caused it and why."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField("when", auto_now_add=True, db_index=True)
    from_state = models.CharField(max_length=20, choices=JobState.choices, blank=True)
    to_state = models.CharField(max_length=20, choices=JobState.choices, blank=True)
    actor_kind = models.CharField(max_length=20, choices=ActorKind.choices)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    code = models.CharField(max_length=50, blank=True)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.job}: {self.from_state or '-'} -> {self.to_state or '-'} ({self.code})"


class LogDrain(models.Model):
    """A placement that ended on a node whose logs the portal has not pulled to their end yet. Kept in the database
    so that a reconnect (or a portal restart) between the final report and the last chunk still pulls them."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_drains")
    attempt = models.PositiveSmallIntegerField()
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="log_drains")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "job", "attempt"], name="logdrain_unique_placement"),
        ]

    def __str__(self) -> str:
        return f"{self.job} attempt {self.attempt} on {self.node.name}: logs still coming"


class JobDependency(models.Model):
    """A job that may start only once another (an array: all its tasks) has ended the way it names."""

    SUCCEEDED, ENDED, FAILED, EACH_TASK = "succeeded", "ended", "failed", "each"
    WHEN = (
        (SUCCEEDED, "succeeded"),
        (ENDED, "ended"),
        (FAILED, "failed"),
        (EACH_TASK, "each task after the same task succeeded"),
    )

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependencies")
    on = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependents", verbose_name="waits for")
    when = models.CharField(max_length=10, choices=WHEN)

    class Meta:
        verbose_name_plural = "job dependencies"
        constraints = [models.UniqueConstraint(fields=["job", "on"], name="jobdependency_unique")]

    def __str__(self) -> str:
        return f"job {self.job_id} after job {self.on_id} {self.when}"
