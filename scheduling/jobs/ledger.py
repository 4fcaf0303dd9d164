"""The GPU ledger: every `Gpu` row's allocated memory and compute change only here, through an UPDATE that adds
`allocated = allocated + x` guarded by what the card has free, so two writers racing for one card cannot both win;
the CHECK constraints on Gpu are the last guard."""

from __future__ import annotations

from collections.abc import Collection

from django.db import transaction
from django.db.models import F

from portal import database
from portal.database import fetch_rows
from scheduling.choices import SharingMode
from scheduling.errors import ServiceError
from scheduling.inventory.models import Gpu
from scheduling.jobs.models import Job, Slice


class SliceDoesNotFit(ServiceError):
    pass


def slice_check(*, gpu: Gpu, memory_mib: int, compute_pct: int) -> None:
    """Refuse a slice no card could hold this way, whatever it has free (SliceDoesNotFit)."""
    if memory_mib < 0 or compute_pct < 0:
        raise SliceDoesNotFit("A slice cannot be negative.", field="memory_mib")
    if gpu.sharing_mode == SharingMode.EXCLUSIVE and (memory_mib, compute_pct) != (gpu.memory_mib, 100):
        raise SliceDoesNotFit(f"{gpu} is exclusive: only whole-GPU jobs may use it.", field="gpu")


def slice_allocate(*, job: Job, gpu: Gpu, memory_mib: int, compute_pct: int) -> Slice:
    """Take part of one GPU for a job, or refuse cleanly if it no longer fits.

    The check and the increment are one UPDATE, so concurrent allocations of the same card serialise in the
    database: exactly one of two racing writers wins the last free memory.
    """
    slice_check(gpu=gpu, memory_mib=memory_mib, compute_pct=compute_pct)
    with transaction.atomic():
        if not _gpu_take(gpu_id=gpu.pk, memory_mib=memory_mib, compute_pct=compute_pct):
            gpu.refresh_from_db(fields=["allocated_memory_mib", "allocated_compute_pct"])
            raise SliceDoesNotFit(
                f"{gpu} has {gpu.free_memory_mib} MiB and {gpu.free_compute_pct}% compute free; "
                f"the slice needs {memory_mib} MiB and {compute_pct}%.",
                field="memory_mib" if memory_mib > gpu.free_memory_mib else "compute_pct",
                code="does_not_fit",
            )
        return Slice.objects.create(job=job, gpu=gpu, memory_mib=memory_mib, compute_pct=compute_pct)


def _gpu_take(*, gpu_id: int, memory_mib: int, compute_pct: int) -> bool:
    """Add to one card's allocation if it stays within what it has (one guarded UPDATE); whether it did."""
    return bool(
        Gpu.objects.filter(
            pk=gpu_id,
            allocated_memory_mib__lte=F("memory_mib") - memory_mib,
            allocated_compute_pct__lte=F("compute_capacity_pct") - compute_pct,
        ).update(
            allocated_memory_mib=F("allocated_memory_mib") + memory_mib,
            allocated_compute_pct=F("allocated_compute_pct") + compute_pct,
        )
    )


def gpus_allocate(*, per_gpu: dict[int, tuple[int, int]]) -> list[int]:
    """Add (memory MiB, compute %) to each GPU's allocation, each card only if it stays within what it has:
    slice_allocate's guard for many cards at once. Returns the ids of the cards that refused (nothing was added
    to them); the caller rolls back what the others took. On PostgreSQL one UPDATE for every card; elsewhere
    (SQLite, in process) one per card."""
    rows = sorted(per_gpu.items())  # one lock order for every writer of the ledger
    if not database.postgresql():
        return [
            gpu_id
            for gpu_id, (memory_mib, compute_pct) in rows
            if not _gpu_take(gpu_id=gpu_id, memory_mib=memory_mib, compute_pct=compute_pct)
        ]
    taken = _gpus_update(
        rows,
        sign="+",
        guard="AND g.allocated_memory_mib <= g.memory_mib - v.memory_mib "
        "AND g.allocated_compute_pct <= g.compute_capacity_pct - v.compute_pct",
    )
    return sorted(set(per_gpu) - taken)


def _gpus_update(rows: list[tuple[int, tuple[int, int]]], *, sign: str, guard: str = "") -> set[int]:
    """PostgreSQL: add (`sign` "+") or give back ("-") (memory MiB, compute %) on each card of `rows`, where
    `guard` (SQL on the card `g` and the row `v`) allows, in one UPDATE; the ids of the cards written."""
    taken = fetch_rows(
        f"UPDATE {Gpu._meta.db_table} AS g "
        f"SET allocated_memory_mib = g.allocated_memory_mib {sign} v.memory_mib, "
        f"allocated_compute_pct = g.allocated_compute_pct {sign} v.compute_pct "
        "FROM unnest(%s::integer[], %s::integer[], %s::integer[]) AS v(id, memory_mib, compute_pct) "
        f"WHERE g.id = v.id {guard} RETURNING g.id",
        [
            [gpu_id for gpu_id, _ in rows],
            [memory_mib for _, (memory_mib, _) in rows],
            [compute_pct for _, (_, compute_pct) in rows],
        ],
    )
    return {r[0] for r in taken}


def job_release_slices(
    *, job: Job, on_node_ids: Collection[int] | None = None, keep_node_ids: Collection[int] = ()
) -> int:
    """Give back the slices the job holds (only those on `on_node_ids` when given; none on `keep_node_ids`);
    returns how many were released."""
    released = 0
    held = Slice.objects.select_for_update().filter(job=job)
    if on_node_ids is not None:
        held = held.filter(gpu__node_id__in=list(on_node_ids))
    if keep_node_ids:
        held = held.exclude(gpu__node_id__in=list(keep_node_ids))
    for sl in held.order_by("gpu_id"):
        Gpu.objects.filter(pk=sl.gpu_id).update(
            allocated_memory_mib=F("allocated_memory_mib") - sl.memory_mib,
            allocated_compute_pct=F("allocated_compute_pct") - sl.compute_pct,
        )
        sl.delete()
        released += 1
    return released


def slices_release_many(*, job_ids: Collection[int], keep_node_ids: Collection[int] = ()) -> list[str]:
    """Give back the slices many jobs hold (none on `keep_node_ids`), as job_release_slices does one job's: the
    cards locked in id order (the ledger's one lock order), then one UPDATE of them on PostgreSQL (one per card
    elsewhere) and one DELETE of the slices. The names of the nodes the jobs held cards on, kept ones too."""
    held = Slice.objects.filter(job_id__in=list(job_ids))
    nodes = sorted(set(held.values_list("gpu__node__name", flat=True)))
    if keep_node_ids:
        held = held.exclude(gpu__node_id__in=list(keep_node_ids))
    per_gpu: dict[int, tuple[int, int]] = {}
    ids = []
    for pk, gpu_id, memory_mib, compute_pct in held.values_list("pk", "gpu_id", "memory_mib", "compute_pct"):
        ids.append(pk)
        was_mib, was_pct = per_gpu.get(gpu_id, (0, 0))
        per_gpu[gpu_id] = (was_mib + memory_mib, was_pct + compute_pct)
    if not per_gpu:
        return nodes
    rows = sorted(per_gpu.items())
    list(Gpu.objects.select_for_update().filter(pk__in=[g for g, _ in rows]).order_by("pk").values_list("pk"))
    if database.postgresql():
        _gpus_update(rows, sign="-")
    else:
        for gpu_id, (memory_mib, compute_pct) in rows:
            Gpu.objects.filter(pk=gpu_id).update(
                allocated_memory_mib=F("allocated_memory_mib") - memory_mib,
                allocated_compute_pct=F("allocated_compute_pct") - compute_pct,
            )
    Slice.objects.filter(pk__in=ids).delete()
    return nodes
