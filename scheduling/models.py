"""Every model of the scheduling app, for Django's app registry; code imports them from their room.

Rooms: `inventory` (GPU models, nodes, GPUs, links), `jobs` (jobs, slices, gang members, events, logs still to pull) and `cycle` (the scheduler's
fencing lease, each node's desired-state sync).
"""

from scheduling.cycle.models import NodeSync, SchedulerLease
from scheduling.inventory.models import Gpu, GpuLink, GpuModel, Node, NodeStateChange
from scheduling.jobs.models import GangMember, Job, JobDependency, JobEvent, LogDrain, Slice
from scheduling.notifications.models import Notification, NotificationSettings

__all__ = [
    "GangMember",
    "Gpu",
    "GpuLink",
    "GpuModel",
    "Job",
    "JobDependency",
    "JobEvent",
    "LogDrain",
    "Node",
    "NodeStateChange",
    "NodeSync",
    "Notification",
    "NotificationSettings",
    "SchedulerLease",
    "Slice",
]
