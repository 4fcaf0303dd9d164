"""/metrics scraped from the live portal while a job runs, parsed with prometheus-client's own parser: the
scheduler's, Kueue's, dcgm-exporter's and the agents' names with real values, summed over daphne and the worker,
and /readyz's checks beside them."""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.pipeline.harness import submit, wait_for, wait_state


def _scrape(pipe) -> dict[str, list]:
    response = requests.get(f"http://127.0.0.1:{pipe.port}/metrics", timeout=10)
    assert response.status_code == 200, response.text[:300]
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def _value(samples, name: str, **labels) -> float:
    found = [s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert found, f"no {name} with {labels}; have {[s.labels for s in samples.get(name, [])][:5]}"
    return sum(found)


def test_metrics_name_what_runs_where_with_real_values(pipe):
    job = wait_state(submit(pipe, gpus=1, command="sleep 60"), "running", timeout_s=60)
    node = job.slices.get().gpu.node.name

    def sampled():
        return any(s.labels.get("job") == str(job.pk) for s in _scrape(pipe).get("DCGM_FI_DEV_GPU_UTIL", []))

    wait_for("the job's card to be sampled", sampled, timeout_s=30)
    m = _scrape(pipe)
    team = "pipe-lab"
    # The scheduler, counted in the worker that ran the cycles.
    assert _value(m, "tessera_cycle_duration_seconds_count", phase="snapshot") >= 1
    assert _value(m, "tessera_cycle_duration_seconds_count", phase="apply") >= 1
    assert _value(m, "tessera_placements_total") >= 1
    assert _value(m, "kueue_admission_wait_time_seconds_count", cluster_queue=team) >= 1
    # The state, read at scrape time.
    assert _value(m, "kueue_admitted_active_workloads", cluster_queue=team) >= 1
    assert _value(m, "kueue_pending_workloads", cluster_queue=team, status="active") >= 0
    assert _value(m, "kueue_cluster_queue_resource_usage", cluster_queue=team, resource="nvidia.com/gpu") >= 1
    assert _value(m, "kueue_cluster_queue_nominal_quota", cluster_queue=team, flavor="all") == 100
    assert _value(m, "tessera_jobs", team=team, state="running") >= 1
    assert _value(m, "tessera_team_gpus", team=team, kind="held") >= 1
    assert _value(m, "tessera_scheduler_last_cycle_timestamp_seconds") > 0
    # The GPUs under dcgm-exporter's names, labelled with what runs on them.
    util = [s for s in m["DCGM_FI_DEV_GPU_UTIL"] if s.labels["job"] == str(job.pk)]
    assert util[0].labels["Hostname"] == node and util[0].labels["team"] == team
    assert util[0].labels["UUID"] and util[0].labels["modelName"] == "A100-80GB"
    for name in (
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
    ):
        assert _value(m, name, Hostname=node) >= 0
    assert _value(m, "DCGM_FI_DEV_XID_ERRORS", Hostname=node) == 0
    assert _value(m, "tessera_gpu_slice_memory_allocated_mib", job=str(job.pk)) == 81920
    # The agents and the API, counted in daphne.
    assert _value(m, "tessera_agent_connected", node=node) == 1
    assert 0 <= _value(m, "tessera_agent_heartbeat_age_seconds", node=node) < 30
    assert _value(m, "tessera_agent_reports_total", kind="heartbeat", result="ok") >= 1
    assert _value(m, "tessera_http_requests_total", route="metrics", method="GET", status="200") >= 1
    # /readyz's checks and the jobs' losses, read at scrape time; every collector answered.
    assert _value(m, "tessera_ready") == 1
    assert _value(m, "tessera_readiness_check", check="database") == 1
    assert _value(m, "tessera_readiness_check", check="redis") == 1
    assert all(s.value == 1 for s in m["tessera_metrics_collector_success"])
    assert _value(m, "tessera_jobs_lost_total", reason="node_lost") >= 0
    assert _value(m, "tessera_agent_connection", node=node, connection="connected") == 1
