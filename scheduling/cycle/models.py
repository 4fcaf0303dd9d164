"""The scheduling cycle's own records: the fencing lease, and each node's versioned desired state."""

from django.db import models
from django.db.models import F, Q

from scheduling.inventory.models import Node


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
    # The last full cycle (the whole queue scored), which incremental passes follow until the next one is due.
    full_applied_at = models.DateTimeField(null=True, blank=True)
    full_pending = models.PositiveIntegerField(default=0, help_text="Jobs waiting at the last full cycle.")

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
    # The node's last problem, as the portal heard it: a refused report, MPS unavailable, a GPU's health turning
    # bad, GPUs missing from its inventory. One row per node, overwritten: the newest one only (nodes' conditions).
    # Its kind (NodeErrorKind) says what clears it: the condition ending, not time.
    last_error = models.CharField(max_length=500, blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    last_error_kind = models.CharField(max_length=20, blank=True)

    def __str__(self) -> str:
        return f"{self.node} desired v{self.desired_version} (acked v{self.acked_version})"
