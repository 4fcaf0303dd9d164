"""Action `reclaim`: a blocked job whose team stays within its guarantee with it (counting the team's running work
of at least the job's priority: lower-priority work of its own team gives way to it) takes back capacity other
teams borrow, whatever the priorities.

Only borrowed work is taken: the victims' team must still hold at least its guarantee without them
(`accounting.keeps_guarantee`, for all the victims of one team together), so reclaim never takes a team below
its guarantee to serve another. A team's running jobs fill its guarantee in guarantee order (never-preempted
work first, then higher priority, then the longest running) and what is left over is labelled borrowed
(`accounting.running_borrowed`): those go first, but where only another of the team's jobs frees the right
cards (a whole node for an 8-GPU job) that one may go instead, as long as the team keeps its guarantee; the
labels then settle again. Never-preempted work is taken only when labelled borrowed (its owner is told at
placement). The minimum runtime does not protect borrowed work (`reclaim_min_runtime_s`, 0 by default): the
guarantee comes back within the victims' grace. Victims come first from the team that borrows the most per
weight, then labelled borrowed work, then those that lose the least work since their last checkpoint.
"""

from __future__ import annotations

from scheduling.engine.accounting import (
    borrowed_per_weight,
    has_guarantee,
    is_borrowing,
    job_charge,
    others_keep_guarantees,
    running_borrowed,
    running_charges,
    team_usage,
    usage_at_or_above,
    within_guarantee,
)
from scheduling.engine.actions.base import Action
from scheduling.engine.eviction import (
    Victims,
    evict_for_blocked,
    work_lost,
    work_then_count,
    work_then_count_floor,
)
from scheduling.engine.session import Holding, Session
from scheduling.engine.types import Job

NAME = "reclaim"


class OtherTeamsBorrowed:
    """Victims: other teams' borrowed work, for a job whose team stays within its guarantee with it."""

    CODE = "reclaimed"
    MAX_ATTEMPTS_PARAM = "reclaim_max_attempts"
    MIN_RUNTIME_PARAM = "reclaim_min_runtime_s"
    EVICTS_PINNED = True

    def victims(self, s: Session, job: Job) -> Victims | None:
        ctx, quotas = s.ctx, s.snap.quotas
        quota = quotas.get(job.team)
        if not has_guarantee(quota):
            return None
        if not within_guarantee(quota, usage_at_or_above(ctx, job.team, job.priority), job_charge(ctx, job)):
            return None
        team, evicted, borrowed, charges = job.team, s.evicted, running_borrowed(ctx), running_charges(ctx)
        spare = _spare(s)

        def taken(held: list[Holding]) -> list[Holding]:
            out = []
            for v in held:
                room = spare.get(v.job.team)
                if room is None or v.job.team == team or v.job.id in evicted:
                    continue
                if not v.job.preemptible and v.job.id not in borrowed:
                    continue
                mem, comp = charges.get(v.job.id, (0, 0))
                # keeps_guarantee, spelt out (once per running job on each node looked at).
                if room[2] or mem <= room[0] or comp <= room[1]:
                    out.append(v)
            return out

        return taken

    def allows(self, s: Session, job: Job, victims: list[Job]) -> bool:
        return others_keep_guarantees(s.ctx, job.team, victims)

    def scope(self, job: Job) -> str:
        return job.team  # the guarantee is the team's: another team's failed try says nothing

    def order(self, s: Session, v: Holding) -> tuple:
        over = _spare(s)[v.job.team][3]
        labelled = v.job.id in running_borrowed(s.ctx)
        return (-over, not labelled, work_lost(s, v.job), v.job.priority, v.job.id)

    def cost(self, s: Session, chosen: list[Holding]) -> tuple:
        return work_then_count(s, chosen)

    def cost_floor(self, s: Session, job: Job, pos: int, eligible: list[Holding]) -> tuple:
        return work_then_count_floor(s, job, pos, eligible)


def _spare(s: Session) -> dict[str, tuple[int, int, bool, float]]:
    """Per team that holds anything beyond its guarantee: how much memory and compute may be taken from it while it
    keeps its guarantee (a victim may go when its charge fits either, as `keeps_guarantee` says), whether it has no
    guarantee at all (anything may go), and what it borrows per weight. Worked out again only after this cycle's
    placements or evictions change what teams hold."""
    version = (len(s.placements), len(s.evictions), len(s.evicted))
    known = s.ctx.cache.get(_SPARE_KEY)
    if known is not None and known[0] == version:
        return known[1]
    quotas = s.snap.quotas
    out: dict[str, tuple[int, int, bool, float]] = {}
    for team, used in team_usage(s.ctx).items():
        quota = quotas.get(team)
        if not is_borrowing(quota, used):
            continue
        over = borrowed_per_weight(quota, used)
        if not has_guarantee(quota):
            out[team] = (0, 0, True, over)
            continue
        g_mem, g_comp = quota.guaranteed_gpu_memory_mib, quota.guaranteed_compute_milli
        out[team] = (
            used[0] - g_mem if g_mem > 0 else -1,
            used[1] - g_comp if g_comp > 0 else -1,
            False,
            over,
        )
    s.ctx.cache[_SPARE_KEY] = (version, out)
    return out


_SPARE_KEY = "reclaim.spare"


class Reclaim(Action):
    NAME = NAME
    VICTIMS = OtherTeamsBorrowed()

    def execute(self, session: Session) -> None:
        evict_for_blocked(session, self.VICTIMS)
