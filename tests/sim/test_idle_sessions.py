"""Idle sessions in the simulator: a job whose usage leaves its cards idle most of each hour (a notebook) is
stopped at its class's idle timeout when the policy gives idle GPUs back, and the card-hours it held idle, those
given back and the others' waits are reported against the same run with idle reclaim off."""

from __future__ import annotations

import pytest
import yaml

from scheduling.engine.types import Request
from scheduling.sim.runs import run_scenario
from scheduling.sim.scenario import parse_scenario
from scheduling.sim.scenario_types import ScenarioError
from scheduling.sim.workload import SimJob

MIN = 60.0


def notebook(**kw) -> SimJob:
    return SimJob(
        id="nb",
        team="t",
        request=Request(gpus=1),
        submit_time_s=0,
        runtime_s=8 * 3600,
        **{"busy_s": 10 * MIN, "busy_every_s": 60 * MIN, "idle_timeout_s": 30 * MIN, **kw},
    )


def test_a_notebook_busy_ten_minutes_an_hour_is_idle_fifty_and_stopped_forty_minutes_in():
    nb = notebook()
    assert nb.idle_s_between(0, 0, 3600) == 50 * MIN
    assert nb.idle_s_between(0, 0, 90 * MIN) == 50 * MIN + 20 * MIN
    assert nb.idle_s_between(1000, 1000 + 5 * MIN, 1000 + 15 * MIN) == 5 * MIN
    assert nb.idle_stop_after_s() == 40 * MIN
    assert notebook(idle_timeout_s=None).idle_stop_after_s() is None  # a class without a timeout
    assert notebook(busy_s=40 * MIN).idle_stop_after_s() is None  # never idle 30 min at a stretch
    assert notebook(busy_s=None).idle_s_between(0, 0, 3600) == 0.0  # busy all along


def test_reclaiming_idle_notebooks_gives_their_cards_to_the_work_that_waits():
    _, _, summary = run_scenario("notebooks")
    on, off = summary["policies"]["reclaim"]["idle"], summary["policies"]["no-reclaim"]["idle"]
    assert on["jobs"] == off["jobs"] == 14
    assert on["stopped_idle"] == 14 and off["stopped_idle"] == 0
    assert on["gpu_hours_held_idle"] < off["gpu_hours_held_idle"] / 5
    assert on["gpu_hours_reclaimed"] > 50 and off["gpu_hours_reclaimed"] == 0
    assert on["others_wait"]["wait_mean_s"] < off["others_wait"]["wait_mean_s"] / 3
    assert on["others_wait"]["never_started"] == 0 < off["others_wait"]["never_started"]


@pytest.mark.parametrize(
    ("usage", "said"),
    [
        ("{busy: 100%, active: 2h, every: 1h}", "streams[0].usage.active: longer than every"),
        ("{busy: 100%, every: 1h}", "streams[0].usage.active: required"),
        ("{busy: 100%, active: 10m, every: 1h, idle: 5m}", "streams[0].usage"),
    ],
)
def test_a_bad_usage_pattern_is_refused_naming_its_field(usage, said):
    text = f"""
name: bad
cluster: [{{name: a, count: 1, model: A100-80GB, gpus: 8}}]
streams:
  - {{name: s, team: t, count: 1, request: {{gpus: 1}}, runtime: 1h, usage: {usage}}}
"""
    with pytest.raises(ScenarioError) as refused:
        parse_scenario(yaml.safe_load(text))
    assert str(refused.value).startswith(said), str(refused.value)
