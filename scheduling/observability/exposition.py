"""`/metrics`: the event-driven counters (instruments.py, summed over processes where PROMETHEUS_MULTIPROC_DIR is
set) and the state read at scrape time, from PostgreSQL and the live GPU samples, so every web process answers
the same whatever process did the work.

Names follow the tools operators already run: Kueue's for the queue and quotas (a team is a `cluster_queue`,
its organisation the `cohort`, a GPU model the `flavor`), dcgm-exporter's for GPUs (`DCGM_FI_DEV_*` with `gpu`,
`UUID`, `modelName`, `Hostname`), plus Tessera's `team` and `job` labels for what runs on each card and a series
per slice of a shared card (docs/operations.md, "Monitoring", maps every name).
"""

from __future__ import annotations

import logging
import os
from collections import Counter as Tally
from collections import defaultdict
from collections.abc import Iterator

from django.conf import settings
from django.db.models import Count, Max
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import REGISTRY, Collector

from quotas.models import Quota, Team
from scheduling.agents.live_metrics import live_metrics_for_nodes
from scheduling.choices import JobState
from scheduling.cycle.models import SchedulerLease
from scheduling.cycle.selectors import team_standings
from scheduling.history.models import GpuEvent
from scheduling.inventory.models import Gpu, Node
from scheduling.inventory.selectors import (
    SILENT_AFTER_HEARTBEATS,
    heartbeat_interval_s,
    node_conditions,
    silent_after_s,
)
from scheduling.jobs.models import Job, Slice
from scheduling.jobs.states import ACTIVE_STATES, LIVE_STATES
from scheduling.observability.job_events import job_event_counts
from scheduling.observability.metrics_dir import SHARED_DIR_ENV, SharedDirCollector

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
ALL_FLAVORS = "all"


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class SchedulerCollector(Collector):
    """Jobs by team, priority class and state; each team's quota, holding and borrowing; the last cycle's age."""

    def collect(self) -> Iterator[Metric]:
        cohort_of = {
            t.pk: (t.slug, t.parent.slug if t.parent_id else "")
            for t in Team.objects.select_related("parent")
        }
        jobs = _gauge(
            "tessera_jobs",
            "Jobs by team, priority class and state (live states).",
            ["team", "priority_class", "state"],
        )
        pending = _gauge("kueue_pending_workloads", "Pending jobs per team.", ["cluster_queue", "status"])
        admitted = _gauge(
            "kueue_admitted_active_workloads",
            "Jobs holding GPUs (placed, starting, running) per team.",
            ["cluster_queue"],
        )
        pending_by_team: Tally = Tally()
        active_by_team: Tally = Tally()
        rows = (
            Job.objects.filter(state__in=LIVE_STATES)
            .values_list("team_id", "priority_class__name", "state")
            .annotate(n=Count("id"))
            .order_by()
        )
        for team_id, pc, state, n in rows:
            slug = cohort_of.get(team_id, (str(team_id), ""))[0]
            jobs.add_metric([slug, pc, state], n)
            if state == "pending":
                pending_by_team[slug] += n
            elif state in ACTIVE_STATES:
                active_by_team[slug] += n
        for slug, _ in cohort_of.values():
            pending.add_metric([slug, "active"], pending_by_team.get(slug, 0))
            admitted.add_metric([slug], active_by_team.get(slug, 0))
        yield from (jobs, pending, admitted)

        labels = ["cohort", "cluster_queue", "flavor", "resource"]
        usage = _gauge(
            "kueue_cluster_queue_resource_usage", "GPUs (whole-GPU equivalents) a team holds.", labels
        )
        nominal = _gauge("kueue_cluster_queue_nominal_quota", "A team's guaranteed GPUs.", labels)
        borrowing = _gauge(
            "kueue_cluster_queue_borrowing_limit",
            "How far beyond its guarantee a team may borrow (GPUs).",
            labels,
        )
        team_gpus = _gauge(
            "tessera_team_gpus",
            "Per team, in GPUs: held, guaranteed, borrowed (beyond the guarantee), pending (asked for by its "
            "waiting jobs), fair_share.",
            ["team", "kind"],
        )
        standings = team_standings()
        for quota in Quota.objects.select_related("gpu_model"):
            slug, cohort = cohort_of.get(quota.team_id, (str(quota.team_id), ""))
            flavor = quota.gpu_model.name if quota.gpu_model_id else ALL_FLAVORS
            nominal.add_metric([cohort, slug, flavor, GPU_RESOURCE], float(quota.guaranteed_gpus))
            if quota.limit_gpus is not None:
                borrowing.add_metric(
                    [cohort, slug, flavor, GPU_RESOURCE], float(quota.limit_gpus - quota.guaranteed_gpus)
                )
        for team_id, (slug, cohort) in cohort_of.items():
            t = standings.get(team_id)
            if t is None:
                continue
            held = round(t.held_gpus, 3)
            usage.add_metric([cohort, slug, ALL_FLAVORS, GPU_RESOURCE], held)
            team_gpus.add_metric([slug, "held"], held)
            team_gpus.add_metric([slug, "guaranteed"], t.guaranteed_gpus)
            team_gpus.add_metric([slug, "borrowed"], round(t.borrowed_gpus, 3))
            team_gpus.add_metric([slug, "pending"], t.pending_gpus)
            if t.fair_share_gpus is not None:
                team_gpus.add_metric([slug, "fair_share"], round(t.fair_share_gpus, 3))
        yield from (usage, nominal, borrowing, team_gpus)

        lease = SchedulerLease.objects.filter(pk=1).first()
        last = _gauge(
            "tessera_scheduler_last_cycle_timestamp_seconds",
            "When the last scheduling cycle started (Unix s).",
            [],
        )
        if lease and lease.issued_at:
            last.add_metric([], lease.issued_at.timestamp())
        yield last
        epoch = _gauge("tessera_scheduler_epoch", "The scheduler's fencing epoch (grows by one a cycle).", [])
        epoch.add_metric([], lease.issued_epoch if lease else 0)
        yield epoch


class GpuCollector(Collector):
    """Each GPU's newest sample under dcgm-exporter's names, labelled with what runs on it; a series per slice."""

    FIELDS = (
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "util_pct"),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "mem_util_pct"),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "memory_used_mib"),
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w"),
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature_c"),
        ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz"),
    )
    LABELS = ["gpu", "UUID", "modelName", "Hostname", "team", "job"]

    def collect(self) -> Iterator[Metric]:
        gpus = list(Gpu.objects.select_related("node", "model").order_by("node__name", "index"))
        holders: dict[int, list[tuple]] = defaultdict(list)
        for gpu_id, job_id, slug, memory_mib, pct in Slice.objects.filter(
            job__state__in=ACTIVE_STATES
        ).values_list("gpu_id", "job_id", "job__team__slug", "memory_mib", "compute_pct"):
            holders[gpu_id].append((job_id, slug, memory_mib, pct))
        live = live_metrics_for_nodes(node_names={g.node.name for g in gpus})
        last_xid = dict(
            GpuEvent.objects.filter(kind="xid")
            .values_list("gpu_id")
            .annotate(last=Max("id"))
            .values_list("gpu_id", "last")
        )
        xid_code = dict(GpuEvent.objects.filter(pk__in=last_xid.values()).values_list("gpu_id", "code"))
        families = {name: _gauge(name, doc, self.LABELS) for name, doc, _ in self.FIELDS}
        free = _gauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", self.LABELS)
        xid = _gauge("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", self.LABELS)
        slice_memory = _gauge(
            "tessera_gpu_slice_memory_allocated_mib",
            "GPU memory a job's slice holds on a card (MiB).",
            self.LABELS,
        )
        slice_compute = _gauge(
            "tessera_gpu_slice_compute_pct", "Compute share a job's slice holds on a card (%).", self.LABELS
        )
        allocated = _gauge(
            "tessera_gpu_memory_allocated_mib",
            "GPU memory allocated on a card, all its slices (MiB).",
            ["gpu", "UUID", "modelName", "Hostname"],
        )
        for g in gpus:
            held = holders.get(g.pk, [])
            team, job = (held[0][1], str(held[0][0])) if len(held) == 1 else ("", "")
            base = [str(g.index), g.uuid, g.model.name, g.node.name]
            labels = [*base, team, job]
            allocated.add_metric(base, g.allocated_memory_mib)
            for job_id, slug, memory_mib, pct in held:
                slice_memory.add_metric([*base, slug, str(job_id)], memory_mib)
                slice_compute.add_metric([*base, slug, str(job_id)], pct)
            xid.add_metric(labels, xid_code.get(g.pk, 0))
            sample = live.get(g.node.name, {}).get(g.index)
            if sample is None:
                continue
            for name, _, field in self.FIELDS:
                if sample.get(field) is not None:
                    families[name].add_metric(labels, sample[field])
            used, total = sample.get("memory_used_mib"), sample.get("memory_total_mib")
            if used is not None and total is not None:
                free.add_metric(labels, max(0, total - used))
        yield from families.values()
        yield from (free, xid, slice_memory, slice_compute, allocated)


class AgentCollector(Collector):
    """Per node: its state, whether its agent is connected (the portal's one rule, as the API and the cluster map
    say it), the age of its last heartbeat; and the deadlines alerts are measured against."""

    def collect(self) -> Iterator[Metric]:
        connected = _gauge(
            "tessera_agent_connected",
            f"1 while the node's agent is connected: its socket has not closed since its last hello AND it was "
            f"heard within {SILENT_AFTER_HEARTBEATS} heartbeat intervals (TESSERA_AGENT_HEARTBEAT_S, "
            f"{silent_after_s():g} s); 0 when silent, disconnected or never connected. A socket the portal never "
            "saw close (a web process killed) does not count.",
            ["node"],
        )
        connection = _gauge(
            "tessera_agent_connection",
            "1 for the node's agent connection: connected, silent (no heartbeat for two intervals), disconnected "
            "(its socket closed) or never_connected.",
            ["node", "connection"],
        )
        age = _gauge(
            "tessera_agent_heartbeat_age_seconds", "Seconds since the node's last heartbeat.", ["node"]
        )
        state = _gauge("tessera_node_state", "1 for the node's current state.", ["node", "state"])
        nodes = list(Node.objects.values_list("pk", "name", "state", "last_heartbeat_at"))
        conditions = node_conditions(nodes=[(pk, st, heard) for pk, _, st, heard in nodes])
        for pk, name, node_state, _ in nodes:
            c = conditions[pk]
            connected.add_metric([name], int(c.connected))
            connection.add_metric([name, c.connection], 1)
            if c.heartbeat_age_s is not None:
                age.add_metric([name], c.heartbeat_age_s)
            state.add_metric([name, node_state], 1)
        yield from (connected, connection, age, state)
        for name, doc, value in (
            (
                "tessera_agent_heartbeat_interval_seconds",
                "How often agents send a heartbeat (TESSERA_AGENT_HEARTBEAT_S).",
                heartbeat_interval_s(),
            ),
            (
                "tessera_node_lost_after_seconds",
                "A node silent this long is lost: nothing more is placed on it (TESSERA_NODE_LOST_AFTER_S).",
                float(settings.TESSERA_NODE_LOST_AFTER_S),
            ),
            (
                "tessera_agent_fence_after_seconds",
                "A job's supervisor stops it once its agent's lease is this old (TESSERA_AGENT_FENCE_AFTER_S): "
                "silence this long costs the node's jobs.",
                float(settings.TESSERA_AGENT_FENCE_AFTER_S),
            ),
        ):
            setting = _gauge(name, doc, [])
            setting.add_metric([], value)
            yield setting


# The reasons written today (scheduling/cycle/watchdog.py, scheduling/agents/reports/job_status.py). A counter
# that first appears at 1 shows no increase() in Prometheus, so these are exported at 0 before their first event.
_JOB_EVENT_REASONS = [
    *((JobState.LOST, code) for code in ("node_lost", "agent_lost", "agent_stopped", "gpus_not_on_node")),
    *((JobState.PENDING, code) for code in ("requeued_node_lost", "requeued", "moved")),
]


class JobLossCollector(Collector):
    """Jobs lost and requeued, counted from their JobEvents (the truth, whichever process wrote them)."""

    def collect(self) -> Iterator[Metric]:
        lost = CounterMetricFamily(
            "tessera_jobs_lost",
            "Placements lost, by reason: node_lost (the node went silent and its supervisors fenced the job), "
            "agent_lost / agent_stopped (the agent reported the job's process gone), gpus_not_on_node. Counted "
            "from the jobs' events.",
            labels=["reason"],
        )
        requeued = CounterMetricFamily(
            "tessera_jobs_requeued",
            "Jobs sent back to the queue after they had been placed, by reason: requeued_node_lost, requeued (a "
            "lost process, a preemption, an admin), moved (stopped to make room, its place held). Counted from the "
            "jobs' events.",
            labels=["reason"],
        )
        counts = Tally(
            {key: 0 for key in _JOB_EVENT_REASONS}
        )  # each known reason from 0, so increase() sees it
        counts.update(job_event_counts())
        for (to_state, code), n in sorted(counts.items()):
            (lost if to_state == JobState.LOST else requeued).add_metric([code or "unknown"], n)
        yield from (lost, requeued)


_STATE_COLLECTORS = {
    "scheduler": SchedulerCollector(),
    "gpus": GpuCollector(),
    "agents": AgentCollector(),
    "job_events": JobLossCollector(),
}


class _Guarded(Collector):
    """The collectors' metrics, each collector on its own: one that fails (the database is down) leaves its series
    out, logs why and says so in `tessera_metrics_collector_success`, so the rest of the scrape (readiness above
    all) still answers."""

    def __init__(self, collectors: dict[str, Collector]) -> None:
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        success = _gauge(
            "tessera_metrics_collector_success",
            "1 when this collector's figures were read at this scrape; 0 when it failed (its series are missing: "
            "the portal's log says why).",
            ["collector"],
        )
        for name, collector in self.collectors.items():
            try:
                families = list(collector.collect())
            except Exception:  # noqa: BLE001 - one failed read must not take the whole scrape with it
                log.exception("/metrics: the %s collector failed", name)
                success.add_metric([name], 0)
                continue
            success.add_metric([name], 1)
            yield from families
        yield success


def metrics_text(*, extra: dict[str, Collector] | None = None) -> bytes:
    """The exposition, text format 0.0.4: the event counters (this process's, or every process's sharing the
    multiprocess directory, or every container's sharing TESSERA_METRICS_SHARED_DIR) and the state read now,
    plus `extra` collectors by name (the portal adds readiness)."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        shared = os.environ.get(SHARED_DIR_ENV)
        if shared:
            registry.register(SharedDirCollector(shared))
        else:
            MultiProcessCollector(registry)
    else:
        registry = _SumRegistry(REGISTRY)
    registry.register(_Guarded({**_STATE_COLLECTORS, **(extra or {})}))
    return generate_latest(registry)


class _SumRegistry(CollectorRegistry):
    """One process: this process's instruments (the default registry) with the state collectors beside them."""

    def __init__(self, base: CollectorRegistry) -> None:
        super().__init__(auto_describe=False)
        self._base = base

    def collect(self) -> Iterator[Metric]:
        yield from self._base.collect()
        yield from super().collect()
