"""Whether a job spec can ever run: on this cluster (its GPU models, nodes and bounds) and for its team (the
priority class it may use, its limits). Every refusal names the field and the limit."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings

from quotas.models import PriorityClass, Team
from quotas.selectors import ClassGrant, TeamAllowance, image_allowed, team_allowed_images, team_mounts
from scheduling.choices import Topology
from scheduling.engine import types as eng
from scheduling.engine.accounting import estimated_charge
from scheduling.errors import ServiceError
from scheduling.inventory import selectors as inventory
from scheduling.jobs.array_indexes import ARRAY_SYNTAX, ArrayError, ArraySpec, ArrayTooLarge
from scheduling.jobs.fields import (
    CANNOT_RUN,
    INCOMPATIBLE,
    MAX_CHECKPOINT_INTERVAL_S,
    MAX_GANG_NODES,
    MAX_GPUS_PER_JOB_NODE,
    MIN_CHECKPOINT_INTERVAL_S,
    OUT_OF_RANGE,
    JobSpec,
)


def _refuse(message: str, field_name: str, code: str = CANNOT_RUN) -> None:
    raise ServiceError(message, field=field_name, code=code)


def allowed_gpu_models(*, spec: JobSpec, models: list[inventory.GpuModelRow]) -> list[inventory.GpuModelRow]:
    """The GPU models a spec may run on: those it names (any, if none), with enough memory and architecture."""
    names = set(spec.gpu_models)
    return [
        m
        for m in models
        if (not names or m.name in names)
        and m.memory_mib >= spec.min_gpu_memory_mib
        and m.compute_capability >= spec.min_compute_capability
    ]


def largest_slice_mib(*, spec: JobSpec) -> int:
    """The largest slice the spec could hold: the memory of the largest allowed card the cluster has."""
    allowed = allowed_gpu_models(spec=spec, models=inventory.gpu_model_rows(installed_only=True))
    return max((m.memory_mib for m in allowed), default=0)


def job_spec_validate(*, spec: JobSpec) -> list[inventory.GpuModelRow]:
    """Refuse a spec that can never run on this cluster, naming the field and the limit. Returns the GPU models
    it may run on."""
    for name in ("gpus", "gpu_memory_mib", "compute_pct", "min_gpu_memory_mib", "cpu_milli", "memory_mib"):
        if getattr(spec, name) < 0:
            _refuse(f"{name} must not be negative (got {getattr(spec, name)}).", name)
    if not spec.name.strip():
        _refuse("name must not be empty.", "name")
    if not spec.command.strip():
        _refuse("command must not be empty.", "command")
    if spec.array:
        try:
            ArraySpec.parse(spec.array, max_tasks=settings.TESSERA_MAX_ARRAY_TASKS)
        except ArrayTooLarge as exc:
            raise ServiceError(
                f"array {exc}.", field="array", code=OUT_OF_RANGE, limit=settings.TESSERA_MAX_ARRAY_TASKS
            ) from None
        except ArrayError as exc:
            _refuse(f"array {exc} (got {spec.array[:60]!r}).", "array", ARRAY_SYNTAX)
    if spec.nodes < 1 or spec.nodes > MAX_GANG_NODES:
        _refuse(f"nodes must be between 1 and {MAX_GANG_NODES} (got {spec.nodes}).", "nodes")
    if spec.gpus > MAX_GPUS_PER_JOB_NODE:
        _refuse(f"gpus must be at most {MAX_GPUS_PER_JOB_NODE} per node (got {spec.gpus}).", "gpus")
    if spec.compute_pct > 100:
        _refuse(f"compute_pct is a share of one GPU: at most 100 (got {spec.compute_pct}).", "compute_pct")
    is_slice = spec.gpu_memory_mib > 0 or spec.compute_pct > 0
    if spec.gpus and is_slice:
        _refuse(
            "Ask for whole GPUs (gpus) or one slice (gpu_memory / compute_pct), not both.",
            "gpus",
            INCOMPATIBLE,
        )
    if spec.nodes > 1 and spec.gpus == 0:
        _refuse("A multi-node (gang) job needs whole GPUs on each node: set gpus.", "nodes", INCOMPATIBLE)
    if spec.topology not in Topology.values:
        _refuse(f"topology must be one of {', '.join(Topology.values)} (got {spec.topology!r}).", "topology")
    if spec.max_runtime_s is not None and spec.max_runtime_s <= 0:
        _refuse(f"max_runtime must be positive (got {spec.max_runtime_s} s).", "max_runtime")
    _refuse_bad_checkpoint_interval(spec.checkpoint_interval_s)

    inventory_now = inventory.catalogue()
    models = {m.name: m for m in inventory_now.models}
    unknown = [name for name in spec.gpu_models if name not in models]
    if unknown:
        known = ", ".join(sorted(models)) or "none registered"
        _refuse(f"Unknown GPU model {', '.join(unknown)}; known models: {known}.", "gpu_models")
    allowed = allowed_gpu_models(spec=spec, models=list(models.values()))
    if not allowed:
        _refuse(
            "No GPU model meets gpu_models, min_gpu_memory and min_compute_capability together.", "gpu_models"
        )
    if spec.gpu_memory_mib:
        # Only cards the cluster has: a model in the catalogue with no GPU here holds no slice.
        largest = max((m.memory_mib for m in allowed if m.installed), default=0)
        if spec.gpu_memory_mib > largest:
            _refuse(
                f"gpu_memory {spec.gpu_memory_mib} MiB is more than the largest allowed GPU has ({largest} MiB).",
                "gpu_memory",
            )
    if inventory_now.largest_node_cpu_milli is not None:
        cpu_milli = inventory_now.largest_node_cpu_milli
        memory_mib = inventory_now.largest_node_memory_mib or 0
        if spec.cpu_milli > cpu_milli:
            _refuse(
                f"cpu {spec.cpu_milli // 1000} cores per node can never be had: the largest node has "
                f"{cpu_milli // 1000}.",
                "cpu",
            )
        if spec.memory_mib > memory_mib:
            _refuse(
                f"memory {spec.memory_mib // 1024} GiB per node can never be had: the largest node has "
                f"{memory_mib // 1024} GiB.",
                "memory",
            )
    if spec.gpus:
        per_node, nodes_with_enough = inventory.whole_gpu_capacity(
            allowed_models={m.id for m in allowed}, topology=spec.topology, gpus=spec.gpus
        )
        if spec.gpus > per_node:
            what = {"nvlink": "NVLink-connected ", "numa": "same-NUMA "}.get(spec.topology, "")
            _refuse(
                f"{spec.gpus} {what}GPUs on one node can never be had: the most on any node is {per_node}.",
                "gpus",
            )
        if spec.nodes > nodes_with_enough:
            _refuse(
                f"A gang of {spec.nodes} nodes x {spec.gpus} GPUs needs {spec.nodes} such nodes; "
                f"the cluster has {nodes_with_enough}.",
                "nodes",
            )
    return allowed


def _refuse_bad_checkpoint_interval(seconds: float | None) -> None:
    if seconds is None:
        return
    low, high = MIN_CHECKPOINT_INTERVAL_S, MAX_CHECKPOINT_INTERVAL_S
    whole = isinstance(seconds, int) and not isinstance(seconds, bool)
    if whole and low <= seconds <= high:
        return
    raise ServiceError(
        f"checkpoint_interval_s must be a whole number of seconds from {low} (1 minute) to {high} (7 days) "
        f"(got {seconds!r}).",
        field="checkpoint_interval_s",
        limit=(low if seconds < low else high) if whole else None,
    )


def team_priority_grant(*, priority: str | None, allowance: TeamAllowance) -> ClassGrant:
    """The priority class a job asks for, or its team's default; refused when the team may not use it. A class
    the team may not use is a permission of the team's, not something the cluster lacks, and is said so."""
    team = allowance.team_slug
    if not priority:
        if allowance.default_class is None:
            if not allowance.known_classes:
                _refuse("No priority class exists; an admin must create one.", "priority", "unknown_priority")
            _refuse(
                f"Team {team} may use no priority class; an admin must grant it one.",
                "priority",
                "priority_not_granted",
            )
        return allowance.grant_of(allowance.default_class.name)
    grant = allowance.grant_of(priority)
    if grant is None:
        if priority not in allowance.known_classes:
            _refuse(
                f"Unknown priority {priority!r}; known: {', '.join(allowance.known_classes)}.",
                "priority",
                "unknown_priority",
            )
        raise ServiceError(
            f"team {team} may not use priority class {priority}; it may use: {allowance.classes_text()}.",
            field="priority",
            code="priority_not_granted",
        )
    return grant


def _gpus_words(gpus: Decimal) -> str:
    """12.000 -> "12 GPUs", 1 -> "1 GPU", 0.250 -> "0.25 GPUs"."""
    return f"{gpus.normalize():f} GPU{'' if gpus == 1 else 's'}"


def _gib_words(mib: int) -> str:
    return f"{mib / 1024:g} GiB"


def _refuse_beyond_team_limits(
    *,
    spec: JobSpec,
    team: Team,
    allowance: TeamAllowance,
    grant: ClassGrant,
    models: list[inventory.GpuModelRow],
) -> None:
    """Refuse a job that could not start even with nothing else of its team running: what it counts against
    quota is beyond the team's limit on GPUs or GPU memory, or its limit at the job's priority class. The count
    is the engine's estimate, a lower bound (each whole GPU counts the memory of the smallest card it may get),
    so only a job that surely can never start is refused; the rest wait in the queue."""
    request = eng.Request(
        gpus=spec.gpus,
        nodes=spec.nodes,
        gpu_memory_mib=spec.gpu_memory_mib,
        gpu_compute_milli=spec.compute_pct * 10,
        gpu_models=tuple(spec.gpu_models),
        min_gpu_memory_mib=spec.min_gpu_memory_mib,
    )
    # Model -> (smallest, largest) card memory: the catalogue's figure, widened by the cards installed.
    cards = {
        m.name: (
            min(m.memory_mib, m.smallest_card_mib or m.memory_mib),
            max(m.memory_mib, m.largest_card_mib or 0),
        )
        for m in models
    }
    memory_mib, compute_milli = estimated_charge(request, cards)
    cards_needed = spec.gpus * spec.nodes
    if spec.gpus:
        field_name = "gpus"
        needs = _gpus_words(Decimal(cards_needed))
        needs += f" ({spec.nodes} nodes x {spec.gpus})" if spec.nodes > 1 else ""
    else:
        field_name = "compute_pct" if spec.compute_pct else "gpu_memory"
        needs = f"{Decimal(compute_milli) / eng.WHOLE_GPU_MILLI:f} of a GPU"

    gpu_limits = [(allowance.limit_gpus, "(its limit)")]
    if grant.limit_gpus is not None:
        gpu_limits.append(
            (grant.limit_gpus, f"at priority {grant.priority_class.name} (its limit for that class)")
        )
    for limit, which in gpu_limits:
        if limit is not None and compute_milli > limit * eng.WHOLE_GPU_MILLI:
            raise ServiceError(
                f"{field_name}: this job needs {needs} but team {team.slug} may hold at most "
                f"{_gpus_words(limit)} {which}.",
                field=field_name,
                code="beyond_team_limit",
                limit=int(limit) if limit == limit.to_integral_value() else float(limit),
            )

    limit_mib = allowance.limit_gpu_memory_mib
    if limit_mib is not None and memory_mib > limit_mib:
        if spec.gpus:
            field_name = "gpus"
            needs = f"at least {_gib_words(memory_mib)} of GPU memory"
            needs += f" ({cards_needed} x a card of at least {_gib_words(memory_mib // cards_needed)})"
        else:
            field_name, needs = "gpu_memory", f"{_gib_words(memory_mib)} of GPU memory"
        raise ServiceError(
            f"{field_name}: this job needs {needs} but team {team.slug} may hold at most "
            f"{_gib_words(limit_mib)} (its limit).",
            field=field_name,
            code="beyond_team_limit",
            limit=f"{limit_mib}MiB",
        )


def job_spec_validate_for_team(*, spec: JobSpec, team: Team, allowance: TeamAllowance) -> PriorityClass:
    """Refuse what this team can never run, naming the field and the limit: what the cluster can never give
    (`job_spec_validate`), a priority class the team may not use, a job beyond the team's limits. Returns the
    priority class the job runs at."""
    models = job_spec_validate(spec=spec)
    grant = team_priority_grant(priority=spec.priority, allowance=allowance)
    priority_class = grant.priority_class
    if spec.preemptible and not priority_class.preemptible:
        # Refused rather than quietly turned off: whoever asked for it expects to be evictable.
        raise ServiceError(
            f"priority class {priority_class.name} is never preempted; drop preemptible or choose another "
            "priority.",
            field="preemptible",
            code=INCOMPATIBLE,
        )
    _refuse_beyond_team_limits(spec=spec, team=team, allowance=allowance, grant=grant, models=models)
    _refuse_images_and_mounts_not_given(spec=spec, team=team)
    return priority_class


def _refuse_images_and_mounts_not_given(*, spec: JobSpec, team: Team) -> None:
    """An image must be one of the team's allowed images, and each mount one of the team's (named in the
    refusal: a permission, not a capacity)."""
    if spec.image:
        patterns = team_allowed_images(team=team)
        if not image_allowed(spec.image, patterns):
            raise ServiceError(
                f"Image {spec.image} is not one of team {team.slug}'s allowed images ({', '.join(patterns)}); an "
                "admin can add it to the team's list.",
                field="image",
                code="image_not_allowed",
            )
    if spec.mounts:
        known = team_mounts(team_ids=[team.pk]).get(team.pk, {})
        unknown = [name for name in spec.mounts if name not in known]
        if unknown:
            has = ", ".join(sorted(known)) or "none"
            raise ServiceError(
                f"Team {team.slug} has no mount named {', '.join(unknown)} (its mounts: {has}).",
                field="mounts",
                code="unknown_mount",
            )
