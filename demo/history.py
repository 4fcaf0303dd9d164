"""The embedded demo's past: days of generated jobs before now, and the history rollups they make, so that every
page has something true to show at once (`manage.py load_demo --history-days`).

The past is generated, not recorded, and marked so: each generated job's events say "generated". The demo's
workload (`demo.workload`: the same mix the living demo submits, with alice's own work) is replayed minute by
minute on the demo's cards, first come first placed within each team's limits, and the jobs it ran are written
as finished jobs with their events (the placed event with the cards they held, as the scheduler writes it).
Every rollup is then derived from them: the hours' GPU-seconds and the queue times by the recorder's own rolls
(`usage_hours_roll`, `waits_roll`, which count the jobs' records as the usage API does), and each minute's
cluster, team, GPU model, node and card rows from the same replay. So the team page, the chargeback, `tessera
usage` and the history page add up to the same GPU-hours, and no team holds more than its limit.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import transaction

from demo.history_writes import MILLI, ReplayedJob, idle_add, jobs_write, rollups_write
from demo.workload import DEFAULT_SEED, GIB, KINDS, submissions
from quotas.models import Membership, Quota, Team
from scheduling.choices import NodeState, SharingMode
from scheduling.history import recorder
from scheduling.history.models import (
    ClusterMinute,
)
from scheduling.history.partitions import partitions_ensure
from scheduling.inventory.models import Gpu, Node
from scheduling.jobs.usage import slice_share

GIVE_UP_AFTER = timedelta(hours=4)  # a job waiting this long is cancelled by its owner


@dataclass(eq=False)
class ReplayedCard:
    pk: int
    node_pk: int
    node: str
    index: int
    model_id: int
    model: str
    memory_mib: int
    shared: bool  # MPS or time-sliced: slices only
    capacity_pct: int
    used_mib: int = 0
    used_pct: int = 0
    holders: set = field(default_factory=set)
    util: float = 0.0

    def held_milli(self) -> int:
        if not self.holders:
            return 0
        return round(
            slice_share(
                memory_mib=self.used_mib, compute_pct=min(100, self.used_pct), gpu_memory_mib=self.memory_mib
            )
            * MILLI
        )


def _wants(job: ReplayedJob, cards: list[ReplayedCard]) -> list[tuple[ReplayedCard, int, int]] | None:
    """The cards the job would be placed on now (first fit, node by node), or None."""
    k = job.sub.kind
    if k.gpus:
        by_node: dict[int, list[ReplayedCard]] = defaultdict(list)
        for c in cards:
            if not c.shared and not c.holders and (not k.models or c.model in k.models):
                by_node[c.node_pk].append(c)
        for free in by_node.values():
            if len(free) >= k.gpus:
                return [(c, c.memory_mib, MILLI) for c in free[: k.gpus]]
        return None
    mib, pct = k.gpu_memory_gib * GIB, k.compute_pct
    for c in cards:
        if (k.models and c.model not in k.models) or not c.shared:
            continue
        if c.used_mib + mib <= c.memory_mib and c.used_pct + pct <= c.capacity_pct:
            return [(c, mib, pct * 10)]
    return None


def _people(quota_teams: set[int]) -> dict[tuple[str, str], tuple[int, int]]:
    """(the mix's team, its person) -> (team id, user id): the demo's own teams and people where they are; on
    another cluster (the tests'), its teams with a quota and members in turn, and their members."""
    members: dict[int, list[int]] = defaultdict(list)
    for team_id, user_id in Membership.objects.order_by("team_id", "user_id").values_list(
        "team_id", "user_id"
    ):
        members[team_id].append(user_id)
    slugs = dict(Team.objects.values_list("slug", "pk"))
    users = dict(get_user_model().objects.values_list("username", "pk"))
    pairs = sorted({(k.team, k.user) for k in KINDS})
    if all(slugs.get(t) in quota_teams and users.get(u) in members.get(slugs[t], ()) for t, u in pairs):
        return {(t, u): (slugs[t], users[u]) for t, u in pairs}
    teams = [team_id for team_id in sorted(members) if team_id in quota_teams]
    if not teams:
        return {}
    mix_teams = sorted({t for t, _ in pairs})
    out = {}
    for n, (t, u) in enumerate(pairs):
        team_id = teams[mix_teams.index(t) % len(teams)]
        out[(t, u)] = (team_id, members[team_id][n % len(members[team_id])])
    return out


def _cards() -> list[ReplayedCard]:
    return [
        ReplayedCard(
            pk,
            node_pk,
            node,
            index,
            model_id,
            model,
            mib,
            sharing != SharingMode.EXCLUSIVE,
            200 if sharing == SharingMode.TIMESLICE else 100,
        )
        for pk, node_pk, node, index, model_id, model, mib, sharing in Gpu.objects.order_by(
            "node__name", "index"
        ).values_list(
            "pk", "node_id", "node__name", "index", "model_id", "model__name", "memory_mib", "sharing_mode"
        )
    ]


def history_backfill(*, days: int, now: datetime | None = None, seed: int = DEFAULT_SEED) -> int:
    """Write `days` days of generated jobs before now and the history rollups they make. Nothing when history is
    already there (a second load, or a recorder that has run a while). Returns the minutes written."""
    now = (now or datetime.now(UTC)).astimezone(UTC).replace(second=0, microsecond=0)
    # From a whole hour, as the history page's and the team page's windows of days start (selectors.windows): a
    # demo just loaded then shows the same totals on every page.
    start = now - timedelta(days=days)
    if start.minute:
        start = start.replace(minute=0) + timedelta(hours=1)
    if days <= 0 or ClusterMinute.objects.filter(at__lt=now - timedelta(minutes=10)).exists():
        return 0
    cards = _cards()
    if not cards:
        return 0
    quotas = {
        q.team_id: q
        for q in Quota.objects.filter(gpu_model__isnull=True).select_related("default_priority_class")
    }
    people = _people(set(quotas))
    nodes = list(Node.objects.order_by("name").values_list("pk", flat=True))
    rng = random.Random(seed)
    minutes = int((now - start).total_seconds() // 60)
    partitions_ensure(days=[(start + timedelta(days=d)).date() for d in range(days + 1)])

    jobs: list[ReplayedJob] = []
    pending: list[ReplayedJob] = []
    running: list[ReplayedJob] = []
    held = defaultdict(lambda: [0, 0])  # team id -> [milli, memory MiB]
    node_rows, model_rows, team_rows, cluster_rows = [], [], [], []
    node_hours: dict[tuple[int, datetime], list] = {}
    gpu_windows: dict[tuple[int, datetime], list] = {}
    team_ids = sorted(quotas)
    by_node: dict[int, list[ReplayedCard]] = defaultdict(list)
    for c in cards:
        by_node[c.node_pk].append(c)
    frame = None
    for m in range(minutes):
        at = start + timedelta(minutes=m)
        ended = [j for j in running if j.ends <= at]
        for job in ended:
            running.remove(job)
            for card, mib, milli in job.cards:
                card.holders.discard(job)
                card.used_mib -= mib
                card.used_pct -= milli // 10
            held[job.team_id][0] -= job.milli
            held[job.team_id][1] -= job.memory_mib
        changed = bool(ended)
        for sub in submissions(seed=seed, minute=at):
            who = people.get((sub.kind.team, sub.kind.user))
            # Work that could not end before now is not part of the past: the living demo's own work follows it
            # (what still runs or waits at the end is stopped there, and says so).
            if who is None or at + timedelta(seconds=sub.runtime_s) > now:
                continue
            job = ReplayedJob(sub, *who, at + timedelta(seconds=rng.randint(0, 59)))
            jobs.append(job)
            pending.append(job)
            changed = True
        for job in [j for j in pending if at - j.submitted > GIVE_UP_AFTER]:
            pending.remove(job)
            job.ends = at  # its owner cancels it
        for job in list(pending) if changed else ():
            place = _wants(job, cards)
            if place is None:
                continue
            milli = sum(
                round(slice_share(memory_mib=mib, compute_pct=cm / 10, gpu_memory_mib=c.memory_mib) * MILLI)
                for c, mib, cm in place
            )
            memory = sum(mib for _, mib, _ in place)
            q = quotas[job.team_id]
            if q.limit_gpus is not None and held[job.team_id][0] + milli > float(q.limit_gpus) * MILLI:
                continue
            if q.limit_gpu_memory_mib is not None and held[job.team_id][1] + memory > q.limit_gpu_memory_mib:
                continue
            pending.remove(job)
            running.append(job)
            job.started = max(job.submitted, at) + timedelta(seconds=rng.randint(1, 20))
            job.ends = job.started + timedelta(seconds=job.sub.runtime_s)
            job.cards, job.milli, job.memory_mib = place, milli, memory
            held[job.team_id][0] += milli
            held[job.team_id][1] += memory
            for c, mib, cm in place:
                c.holders.add(job)
                c.used_mib += mib
                c.used_pct += cm // 10
        if changed or m % 5 == 0 or frame is None:
            frame = _frame(cards, by_node, rng, draw=m % 5 == 0 or frame is None)
        _minute_rows(at, frame, node_rows, model_rows, node_hours, gpu_windows)
        cluster_rows.append((at, len(pending), len(running), len(nodes), len(nodes)))
        for team_id in team_ids:
            q = quotas.get(team_id)
            g = round(float(q.guaranteed_gpus) * MILLI) if q else 0
            limit = None if q is None or q.limit_gpus is None else round(float(q.limit_gpus) * MILLI)
            h = held[team_id][0]
            waiting = [j for j in pending if j.team_id == team_id]
            team_rows.append(
                (
                    at,
                    team_id,
                    g,
                    limit,
                    h,
                    max(0, h - g),
                    None,
                    len(waiting),
                    round(sum(max(j.sub.kind.gpus, j.sub.kind.compute_pct / 100) * MILLI for j in waiting)),
                    sum(1 for j in running if j.team_id == team_id),
                )
            )
    with transaction.atomic():
        rollups_write(node_rows, node_hours, gpu_windows, model_rows, team_rows, cluster_rows)
        jobs_write(jobs, now=now, quotas=quotas)
        recorder.usage_hours_roll(now=now, hours=days * 24 + 1)
        idle_add(jobs, now=now)
        recorder.waits_roll(now=now, since=start)
    return minutes


def _frame(
    cards: list[ReplayedCard], by_node: dict[int, list[ReplayedCard]], rng: random.Random, *, draw: bool
) -> tuple:
    """What the rows of a minute say, from what the replay holds on each card: (node rows without their minute,
    GPU model rows without their minute, each card's sample). `draw`: utilisation is drawn anew (every 5 minutes)."""
    if draw:
        for c in cards:
            if any(not j.sub.kind.idle for j in c.holders):
                busy = min(100, c.used_pct) * 0.8 if c.shared else 78
                c.util = min(100.0, max(1.0, rng.gauss(busy, 10)))
            else:
                c.util = rng.uniform(0.5, 3.0) if c.holders else 0.0
    per_model: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    samples = []
    for c in cards:
        held = c.held_milli()
        t = per_model[c.model_id]
        t[0] += 1
        t[1] += 1
        t[2] += held
        t[3] += round(c.util * 10)
        if not c.holders:
            t[4] += 1
        elif held < MILLI:
            t[5] += MILLI - held
        samples.append(
            (
                c,
                c.util,
                round(c.used_mib * 0.7),
                c.used_mib,
                int(36 + c.util * 0.4),
                60 + c.util * 2.5,
                1410 if c.holders else 210,
            )
        )
    nodes = []
    for node_pk, node_cards in by_node.items():
        utils = [c.util for c in node_cards]
        nodes.append(
            (
                node_pk,
                NodeState.READY,
                len(node_cards),
                sum(c.held_milli() for c in node_cards),
                round(sum(utils) / len(utils), 2),
                sum(round(c.used_mib * 0.7) for c in node_cards),
                sum(c.used_mib for c in node_cards),
                sum(c.memory_mib for c in node_cards),
                round(sum(60 + u * 2.5 for u in utils), 1),
                int(38 + max(utils) * 0.35),
            )
        )
    return nodes, [(model_id, *t) for model_id, t in per_model.items()], samples


def _minute_rows(at, frame, node_rows, model_rows, node_hours, gpu_windows) -> None:
    """The minute's node and GPU-model rows, and its sample added to each card's 5-minute window and each node's
    hour."""
    nodes, models, samples = frame
    window = at.replace(minute=at.minute - at.minute % 5)
    for c, util, used_mib, allocated_mib, temperature, power, clock in samples:
        entry = gpu_windows.setdefault((c.pk, window), [c.node_pk, 0, 0.0, 0, 0, 0, 0.0, 0.0])
        entry[1] += 1
        entry[2] += util
        entry[3] = max(entry[3], used_mib)
        entry[4] = max(entry[4], allocated_mib)
        entry[5] = max(entry[5], temperature)
        entry[6] += power
        entry[7] += clock
    hour_of = at.replace(minute=0)
    for node_pk, state, gpus, allocated, util, *rest in nodes:
        node_rows.append((node_pk, at, state, gpus, allocated, util, *rest))
        hour = node_hours.setdefault((node_pk, hour_of), [0, gpus, 0, 0.0, 0])
        hour[0] += 1
        hour[2] += allocated
        hour[3] += util
        hour[4] += 1
    model_rows += [(at, *row) for row in models]
