"""The GPU inventory: GPU models, nodes, their GPUs and the links between them.

Each Gpu row is also the allocation ledger: `allocated_memory_mib` and `allocated_compute_pct` are changed only by
`allocated = allocated + x` updates, and CHECK constraints make the database itself refuse an over-commit.
"""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from scheduling.choices import GpuHealth, LinkKind, NodeState, SharingMode


class GpuModel(models.Model):
    name = models.CharField(max_length=50, unique=True, help_text="As users name it, e.g. A100-80GB.")
    memory_mib = models.PositiveIntegerField("memory (MiB)", validators=[MinValueValidator(1)])
    compute_capability = models.DecimalField(max_digits=3, decimal_places=1, help_text="e.g. 8.0 for A100")
    relative_speed = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.01)], help_text="A100 = 1.0"
    )
    sharing_modes = models.JSONField(default=list, help_text='Supported modes, e.g. ["exclusive", "mps"].')
    # [{"name": "1g.10gb", "memory_mib": 9856, "instances": 7}, ...]
    mig_profiles = models.JSONField("MIG profiles", default=list, blank=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "GPU model"
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
    cpu_milli = models.PositiveIntegerField(
        "CPU (millicores)", help_text="Schedulable CPU in millicores (1000 = one core)."
    )
    memory_mib = models.PositiveBigIntegerField(
        "host memory (MiB)", help_text="Schedulable host memory in MiB."
    )
    allocated_cpu_milli = models.PositiveIntegerField("allocated CPU (millicores)", default=0)
    allocated_memory_mib = models.PositiveBigIntegerField("allocated host memory (MiB)", default=0)
    labels = models.JSONField(default=dict, blank=True)
    address = models.CharField(
        max_length=253,
        blank=True,
        help_text="Host name or IP address the node's peers reach it at (a gang's MASTER_ADDR, its hostfile); "
        "its agent reports it (--address). Empty: the node's name.",
    )
    last_heartbeat_at = models.DateTimeField("last heartbeat", null=True, blank=True)
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

    @property
    def reachable_address(self) -> str:
        return self.address or self.name


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField("UUID", max_length=80, unique=True)
    model = models.ForeignKey(
        GpuModel, on_delete=models.PROTECT, related_name="gpus", verbose_name="GPU model"
    )
    memory_mib = models.PositiveIntegerField("memory (MiB)", validators=[MinValueValidator(1)])
    numa_node = models.PositiveSmallIntegerField("NUMA node", default=0)
    sharing_mode = models.CharField(max_length=20, choices=SharingMode.choices, default=SharingMode.EXCLUSIVE)
    health = models.CharField(max_length=20, choices=GpuHealth.choices, default=GpuHealth.OK)
    # Time-sliced cards may hand out more than 100 % of compute (an oversubscription factor); others 100.
    compute_capacity_pct = models.PositiveSmallIntegerField(
        "compute capacity (%)", default=100, validators=[MinValueValidator(1)]
    )
    allocated_memory_mib = models.PositiveIntegerField("allocated memory (MiB)", default=0)
    allocated_compute_pct = models.PositiveSmallIntegerField("allocated compute (%)", default=0)

    class Meta:
        ordering = ["node__name", "index"]
        verbose_name = "GPU"
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

    gpu_a = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="links_as_a", verbose_name="GPU")
    gpu_b = models.ForeignKey(
        Gpu, on_delete=models.CASCADE, related_name="links_as_b", verbose_name="other GPU"
    )
    kind = models.CharField(max_length=8, choices=LinkKind.choices)
    nvlink_count = models.PositiveSmallIntegerField(
        "NVLinks", default=0, help_text="Bonded NVLinks (the n of NV<n>)."
    )

    class Meta:
        verbose_name = "GPU link"
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


class NodeStateChange(models.Model):
    """One change of a node's state by a person (cordon, drain, uncordon), with why: the node's audit trail."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="state_changes")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    from_state = models.CharField(max_length=20, choices=NodeState.choices)
    to_state = models.CharField(max_length=20, choices=NodeState.choices)
    reason = models.CharField(max_length=500)
    at = models.DateTimeField("when", default=timezone.now)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["node", "-at"], name="nodestatechange_node_at")]
        constraints = [
            models.CheckConstraint(condition=~Q(reason=""), name="nodestatechange_reason_given"),
        ]

    def __str__(self) -> str:
        return f"{self.node} {self.from_state} -> {self.to_state}"
