"""Enumerations of the scheduling app. Values match scheduling.engine.types where both exist."""

from django.db import models


class NodeState(models.TextChoices):
    READY = "ready", "Ready"
    CORDONED = "cordoned", "Cordoned"
    DRAINING = "draining", "Draining"
    LOST = "lost", "Lost"


class SharingMode(models.TextChoices):
    EXCLUSIVE = "exclusive", "Exclusive (whole jobs only)"
    MPS = "mps", "MPS (memory + compute slices)"
    TIMESLICE = "timeslice", "Time-sliced (memory slices)"
    MIG = "mig", "MIG (profile-sized slices)"


class GpuHealth(models.TextChoices):
    OK = "ok", "OK"
    DEGRADED = "degraded", "Degraded"
    FAILED = "failed", "Failed"


class LinkKind(models.TextChoices):
    """`nvidia-smi topo -m` vocabulary, from closest to farthest."""

    NVLINK = "NV", "NVLink (NV#)"
    PIX = "PIX", "One PCIe switch"
    PXB = "PXB", "Several PCIe switches"
    PHB = "PHB", "PCIe host bridge"
    NODE = "NODE", "Across host bridges, same NUMA node"
    SYS = "SYS", "Across NUMA nodes (SMP interconnect)"


class Topology(models.TextChoices):
    NONE = "none", "No requirement"
    NUMA = "numa", "Same NUMA node"
    NVLINK = "nvlink", "NVLink-connected set"


class JobKind(models.TextChoices):
    BATCH = "batch", "Batch"
    INTERACTIVE = "interactive", "Interactive session"


class JobState(models.TextChoices):
    PENDING = "pending", "Pending"
    PLACED = "placed", "Placed"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    PREEMPTED = "preempted", "Preempted"
    LOST = "lost", "Lost"


class GangMemberOutcome(models.TextChoices):
    """How one node of a multi-node job ended: the gang succeeds when all succeed, fails when one fails."""

    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded (exit code 0)"
    FAILED = "failed", "Failed"
    STOPPED = "stopped", "Stopped (another member failed)"


class ActorKind(models.TextChoices):
    USER = "user", "User"
    ADMIN = "admin", "Admin"
    SCHEDULER = "scheduler", "Scheduler"
    AGENT = "agent", "Node agent"
    SYSTEM = "system", "System"
