"""Teams (a two-level tree such as `ai-lab/training`), who belongs to them, priorities and quotas."""

from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import F, Q

from quotas.choices import ChangeSource, DirectorySource, Network, Role

slug_path_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9-]*(/[a-z0-9][a-z0-9-]*)?$",
    "Use lower-case letters, digits and dashes, with at most one '/' (organisation/team), e.g. ai-lab/training.",
)


class Team(models.Model):
    slug = models.CharField(max_length=100, unique=True, validators=[slug_path_validator])
    display_name = models.CharField(max_length=200)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    # Membership from the site's directory (quotas/directory.py): at each sign-in through LDAP or OIDC, a user in
    # one of these groups is made a member (or a team admin), and one in neither loses the team. Empty: the team's
    # members are kept here by hand, whatever the directory says.
    directory_group = models.CharField(
        "directory group (members)",
        max_length=200,
        blank=True,
        help_text="Name of the LDAP or OIDC group whose members belong to this team, e.g. gpu-nlp. Empty: members "
        "are managed here.",
    )
    directory_admin_group = models.CharField(
        "directory group (team admins)",
        max_length=200,
        blank=True,
        help_text="Name of the group whose members are this team's admins, e.g. gpu-nlp-admins.",
    )
    # Jobs in images (agent/containers.py): which images its jobs may run (globs, one per line), and what they may
    # reach. Empty: its organisation's; an organisation's empty list allows any image.
    allowed_images = models.TextField(
        "allowed images",
        blank=True,
        help_text="One image pattern per line; * matches anything, e.g. nvcr.io/nvidia/* or "
        "registry.example.org/ai-lab/*. Empty: the organisation's list (empty there too: any image).",
    )
    network = models.CharField(
        "network of jobs in images",
        max_length=10,
        blank=True,
        choices=Network.choices,
        help_text="What its jobs in images may reach; the stricter of this and the priority class's holds. Empty: "
        "the organisation's, else the class's (open when neither says).",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        if self.parent_id and self.parent.parent_id:
            raise ValidationError(
                {"parent": "Teams form a two-level tree: the parent must be an organisation."}
            )
        if self.parent_id and not self.slug.startswith(f"{self.parent.slug}/"):
            raise ValidationError(
                {"slug": f"A team under '{self.parent.slug}' must be named '{self.parent.slug}/...'."}
            )


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="membership_unique_user_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class PriorityClass(models.Model):
    name = models.SlugField(max_length=50, unique=True)
    value = models.IntegerField(help_text="Higher runs first and may preempt lower preemptible work.")
    preemptible = models.BooleanField(default=True, help_text="Jobs of this class may be preempted.")
    preemption_grace_s = models.PositiveIntegerField(
        "preemption grace (seconds)",
        default=30,
        help_text="Seconds between SIGTERM and SIGKILL when a job of this class is preempted.",
    )
    open_to_all_teams = models.BooleanField(
        default=False,
        help_text="Every team may use it. Otherwise only the teams granted it (on the team's page), and a team "
        "whose default it is.",
    )
    # Idle GPUs given back (scheduling/cycle/idle.py): a running job whose every card stays idle this long is
    # stopped (a session) or requeued (batch, while others wait). Empty: never, e.g. for serving that idles by design.
    idle_timeout_s = models.PositiveIntegerField(
        "idle timeout, batch (seconds)",
        null=True,
        blank=True,
        validators=[MinValueValidator(10)],
        help_text="A batch job idle this long (every GPU under 5% and its memory unchanged) is requeued while other "
        "work waits. Empty: never.",
    )
    interactive_idle_timeout_s = models.PositiveIntegerField(
        "idle timeout, sessions (seconds)",
        null=True,
        blank=True,
        validators=[MinValueValidator(10)],
        help_text="An interactive session (a notebook) idle this long is stopped with its grace. Empty: never.",
    )
    network = models.CharField(
        "network of jobs in images",
        max_length=10,
        blank=True,
        choices=Network.choices,
        help_text="What jobs in images at this class may reach; the stricter of this and the team's holds. Empty: "
        "the team's.",
    )
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["-value"]
        verbose_name_plural = "priority classes"
        constraints = [
            models.CheckConstraint(
                condition=(Q(idle_timeout_s__isnull=True) | Q(idle_timeout_s__gte=10))
                & (Q(interactive_idle_timeout_s__isnull=True) | Q(interactive_idle_timeout_s__gte=10)),
                name="priority_class_idle_timeouts_at_least_10_s",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.value})"


class Quota(models.Model):
    """A team's guaranteed share and borrowing limit, for all GPUs or for one GPU model.

    Work within the guarantee runs freely; above it a team borrows idle capacity up to its limit, and borrowed
    work may be reclaimed. Compute is counted in whole-GPU equivalents (0.25 = a quarter of one card).
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="quotas")
    gpu_model = models.ForeignKey(
        "scheduling.GpuModel",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        verbose_name="GPU model",
        help_text="Leave empty for a quota over all GPU models.",
    )
    guaranteed_gpu_memory_mib = models.BigIntegerField(
        "guaranteed GPU memory (MiB)", default=0, validators=[MinValueValidator(0)]
    )
    limit_gpu_memory_mib = models.BigIntegerField(
        "GPU memory limit (MiB)",
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Empty: may borrow without limit.",
    )
    guaranteed_gpus = models.DecimalField(
        "guaranteed GPUs",
        max_digits=9,
        decimal_places=3,
        default=Decimal("0"),
        validators=[MinValueValidator(Decimal("0"))],
    )
    limit_gpus = models.DecimalField(
        "GPU limit",
        max_digits=9,
        decimal_places=3,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0"))],
        help_text="Empty: may borrow without limit.",
    )
    fair_share_weight = models.DecimalField(
        "fair-share weight",
        max_digits=6,
        decimal_places=2,
        default=Decimal("1"),
        validators=[MinValueValidator(Decimal("0.01"))],
    )
    default_priority_class = models.ForeignKey(PriorityClass, null=True, blank=True, on_delete=models.PROTECT)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["team__slug"]
        constraints = [
            models.UniqueConstraint(fields=["team", "gpu_model"], name="quota_unique_team_model"),
            # One all-models quota per team (NULL gpu_model rows are otherwise distinct).
            models.UniqueConstraint(
                fields=["team"], condition=Q(gpu_model__isnull=True), name="quota_unique_team_all_models"
            ),
            models.CheckConstraint(
                condition=Q(guaranteed_gpu_memory_mib__gte=0),
                name="quota_guaranteed_gpu_memory_mib_nonnegative",
            ),
            models.CheckConstraint(
                condition=Q(guaranteed_gpus__gte=0), name="quota_guaranteed_gpus_nonnegative"
            ),
            models.CheckConstraint(
                condition=Q(limit_gpu_memory_mib__isnull=True)
                | Q(limit_gpu_memory_mib__gte=F("guaranteed_gpu_memory_mib")),
                name="quota_limit_gpu_memory_mib_gte_guaranteed",
            ),
            models.CheckConstraint(
                condition=Q(limit_gpus__isnull=True) | Q(limit_gpus__gte=F("guaranteed_gpus")),
                name="quota_limit_gpus_gte_guaranteed",
            ),
            models.CheckConstraint(
                condition=Q(fair_share_weight__gt=0), name="quota_fair_share_weight_positive"
            ),
        ]

    def __str__(self) -> str:
        scope = self.gpu_model.name if self.gpu_model_id else "all GPUs"
        return f"{self.team} quota ({scope})"

    def clean(self) -> None:
        errors = {}
        if (
            self.limit_gpu_memory_mib is not None
            and self.guaranteed_gpu_memory_mib is not None
            and self.limit_gpu_memory_mib < self.guaranteed_gpu_memory_mib
        ):
            errors["limit_gpu_memory_mib"] = (
                f"The limit ({self.limit_gpu_memory_mib} MiB) must be at least the guarantee "
                f"({self.guaranteed_gpu_memory_mib} MiB)."
            )
        if (
            self.limit_gpus is not None
            and self.guaranteed_gpus is not None
            and self.limit_gpus < self.guaranteed_gpus
        ):
            errors["limit_gpus"] = (
                f"The limit ({self.limit_gpus} GPUs) must be at least the guarantee ({self.guaranteed_gpus} GPUs)."
            )
        if errors:
            raise ValidationError(errors)


class TeamPriorityClass(models.Model):
    """A team may use this priority class, optionally holding at most `limit_gpus` at it at once (Slurm's QOS
    MaxTRES). A grant to an organisation holds for each of its teams, unless the team has its own for the class.
    A grant of a class open to all teams only adds the limit."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="priority_class_grants")
    priority_class = models.ForeignKey(PriorityClass, on_delete=models.CASCADE, related_name="team_grants")
    limit_gpus = models.DecimalField(
        "GPU limit",
        max_digits=9,
        decimal_places=3,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0"))],
        help_text="The most GPUs (whole-GPU equivalents) the team may hold at this class at once. Empty: only the "
        "team's quota limits it.",
    )
    idle_timeout_s = models.PositiveIntegerField(
        "idle timeout (seconds)",
        null=True,
        blank=True,
        validators=[MinValueValidator(10)],
        help_text="The team's own, shorter idle timeout at this class (never longer than the class's). Empty: the "
        "class's.",
    )

    class Meta:
        ordering = ["team__slug", "-priority_class__value"]
        verbose_name = "priority class grant"
        constraints = [
            models.UniqueConstraint(fields=["team", "priority_class"], name="grant_unique_team_class"),
            models.CheckConstraint(
                condition=Q(limit_gpus__isnull=True) | Q(limit_gpus__gte=0),
                name="grant_limit_gpus_nonnegative",
            ),
            models.CheckConstraint(
                condition=Q(idle_timeout_s__isnull=True) | Q(idle_timeout_s__gte=10),
                name="grant_idle_timeout_at_least_10_s",
            ),
        ]

    def __str__(self) -> str:
        limit = "" if self.limit_gpus is None else f", at most {self.limit_gpus.normalize():f} GPUs"
        return f"{self.team} may use {self.priority_class.name}{limit}"


mount_name_validator = RegexValidator(
    r"^[a-z][a-z0-9-]{0,30}$",
    "A lower-case word of letters, digits and '-', starting with a letter (datasets).",
)
path_validator = RegexValidator(r"^/([^:\x00/]+/?)*$", "An absolute path, without ':' (e.g. /data/ai-lab).")


class TeamMount(models.Model):
    """A directory of the nodes a team's jobs in images may ask for by name (`mounts: [datasets]`); an
    organisation's hold for each of its teams, unless the team has its own of that name. A job gets the mounts it
    asked for and nothing else of the host."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="mounts")
    name = models.CharField(max_length=31, validators=[mount_name_validator])
    host_path = models.CharField(
        "path on the nodes", max_length=1024, validators=[path_validator], help_text="e.g. /data/ai-lab"
    )
    container_path = models.CharField(
        "path in the job's image", max_length=1024, validators=[path_validator], help_text="e.g. /data"
    )
    read_only = models.BooleanField(default=True)

    class Meta:
        ordering = ["team__slug", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="team_mount_unique_name")]

    def __str__(self) -> str:
        return f"{self.team}: {self.name} ({self.host_path} -> {self.container_path}, {'ro' if self.read_only else 'rw'})"

    @property
    def access(self) -> str:
        return "read-only" if self.read_only else "read-write"

    def clean(self) -> None:
        for field in ("host_path", "container_path"):
            path = getattr(self, field) or ""
            if ".." in path.split("/"):
                raise ValidationError({field: "A path without '..' parts."})
            if field == "container_path" and path.rstrip("/") in ("", "/proc", "/sys", "/dev", "/etc"):
                raise ValidationError(
                    {field: f"{path} belongs to the image's system; mount elsewhere (/data)."}
                )


class QuotaChange(models.Model):
    """Append-only audit of every quota change (priority class grants included): who, when, where from, and each
    field's old and new value."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="quota_changes")
    quota = models.ForeignKey(Quota, null=True, blank=True, on_delete=models.SET_NULL, related_name="changes")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    source = models.CharField(max_length=20, choices=ChangeSource.choices, default=ChangeSource.ADMIN)
    changed_at = models.DateTimeField(auto_now_add=True)
    # {"field": {"old": ..., "new": ...}}; a created quota has old None, a deleted one new None.
    changes = models.JSONField()
    note = models.CharField(
        "reason", max_length=300, blank=True, help_text="Why: the reason given with the change."
    )
    undo_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="undone_by",
        verbose_name="undoes",
        help_text="The change this one undoes.",
    )

    class Meta:
        ordering = ["-changed_at", "-id"]

    def __str__(self) -> str:
        return f"{self.team} quota change at {self.changed_at:%Y-%m-%d %H:%M}"


class DirectoryAccount(models.Model):
    """Where a user signs in from when it is the site's directory (LDAP or OIDC), as read at the last sign-in: the
    directory's name for them, their Unix account (the agent's `account` mode runs their jobs as it) and groups."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="directory_account"
    )
    source = models.CharField(max_length=10, choices=DirectorySource.choices)
    subject = models.CharField(max_length=500, help_text="The LDAP entry's DN, or the OIDC subject (sub).")
    unix_account = models.CharField(
        max_length=64, blank=True, help_text="The user's Unix account on hosts that share the directory."
    )
    groups = models.JSONField(default=list, blank=True, help_text="Group names at the last sign-in.")
    synced_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.user} from {self.get_source_display()}"


class ApiToken(models.Model):
    """A personal API token for scripts and the CLI. Only its SHA-256 is stored; the token is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What it is for, e.g. 'laptop CLI'.")
    prefix = models.CharField(max_length=16, help_text="First characters, to recognise it in lists.")
    token_hash = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the token, hex.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.user} token {self.prefix}... ({self.name})"


class IdempotencyRecord(models.Model):
    """The first response to a write sent with an Idempotency-Key, replayed for retries of the same request.

    The unique (user, key) pair lets the database decide a race between two retries.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=200)
    request_hash = models.CharField(max_length=64, help_text="SHA-256 of method, path and body.")
    response_status = models.PositiveSmallIntegerField()
    response_body = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="idempotency_unique_user_key")]

    def __str__(self) -> str:
        return f"{self.user} {self.key}"
