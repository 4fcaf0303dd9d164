"""openb dynamic mode on the first pods of the default list (skipped when the trace is not beside the repo)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduling.sim.cli_dynamic import main_dynamic
from scheduling.sim.des import SimConfig
from scheduling.sim.dynamic import QOS_CLASSES, openb_jobs, run_dynamic, team_of
from scheduling.sim.metrics import summarize
from scheduling.sim.openb import load_pods

TRACE = Path(__file__).resolve().parents[2] / "../shared/traces/openb"
NODES = TRACE / "openb_node_list_gpu_node.csv"
PODS = TRACE / "openb_pod_list_default.csv"
needs_trace = pytest.mark.skipif(
    not PODS.exists(), reason=f"openb trace not found at {TRACE.resolve()} (clone shared/ beside the repo)"
)


def test_the_team_rule_is_stable_and_spreads_pods():
    assert team_of("openb-pod-0000", 4) == team_of("openb-pod-0000", 4)
    teams = {team_of(f"openb-pod-{i:04d}", 4) for i in range(200)}
    assert teams == {"team-0", "team-1", "team-2", "team-3"}


def test_qos_sets_priority_and_preemptibility():
    assert QOS_CLASSES["LS"].priority > QOS_CLASSES["Burstable"].priority > QOS_CLASSES["BE"].priority
    assert not QOS_CLASSES["LS"].preemptible and not QOS_CLASSES["Guaranteed"].preemptible
    assert QOS_CLASSES["BE"].preemptible


@needs_trace
def test_pods_become_jobs_with_their_timestamps_as_arrival_and_runtime():
    pods = load_pods(PODS)[:50]
    jobs = openb_jobs(pods, teams=3)
    for pod, job in zip(pods, jobs, strict=True):
        assert job.submit_time_s == pod.creation_time_s
        assert job.runtime_s == max(1, pod.deletion_time_s - pod.creation_time_s)
        assert job.priority == QOS_CLASSES[pod.qos].priority
        assert job.team == team_of(pod.name, 3)


@needs_trace
def test_the_first_pods_of_openb_default_replay_through_the_engine():
    (run,) = run_dynamic(nodes_csv=NODES, pods_csv=PODS, policies=["default"], limit=400, config=SimConfig())
    figures = summarize(run.result)
    assert figures["jobs_arrived"] == 400
    assert figures["wait"]["started"] >= 395
    assert 0 < figures["allocation"] < 1 and figures["utilization"] <= figures["allocation"]
    assert set(figures["wait_by_team"]) == {"team-0", "team-1", "team-2", "team-3"}
    # Arrivals on an almost empty cluster wait at most one cycle.
    assert figures["wait"]["wait_p95_s"] <= 10


@needs_trace
def test_the_dynamic_command_prints_json(capsys):
    code = main_dynamic(
        [
            "--nodes",
            str(NODES),
            "--pods",
            str(PODS),
            "--limit",
            "150",
            "--json",
            "--no-report",
            "--quiet",
            "--compression",
            "50",
            "--policy",
            "default",
            "--policy",
            "spread",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"default", "spread"}
    assert out["jobs"] == 150 and out["gpus"] == 6212
