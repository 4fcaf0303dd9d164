"""The event-driven metrics: counted where things happen (the cycle, the agent consumer, each API request).

With several processes (gunicorn or daphne workers, Celery workers) set PROMETHEUS_MULTIPROC_DIR to a directory
all of them on the host share, emptied at start: prometheus-client then keeps each process's values in a file
there and `/metrics` sums them (docs/operations.md, "Monitoring"). Unset (the embedded demo: one process) they live
in memory. The state-derived metrics (jobs, quotas, GPUs, agents) are read at scrape time instead:
`scheduling.observability.exposition`.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

# Seconds: sub-second cycles are the norm; a 2 s one at 20,000 pending is the target's edge.
_CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 120.0)
# Admission waits run from seconds to days.
_WAIT_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400, 259200, 604800)
_HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

CYCLE_DURATION = Histogram(
    "tessera_cycle_duration_seconds",
    "Scheduling cycles by phase: snapshot (the database read), engine, apply (the writes), total.",
    ["phase"],
    buckets=_CYCLE_BUCKETS,
)
CYCLES = Counter(
    "tessera_cycles_total", "Scheduling cycles run; stale: discarded for a newer epoch.", ["result"]
)
PLACEMENTS = Counter("tessera_placements_total", "Jobs placed by the scheduler.")
EVICTIONS = Counter(
    "tessera_evictions_total",
    "Running jobs told to stop by the scheduler: preempted (priority), reclaimed (borrowed capacity), shared.",
    ["reason"],
)
ADMISSION_WAIT = Histogram(
    "kueue_admission_wait_time_seconds",
    "From the job's last entry into the queue (its submit, or its latest requeue) to its placement, per team "
    "(Kueue's cluster_queue) and priority class. A requeued job's time running is not a wait.",
    ["cluster_queue", "priority_class"],
    buckets=_WAIT_BUCKETS,
)
AGENT_REPORTS = Counter(
    "tessera_agent_reports_total",
    "Messages from node agents handled, by kind and result: ok, refused, or stale (about a placement the portal "
    "has moved on from, expected after an outage).",
    ["kind", "result"],
)
HTTP_REQUESTS = Counter(
    "tessera_http_requests_total",
    "Portal and API requests by route, method and status.",
    ["route", "method", "status"],
)
HTTP_DURATION = Histogram(
    "tessera_http_request_duration_seconds",
    "Portal and API request latency by route and method.",
    ["route", "method"],
    buckets=_HTTP_BUCKETS,
)
