"""Per-GPU-model quotas: a team's row for model M caps what it holds on M's cards, and work beyond M's guarantee
is borrowed.

It adds to the all-models `quota` plugin, never replaces it. Usage on a model counts fractions exactly as the
all-models quota does (a 10 GiB slice of an 80 GiB card counts 10 GiB and 125 milli). A per-model limit is not a
node filter: it rules out cards, not nodes (a node may carry several models), and it depends on the team's usage,
which changes as the cycle places work. So the plugin tells the engine which models a job may still use
(`restrict_models`), and the engine places the job with its allowed models narrowed to those; the narrowed
request is a request of its own in the node index, so every cached verdict stays keyed by what it depends on.
Teams without per-model rows are never asked about and cost nothing.
"""

from __future__ import annotations

from scheduling.engine.accounting import (
    charges_by_model,
    cluster_models,
    exceeds_limit,
    min_charge_on_model,
    model_limited_teams,
    team_model_usage,
    within_guarantee,
)
from scheduling.engine.framework import CycleContext, ModelRestriction
from scheduling.engine.reasons import MODEL_QUOTA_LIMIT, gib
from scheduling.engine.types import Assignment, Job, ModelQuota, Status

NAME = "modelquota"
_TEAMS_KEY = "modelquota.teams"


def _gpus(milli: int) -> str:
    value = milli / 1000
    return f"{value:g} GPU" if value == 1 else f"{value:g} GPUs"


def _is_at(used: int, limit: int | None) -> str:
    return "is at its" if limit is not None and used >= limit else "would go past its"


def limit_sentence(
    *, team: str, row: ModelQuota, broken: str, used: tuple[int, int] | list[int], charge: tuple[int, int]
) -> str:
    """What a researcher reads: the team, the model, the limit, what it holds and what the job would add."""
    model = row.model
    if broken == "memory":
        return (
            f"{team} {_is_at(used[0], row.limit_gpu_memory_mib)} {model} limit ({gib(row.limit_gpu_memory_mib)} of "
            "GPU memory): it holds "
            f"{gib(used[0])} on {model} and this job needs {gib(charge[0])} more"
        )
    return (
        f"{team} {_is_at(used[1], row.limit_compute_milli)} {model} limit ({_gpus(row.limit_compute_milli or 0)}): "
        "it holds "
        f"{used[1] / 1000:g} {model} GPUs and this job needs {charge[1] / 1000:g} more"
    )


class ModelQuotaAdmit:
    NAME = NAME

    def restricted_teams(self, ctx: CycleContext) -> frozenset[str]:
        """Teams with per-model rows. Also builds the per-model usage now, before the cycle places anything."""
        teams = ctx.cache.get(_TEAMS_KEY)
        if teams is None:
            teams = ctx.cache[_TEAMS_KEY] = model_limited_teams(ctx)
            if teams:
                team_model_usage(ctx)
        return teams

    def restrict_models(self, ctx: CycleContext, job: Job) -> ModelRestriction | None:
        """The models the job may still use when some would take its team past a per-model limit (judged on
        the smallest charge the job can have on that model's cards), or None when no limit is in the way."""
        req = job.request
        quota = ctx.snapshot.quotas.get(job.team)
        if quota is None or not quota.per_model or not req.uses_gpu:
            return None
        usage = team_model_usage(ctx)
        allowed: list[str] = []
        refused: list[str] = []
        for model, card_memory_mib in sorted(cluster_models(ctx).items()):
            if req.gpu_models and model not in req.gpu_models:
                continue
            row = quota.for_model(model)
            if row is None:
                allowed.append(model)
                continue
            used = usage.get((job.team, model), (0, 0))
            charge = min_charge_on_model(req, card_memory_mib)
            broken = exceeds_limit(row, used, charge)
            if broken is None:
                allowed.append(model)
            else:
                refused.append(
                    limit_sentence(team=job.team, row=row, broken=broken, used=used, charge=charge)
                )
        if not refused:
            return None
        return ModelRestriction(tuple(allowed), Status(MODEL_QUOTA_LIMIT, "; ".join(refused)))

    def admit(self, ctx: CycleContext, job: Job) -> Status | None:
        if job.team not in self.restricted_teams(ctx):
            return None
        restriction = self.restrict_models(ctx, job)
        if restriction is None or restriction.allowed:
            return None
        return restriction.status

    def admit_assignments(
        self, ctx: CycleContext, job: Job, assignments: tuple[Assignment, ...]
    ) -> Status | None:
        """The exact check of a placement, model by model (MIG instances may round a slice up)."""
        quota = ctx.snapshot.quotas.get(job.team)
        if quota is None or not quota.per_model:
            return None
        usage = team_model_usage(ctx)
        for model, charge in sorted(charges_by_model(ctx, assignments).items()):
            row = quota.for_model(model)
            if row is None:
                continue
            used = usage.get((job.team, model), (0, 0))
            broken = exceeds_limit(row, used, charge)
            if broken is not None:
                return Status(
                    MODEL_QUOTA_LIMIT,
                    limit_sentence(team=job.team, row=row, broken=broken, used=used, charge=charge),
                )
        return None

    def borrowed_assignments(self, ctx: CycleContext, job: Job, assignments: tuple[Assignment, ...]) -> bool:
        """Beyond the guarantee of any model it lands on that has a per-model row: borrowed (reclaimable), even
        when the team stays within its all-models guarantee (which the `quota` plugin judges)."""
        quota = ctx.snapshot.quotas.get(job.team)
        if quota is None or not quota.per_model:
            return False
        usage = team_model_usage(ctx)
        for model, charge in charges_by_model(ctx, assignments).items():
            row = quota.for_model(model)
            if row is not None and not within_guarantee(row, usage.get((job.team, model), (0, 0)), charge):
                return True
        return False
