"""Admin site for the inventory and jobs: cordon/drain nodes, cancel/requeue jobs, read the audit trail. Lists show
sizes as the portal does (GPU memory in GiB); the forms keep the stored units, named in each label."""

from django.contrib import admin, messages

from portal.admin_base import ReadOnlyAdmin, ReadOnlyInline
from quotas.form_fields import gib_of
from scheduling.choices import ActorKind, NodeState
from scheduling.inventory import services as inventory_services
from scheduling.inventory.models import Gpu, GpuLink, GpuModel, Node, NodeStateChange
from scheduling.jobs.models import GangMember, Job, JobEvent, Slice
from scheduling.jobs.states import IllegalTransition
from scheduling.jobs.transitions import job_cancel, job_requeue
from scheduling.notifications.models import Notification, NotificationSettings


def _gib(mib: int | None) -> str:
    return "–" if mib is None else f"{gib_of(mib):,f} GiB"


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin):
    list_display = ("name", "memory", "compute_capability", "relative_speed", "sharing_modes")
    search_fields = ("name",)

    @admin.display(description="memory", ordering="memory_mib")
    def memory(self, obj: GpuModel) -> str:
        return _gib(obj.memory_mib)


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = (
        "index",
        "uuid",
        "model",
        "memory_mib",
        "numa_node",
        "sharing_mode",
        "health",
        "allocated_memory_mib",
        "allocated_compute_pct",
    )
    readonly_fields = ("allocated_memory_mib", "allocated_compute_pct")


def _set_state(modeladmin, request, queryset, state: str, verb: str) -> None:
    for node in queryset:
        inventory_services.node_set_state(
            node=node, state=state, actor=request.user, reason=f"{verb} in the admin site"
        )
    modeladmin.message_user(request, f"{verb} {queryset.count()} node(s).", messages.SUCCESS)


@admin.action(description="Cordon: place no new work")
def cordon(modeladmin, request, queryset):
    _set_state(modeladmin, request, queryset, NodeState.CORDONED, "Cordoned")


@admin.action(description="Drain: no new work, let running jobs finish")
def drain(modeladmin, request, queryset):
    _set_state(modeladmin, request, queryset, NodeState.DRAINING, "Draining")


@admin.action(description="Uncordon: ready for work")
def uncordon(modeladmin, request, queryset):
    _set_state(modeladmin, request, queryset, NodeState.READY, "Uncordoned")


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "address", "state", "gpu_count", "cpu_cores", "host_memory", "last_heartbeat_at")
    list_filter = ("state", "gpus__model")
    search_fields = ("name", "address", "gpus__uuid")
    # The state changes only through the actions (node_set_state: the node's row locked, as a cycle's placements
    # and the watchdog expect, and the change in its audit trail with who did it), never by editing the field.
    readonly_fields = (
        "state",
        "agent_token_hash",
        "agent_token_prefix",
        "last_heartbeat_at",
        "allocated_cpu_milli",
        "allocated_memory_mib",
    )
    inlines = (GpuInline,)
    actions = (cordon, drain, uncordon)

    @admin.display(description="GPUs")
    def gpu_count(self, obj: Node) -> int:
        return obj.gpus.count()

    @admin.display(description="CPU cores", ordering="cpu_milli")
    def cpu_cores(self, obj: Node) -> str:
        return f"{obj.cpu_milli / 1000:g}"

    @admin.display(description="host memory", ordering="memory_mib")
    def host_memory(self, obj: Node) -> str:
        return _gib(obj.memory_mib)


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "uuid",
        "model",
        "sharing_mode",
        "health",
        "memory",
        "allocated_memory",
        "allocated_compute_pct",
    )
    list_filter = ("model", "sharing_mode", "health", "node__state")
    search_fields = ("uuid", "node__name")
    readonly_fields = ("allocated_memory_mib", "allocated_compute_pct")

    @admin.display(description="GPU", ordering="node__name")
    def name(self, obj: Gpu) -> str:
        return str(obj)

    @admin.display(description="memory", ordering="memory_mib")
    def memory(self, obj: Gpu) -> str:
        return _gib(obj.memory_mib)

    @admin.display(description="allocated memory", ordering="allocated_memory_mib")
    def allocated_memory(self, obj: Gpu) -> str:
        return _gib(obj.allocated_memory_mib)


@admin.register(GpuLink)
class GpuLinkAdmin(admin.ModelAdmin):
    list_display = ("gpu_a", "gpu_b", "kind", "nvlink_count")
    list_filter = ("kind",)
    search_fields = ("gpu_a__node__name",)


class SliceInline(ReadOnlyInline):
    model = Slice
    fields = ("gpu", "memory_mib", "compute_pct", "created_at")
    readonly_fields = fields


class GangMemberInline(ReadOnlyInline):
    model = GangMember
    fields = (
        "rank",
        "node",
        "address",
        "port",
        "outcome",
        "reported_state",
        "exit_code",
        "reason",
        "ended_at",
    )
    readonly_fields = fields


class JobEventInline(ReadOnlyInline):
    model = JobEvent
    fields = ("at", "from_state", "to_state", "actor_kind", "actor", "code", "message")
    readonly_fields = fields


@admin.action(description="Cancel the selected jobs")
def cancel_jobs(modeladmin, request, queryset):
    done = 0
    for job in queryset:
        try:
            job_cancel(job=job, actor=request.user, actor_kind=ActorKind.ADMIN)
            done += 1
        except IllegalTransition as exc:
            modeladmin.message_user(request, str(exc), messages.WARNING)
    modeladmin.message_user(request, f"Cancelled {done} job(s).", messages.SUCCESS)


@admin.action(description="Requeue the selected jobs (keeps their submit time)")
def requeue_jobs(modeladmin, request, queryset):
    done = 0
    for job in queryset:
        try:
            job_requeue(job=job, actor=request.user, reason="Requeued in the admin site.")
            done += 1
        except IllegalTransition as exc:
            modeladmin.message_user(request, str(exc), messages.WARNING)
    modeladmin.message_user(request, f"Requeued {done} job(s).", messages.SUCCESS)


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "name",
        "team",
        "submitter",
        "state",
        "priority_class",
        "gpus",
        "slice_memory",
        "compute_pct",
        "submitted_at",
        "pending_reason_code",
    )
    list_filter = ("state", "team", "priority_class", "topology", "borrowed")
    search_fields = ("name", "command", "submitter__username", "team__slug")
    date_hierarchy = "submitted_at"
    readonly_fields = (
        "state",
        "submitted_at",
        "placed_at",
        "started_at",
        "finished_at",
        "exit_code",
        "attempt",
        "borrowed",
        "pending_reason_code",
        "pending_reason",
        "queue_position",
        "estimated_start_at",
    )
    inlines = (SliceInline, GangMemberInline, JobEventInline)
    actions = (cancel_jobs, requeue_jobs)

    @admin.display(description="slice GPU memory", ordering="gpu_memory_mib")
    def slice_memory(self, obj: Job) -> str:
        return _gib(obj.gpu_memory_mib) if obj.gpu_memory_mib else "–"


@admin.register(JobEvent)
class JobEventAdmin(ReadOnlyAdmin):
    """The audit trail is append-only: readable, never editable."""

    list_display = ("at", "job", "from_state", "to_state", "actor_kind", "actor", "code")
    list_filter = ("to_state", "actor_kind", "code")
    search_fields = ("job__name", "message", "actor__username")


@admin.register(NodeStateChange)
class NodeStateChangeAdmin(ReadOnlyAdmin):
    """Who cordoned, drained or uncordoned which node, and why: append-only, as the jobs' audit trail."""

    list_display = ("at", "node", "from_state", "to_state", "actor", "reason")
    list_filter = ("to_state",)
    search_fields = ("node__name", "reason", "actor__username")


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    """The outbox: what was sent, what waits for a retry and why, what was given up on."""

    list_display = ("created_at", "kind", "channel", "target", "subject", "attempts", "sent_at", "failed_at")
    list_filter = (
        "kind",
        "channel",
        ("sent_at", admin.EmptyFieldListFilter),
        ("failed_at", admin.EmptyFieldListFilter),
    )
    search_fields = ("target", "subject", "last_error")
    readonly_fields = [f.name for f in Notification._meta.fields]


@admin.register(NotificationSettings)
class NotificationSettingsAdmin(admin.ModelAdmin):
    list_display = ("user", "job_events", "email", "webhook_url", "admin_events")
    search_fields = ("user__username",)
