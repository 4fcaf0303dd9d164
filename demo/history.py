"""The embedded demo's past: days of generated history rollups before now, so the history and capacity pages show
something at once (`manage.py load_demo --history-days`)."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction

from quotas.models import Membership, Quota, Team
from scheduling.choices import NodeState, SharingMode
from scheduling.history.models import (
    ClusterMinute,
    GpuFiveMinute,
    ModelMinute,
    NodeHour,
    NodeMinute,
    TeamMinute,
    UsageHour,
)
from scheduling.history.partitions import partitions_ensure
from scheduling.inventory.models import Gpu, Node

# So that a new user of `make demo` sees the history and capacity pages with something on them at once: past
# rollups written straight into the history tables, derived from the demo cluster's real nodes, teams and people.
# They are generated, not recorded: a working-day load curve (busiest mid-afternoon UTC, quieter at weekends) with
# noise, seeded so every run draws the same picture. The recorder writes the real minutes from now on.
HISTORY_TEAM_WEIGHTS = {"ai-lab/training": 0.6, "ai-lab/research": 0.25, "ai-lab/inference": 0.15}


def _load(at: datetime, node_phase: float, rng: random.Random) -> float:
    """The fraction of a node's cards allocated at a minute: a diurnal curve, lower at weekends, with noise."""
    hour = at.hour + at.minute / 60
    day = 0.5 + 0.4 * math.sin(2 * math.pi * (hour - 9 + node_phase) / 24)
    weekend = 0.6 if at.weekday() >= 5 else 1.0
    return min(1.0, max(0.0, day * weekend + rng.gauss(0, 0.06)))


def _insert(model, columns: tuple[str, ...], rows: list[tuple]) -> None:
    if not rows:
        return
    marks = ", ".join(["%s"] * len(columns))
    sql = f"INSERT INTO {model._meta.db_table} ({', '.join(columns)}) VALUES ({marks})"
    with connection.cursor() as cursor:
        for k in range(0, len(rows), 5000):
            cursor.executemany(sql, rows[k : k + 5000])


def history_backfill(*, days: int, now: datetime | None = None, seed: int = 7) -> int:
    """Write `days` days of generated history before now (node minutes, GPU 5-minute windows, GPU models, teams,
    the queue, hourly usage). Nothing when history is already there (a second load, or a recorder that has run a
    while). Returns the minutes written."""
    now = (now or datetime.now(UTC)).astimezone(UTC).replace(second=0, microsecond=0)
    start = now - timedelta(days=days)
    if days <= 0 or ClusterMinute.objects.filter(at__lt=now - timedelta(minutes=10)).exists():
        return 0
    rng = random.Random(seed)
    nodes = list(Node.objects.order_by("name").values_list("pk", "name"))
    gpus = defaultdict(list)
    for pk, node_id, model_id, memory_mib, sharing in Gpu.objects.order_by("node_id", "index").values_list(
        "pk", "node_id", "model_id", "memory_mib", "sharing_mode"
    ):
        gpus[node_id].append((pk, model_id, memory_mib, sharing))
    weights = dict(HISTORY_TEAM_WEIGHTS)
    teams = {t.slug: t.pk for t in Team.objects.filter(slug__in=weights)}
    if not teams:  # not the demo's teams: every team with members, in equal parts
        teams = dict(
            Team.objects.filter(memberships__isnull=False)
            .distinct()
            .values_list("slug", "pk")
            .order_by("slug")
        )
        weights = {slug: 1 / len(teams) for slug in teams}
    members = defaultdict(list)
    for team_id, user_id in Membership.objects.filter(team_id__in=teams.values()).values_list(
        "team_id", "user_id"
    ):
        members[team_id].append(user_id)
    guaranteed = dict(Quota.objects.filter(gpu_model__isnull=True).values_list("team_id", "guaranteed_gpus"))
    limits = dict(Quota.objects.filter(gpu_model__isnull=True).values_list("team_id", "limit_gpus"))
    partitions_ensure(days=[(start + timedelta(days=d)).date() for d in range(days + 1)])
    phase = {pk: rng.uniform(-1.5, 1.5) for pk, _ in nodes}
    node_rows, gpu_rows, model_rows, team_rows, cluster_rows = [], [], [], [], []
    held_by_hour_model: dict[tuple[datetime, int], float] = defaultdict(float)  # GPU-seconds
    node_hours: dict[tuple[int, datetime], list] = {}
    minutes = int((now - start).total_seconds() // 60)
    # The load moves in 5-minute steps (the GPU windows' width); each minute of a step repeats its rows.
    for first in range(0, minutes, 5):
        window = start + timedelta(minutes=first)
        span = [window + timedelta(minutes=k) for k in range(min(5, minutes - first))]
        per_model: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0, 0])
        total_held = 0.0
        for pk, _name in nodes:
            cards = gpus.get(pk, [])
            if not cards:
                continue
            busy = round(_load(window, phase[pk], rng) * len(cards))
            utils = [min(100.0, max(0.0, rng.gauss(78, 12))) if i < busy else 0.0 for i in range(len(cards))]
            alloc_mib = sum(c[2] for c in cards[:busy])
            node = (
                len(cards),
                busy * 1000,
                round(sum(utils) / len(cards), 2),
                round(alloc_mib * 0.7),
                alloc_mib,
            )
            node_rest = (
                sum(c[2] for c in cards),
                round(60 * len(cards) + sum(utils) * 2.5, 1),
                int(38 + max(utils) * 0.35),
            )
            node_rows += [(pk, at, NodeState.READY, *node, *node_rest) for at in span]
            hour = node_hours.setdefault((pk, window.replace(minute=0)), [0, len(cards), 0, 0.0, 0])
            hour[0] += len(span)
            hour[2] += node[1] * len(span)
            hour[3] += node[2] * len(span)
            hour[4] += len(span)
            n = len(span)
            for i, (gpu_id, model_id, card_mib, sharing) in enumerate(cards):
                held, util = i < busy, utils[i]
                gpu_rows.append(
                    (
                        gpu_id,
                        window,
                        pk,
                        n,
                        util * n,
                        round(card_mib * 0.7) if held else 0,
                        card_mib if held else 0,
                        int(36 + util * 0.4),
                        (60 + util * 2.5) * n,
                        (1410 if held else 210) * n,
                        0,
                    )
                )
                t = per_model[model_id]
                t[0] += 1
                t[1] += 1
                t[3] += round(util * 10)
                shared = sharing != SharingMode.EXCLUSIVE
                if not held:
                    t[4] += 1
                    continue
                # A shared card (MPS, time-sliced) half used leaves the other half stranded.
                t[2] += 500 if shared else 1000
                t[5] += 500 if shared else 0
                total_held += 0.5 if shared else 1.0
                held_by_hour_model[(window.replace(minute=0), model_id)] += 60 * n * (0.5 if shared else 1.0)
        pending = max(0, round(6 * _load(window, 0.0, rng) + rng.gauss(0, 1.2)))
        for at in span:
            model_rows += [(at, model_id, *t) for model_id, t in per_model.items()]
            cluster_rows.append((at, pending, round(total_held / 2), len(nodes), len(nodes)))
        for slug, weight in weights.items():
            if slug not in teams:
                continue
            team_id = teams[slug]
            held_milli = round(total_held * weight * 1000)
            g = round(float(guaranteed.get(team_id) or 0) * 1000)
            limit = limits.get(team_id)
            row = (
                team_id,
                g,
                None if limit is None else round(float(limit) * 1000),
                held_milli,
                max(0, held_milli - g),
                None,
                round(pending * weight),
                round(pending * weight) * 1000,
                max(0, round(total_held * weight / 2)),
            )
            team_rows += [(at, *row) for at in span]
    usage_rows = []
    for (hour, model_id), seconds in held_by_hour_model.items():
        for slug, weight in weights.items():
            people = members.get(teams.get(slug), [])
            for n, user_id in enumerate(people):
                share = (
                    weight * (0.7 if n == 0 else 0.3 / max(1, len(people) - 1)) if len(people) > 1 else weight
                )
                gpu_s = round(seconds * share, 1)
                if gpu_s:
                    usage_rows.append(
                        (
                            hour,
                            teams[slug],
                            user_id,
                            model_id,
                            gpu_s,
                            round(gpu_s * 72, 1),
                            round(gpu_s * 0.12, 1),
                        )
                    )
    with transaction.atomic():
        _insert(
            NodeMinute,
            (
                "node_id",
                "at",
                "state",
                "gpus",
                "allocated_milli",
                "util_pct",
                "memory_used_mib",
                "memory_allocated_mib",
                "memory_mib",
                "power_w",
                "temperature_max_c",
            ),
            node_rows,
        )
        _insert(
            NodeHour,
            ("node_id", "hour", "minutes", "gpus", "allocated_milli_sum", "util_pct_sum", "util_minutes"),
            [(*key, *v) for key, v in node_hours.items()],
        )
        _insert(
            GpuFiveMinute,
            (
                "gpu_id",
                "at",
                "node_id",
                "samples",
                "util_pct_sum",
                "memory_used_mib_max",
                "memory_allocated_mib",
                "temperature_c_max",
                "power_w_sum",
                "sm_clock_mhz_sum",
                "ecc_uncorrected",
            ),
            gpu_rows,
        )
        _insert(
            ModelMinute,
            (
                "at",
                "model_id",
                "gpus",
                "ready_gpus",
                "allocated_milli",
                "used_milli",
                "free_gpus",
                "stranded_milli",
            ),
            model_rows,
        )
        _insert(
            TeamMinute,
            (
                "at",
                "team_id",
                "guaranteed_milli",
                "limit_milli",
                "held_milli",
                "borrowed_milli",
                "fair_share_milli",
                "pending_jobs",
                "pending_milli",
                "running_jobs",
            ),
            team_rows,
        )
        _insert(ClusterMinute, ("at", "pending_jobs", "running_jobs", "ready_nodes", "nodes"), cluster_rows)
        _insert(
            UsageHour,
            (
                "hour",
                "team_id",
                "user_id",
                "model_id",
                "gpu_seconds",
                "gpu_memory_gib_seconds",
                "idle_gpu_seconds",
            ),
            usage_rows,
        )
    return minutes
