"""GPU inventory (models, nodes, GPUs, links), jobs, the slices they hold, and the job audit trail.

Each Gpu row is also the allocation ledger: `allocated_memory_mib` and `allocated_compute_pct` are changed only by
`allocated = allocated + x` updates, and CHECK constraints make the database itself refuse an over-commit.
"""

from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from scheduling.choices import ActorKind, GpuHealth, JobState, LinkKind, NodeState, SharingMode, Topology


class GpuModel(models.Model):
    name = models.CharField(max_length=50, unique=True, help_text="As users name it, e.g. A100-80GB.")
    memory_mib = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    compute_capability = models.DecimalField(max_digits=3, decimal_places=1, help_text="e.g. 8.0 for A100")
    relative_speed = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.01)], help_text="A100 = 1.0"
    )
    sharing_modes = models.JSONField(default=list, help_text='Supported modes, e.g. ["exclusive", "mps"].')
    # [{"name": "1g.10gb", "memory_mib": 9856, "instances": 7}, ...]
    mig_profiles = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(memory_mib__gt=0), name="gpumodel_memory_mib_positive"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        unknown = set(self.sharing_modes or []) - set(SharingMode.values)
        if unknown:
            raise ValidationError(
                {
                    "sharing_modes": f"Unknown sharing modes {sorted(unknown)}; use {', '.join(SharingMode.values)}."
                }
            )


class Node(models.Model):
    name = models.CharField(max_length=100, unique=True)
    state = models.CharField(max_length=20, choices=NodeState.choices, default=NodeState.READY)
    cpu_milli = models.PositiveIntegerField(help_text="Schedulable CPU in millicores (1000 = one core).")
    memory_mib = models.PositiveBigIntegerField(help_text="Schedulable host memory in MiB.")
    allocated_cpu_milli = models.PositiveIntegerField(default=0)
    allocated_memory_mib = models.PositiveBigIntegerField(default=0)
    labels = models.JSONField(default=dict, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    agent_token_hash = models.CharField(max_length=128, blank=True, help_text="SHA-256 of the agent's token.")
    agent_token_prefix = models.CharField(
        max_length=12, blank=True, help_text="First characters, to recognise it."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(allocated_cpu_milli__lte=F("cpu_milli")), name="node_cpu_not_overcommitted"
            ),
            models.CheckConstraint(
                condition=Q(allocated_memory_mib__lte=F("memory_mib")), name="node_memory_not_overcommitted"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=80, unique=True)
    model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="gpus")
    memory_mib = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    numa_node = models.PositiveSmallIntegerField(default=0)
    sharing_mode = models.CharField(max_length=20, choices=SharingMode.choices, default=SharingMode.EXCLUSIVE)
    health = models.CharField(max_length=20, choices=GpuHealth.choices, default=GpuHealth.OK)
    # Time-sliced cards may hand out more than 100 % of compute (an oversubscription factor); others 100.
    compute_capacity_pct = models.PositiveSmallIntegerField(default=100, validators=[MinValueValidator(1)])
    allocated_memory_mib = models.PositiveIntegerField(default=0)
    allocated_compute_pct = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_node_index"),
            models.CheckConstraint(
                condition=Q(allocated_memory_mib__lte=F("memory_mib")), name="gpu_memory_not_overcommitted"
            ),
            models.CheckConstraint(
                condition=Q(allocated_compute_pct__lte=F("compute_capacity_pct")),
                name="gpu_compute_not_overcommitted",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"

    @property
    def free_memory_mib(self) -> int:
        return self.memory_mib - self.allocated_memory_mib

    @property
    def free_compute_pct(self) -> int:
        return self.compute_capacity_pct - self.allocated_compute_pct


class GpuLink(models.Model):
    """How two GPUs of one node are connected, as `nvidia-smi topo -m` reports it."""

    gpu_a = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="links_as_a")
    gpu_b = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="links_as_b")
    kind = models.CharField(max_length=8, choices=LinkKind.choices)
    nvlink_count = models.PositiveSmallIntegerField(default=0, help_text="Bonded NVLinks (the n of NV<n>).")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["gpu_a", "gpu_b"], name="gpulink_unique_pair"),
            models.CheckConstraint(condition=Q(gpu_a__lt=F("gpu_b")), name="gpulink_ordered_pair"),
            models.CheckConstraint(
                condition=~Q(kind=LinkKind.NVLINK) | Q(nvlink_count__gte=1), name="gpulink_nvlink_has_count"
            ),
        ]

    def __str__(self) -> str:
        label = f"NV{self.nvlink_count}" if self.kind == LinkKind.NVLINK else self.kind
        return f"{self.gpu_a} <-{label}-> {self.gpu_b}"


class Job(models.Model):
    team = models.ForeignKey("quotas.Team", on_delete=models.PROTECT, related_name="jobs")
    submitter = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200)
    command = models.TextField()
    env = models.JSONField(default=dict, blank=True)

    # The request. Whole GPUs (gpus >= 1) or one slice of one GPU (gpus == 0 with memory and/or compute).
    gpus = models.PositiveSmallIntegerField(default=0, help_text="Whole GPUs per node (0 for a slice).")
    gpu_memory_mib = models.PositiveIntegerField(default=0, help_text="Slice: GPU memory on one GPU.")
    compute_pct = models.PositiveSmallIntegerField(
        default=0, validators=[MaxValueValidator(100)], help_text="Slice: compute share of one GPU."
    )
    gpu_models = models.JSONField(default=list, blank=True, help_text="Allowed GPU models; empty = any.")
    min_gpu_memory_mib = models.PositiveIntegerField(default=0)
    min_compute_capability = models.DecimalField(max_digits=3, decimal_places=1, default=Decimal("0"))
    topology = models.CharField(max_length=10, choices=Topology.choices, default=Topology.NONE)
    nodes = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1)], help_text="Gang size."
    )
    cpu_milli = models.PositiveIntegerField(default=1000, help_text="Per node.")
    memory_mib = models.PositiveBigIntegerField(default=4096, help_text="Host memory per node.")
    priority_class = models.ForeignKey("quotas.PriorityClass", on_delete=models.PROTECT, related_name="jobs")
    preemptible = models.BooleanField(default=True)
    max_runtime_s = models.PositiveIntegerField(null=True, blank=True)
    requeue_on_node_loss = models.BooleanField(
        default=True, help_text="Requeue (else fail) when its node is lost."
    )

    # Where it stands.
    state = models.CharField(max_length=20, choices=JobState.choices, default=JobState.PENDING, db_index=True)
    submitted_at = models.DateTimeField(auto_now_add=True, help_text="Kept across requeues: queue age.")
    placed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    borrowed = models.BooleanField(default=False, help_text="Runs beyond its team's guarantee: reclaimable.")
    attempt = models.PositiveSmallIntegerField(default=0, help_text="Placements so far (requeues + 1).")
    pending_reason_code = models.CharField(max_length=50, blank=True)
    pending_reason = models.TextField(blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [models.Index(fields=["state", "submitted_at"], name="job_state_submitted")]
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
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    @property
    def is_slice(self) -> bool:
        return self.gpus == 0 and (self.gpu_memory_mib > 0 or self.compute_pct > 0)


class Slice(models.Model):
    """A part of one GPU held by a job: the whole card for whole-GPU jobs."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="slices")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="slices")
    memory_mib = models.PositiveIntegerField()
    compute_pct = models.PositiveSmallIntegerField()
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


class JobEvent(models.Model):
    """Append-only audit of a job: every state change, with who caused it and why."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
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


class SchedulerLease(models.Model):
    """The scheduling cycle's fencing token: one row whose epochs only ever grow.

    A cycle takes `issued_epoch + 1` when it starts and may write its decisions only while no later cycle has
    started (`issued_epoch` is still its own) and only once (`applied_epoch` below it), checked under a row lock
    in the same transaction that writes the placements. A Redis lock that expired under a slow holder therefore
    cannot let two cycles both write.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    issued_epoch = models.BigIntegerField(default=0)
    applied_epoch = models.BigIntegerField(default=0)
    holder = models.CharField(max_length=200, blank=True, help_text="Who took the last epoch (host:pid).")
    issued_at = models.DateTimeField(null=True, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(id=1), name="schedulerlease_single_row"),
            models.CheckConstraint(
                condition=Q(applied_epoch__lte=F("issued_epoch")), name="schedulerlease_applied_not_ahead"
            ),
        ]

    def __str__(self) -> str:
        return f"scheduler epoch {self.issued_epoch} (applied {self.applied_epoch})"


class NodeSync(models.Model):
    """The versioned desired state the portal last computed for a node, and what its agent last said back."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="sync")
    desired_version = models.BigIntegerField(default=0)
    desired_digest = models.CharField(max_length=64, blank=True, help_text="SHA-256 of the desired jobs.")
    acked_version = models.BigIntegerField(default=0)
    agent_version = models.CharField(max_length=50, blank=True)
    inventory = models.JSONField(default=dict, blank=True, help_text="The agent's last hello inventory.")
    connected_at = models.DateTimeField(null=True, blank=True)
    disconnected_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.node} desired v{self.desired_version} (acked v{self.acked_version})"
