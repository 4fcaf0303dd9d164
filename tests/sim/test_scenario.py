"""YAML scenarios: validation errors name the field; built-in scenarios load; synthetic streams are deterministic."""

from __future__ import annotations

import copy

import pytest
import yaml

from scheduling.engine.types import Request, Sharing
from scheduling.sim.scenario import builtin_scenarios, load_scenario, parse_scenario
from scheduling.sim.scenario_types import ScenarioError
from scheduling.sim.synthetic import Arrival, Runtime, Stream, generate, stream_jobs, with_whole_cards

BASE = {
    "cluster": [
        {
            "name": "dgx",
            "count": 2,
            "model": "A100-80GB",
            "gpus": 8,
            "memory": "1TiB",
            "cpu": 128,
            "nvlink": "all",
        }
    ],
    "teams": [{"name": "ai-lab/training", "quota": {"gpu_memory": "320GB"}}],
    "priority_classes": {"training": {"priority": 100, "preemptible": False}},
    "streams": [
        {
            "name": "train",
            "team": "ai-lab/training",
            "priority_class": "training",
            "count": 3,
            "arrival": {"process": "poisson", "rate_per_h": 2},
            "request": {"gpus": 8, "topology": "nvlink"},
            "runtime": {"dist": "lognormal", "median": "2h", "sigma": 0.4},
        }
    ],
    "policies": [{"name": "binpack", "profile": "binpack"}],
}


def _with(path: str, value):
    doc = copy.deepcopy(BASE)
    node = doc
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return doc


def test_it_reads_a_valid_scenario_with_units():
    s = parse_scenario(BASE)
    assert len(s.nodes) == 2 and all(len(n.gpus) == 8 for n in s.nodes)
    assert s.nodes[0].memory_mib == 1024 * 1024
    assert s.nodes[0].cpu_milli == 128_000
    assert (0, 7) in s.nodes[0].nvlink
    assert s.quotas["ai-lab/training"].guaranteed_gpu_memory_mib == 320 * 1024
    assert s.streams[0].priority == 100 and s.streams[0].preemptible is False


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("cluster.0.memory", "12XB", "cluster[0].memory"),
        ("cluster.0.memory", -5, "cluster[0].memory"),
        ("cluster.0.model", "Z9000", "cluster[0].model"),
        ("cluster.0.count", -1, "cluster[0].count"),
        ("cluster.0.sharing", "shared", "cluster[0].sharing"),
        ("streams.0.count", -3, "streams[0].count"),
        ("streams.0.team", "nobody", "streams[0].team"),
        ("streams.0.priority_class", "vip", "streams[0].priority_class"),
        ("streams.0.runtime", {"dist": "weibull"}, "streams[0].runtime.dist"),
        ("streams.0.arrival", {"process": "poisson"}, "streams[0].arrival.rate_per_h"),
        ("streams.0.request", {"gpus": 1, "gpu_memory": "4GiB"}, "streams[0].request.gpu_memory"),
        ("streams.0.request", {"gpu_compute": "150%"}, "streams[0].request.gpu_compute"),
        ("teams.0.quota", {"gpu_memory": "lots"}, "teams[0].quota.gpu_memory"),
    ],
)
def test_it_names_the_field_of_an_invalid_value(path, value, field):
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(_with(path, value))
    assert str(exc.value).startswith(field), str(exc.value)


def test_it_rejects_an_unknown_field_by_name():
    doc = _with("cluster.0.gpu_count", 8)
    with pytest.raises(ScenarioError, match=r"^cluster\[0\]\.gpu_count: unknown field"):
        parse_scenario(doc)


def test_it_rejects_a_failure_on_an_unknown_node():
    doc = copy.deepcopy(BASE)
    doc["simulation"] = {"failures": [{"node": "dgx-09", "at": "1h"}]}
    with pytest.raises(ScenarioError, match=r"^simulation\.failures\[0\]\.node"):
        parse_scenario(doc)


def test_it_explains_an_unknown_builtin_scenario():
    with pytest.raises(ScenarioError, match="seed-case"):
        load_scenario("no-such-scenario")


@pytest.mark.parametrize("name", builtin_scenarios())
def test_every_builtin_scenario_loads_and_generates_jobs(name):
    s = load_scenario(name)
    assert s.policies and s.jobs()


def test_the_seed_case_is_built_in():
    assert "seed-case" in builtin_scenarios()


def test_it_reads_a_scenario_file_by_path(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert load_scenario(path).name == "mine"


def test_synthetic_streams_are_deterministic_by_seed():
    s = parse_scenario(BASE)
    first, again, other = s.jobs(seed=1), s.jobs(seed=1), s.jobs(seed=2)
    assert first == again
    assert [j.submit_time_s for j in first] != [j.submit_time_s for j in other]


def test_adding_a_stream_leaves_the_other_streams_jobs_unchanged():
    a = Stream("a", "t", 20, Request(gpus=1), Arrival("poisson", 0, None, 10), Runtime("exponential", 600))
    b = Stream(
        "b", "t", 20, Request(gpus=2), Arrival("random", 0, 3600), Runtime("uniform", low_s=60, high_s=120)
    )
    alone = stream_jobs(a, 5)
    together = [j for j in generate([a, b], 5) if j.id.startswith("a-")]
    assert alone == together


def test_poisson_arrivals_stop_at_the_end_of_their_window():
    s = Stream("a", "t", 10_000, Request(gpus=1), Arrival("poisson", 0, 3600, 60), Runtime())
    jobs = stream_jobs(s, 0)
    assert 30 < len(jobs) < 100 and max(j.submit_time_s for j in jobs) < 3600


def test_whole_cards_turn_a_slice_into_a_card_without_changing_its_real_use():
    s = Stream("inf", "t", 1, Request(gpu_memory_mib=4096, gpu_compute_milli=100), runtime=Runtime())
    (job,) = stream_jobs(s, 0)
    whole = with_whole_cards(job)
    assert whole.request.gpus == 1 and not whole.request.is_slice
    assert whole.usage_milli == job.usage_milli == 100


def test_a_policy_may_force_a_sharing_mode():
    s = load_scenario("seed-case")
    fifo = next(p for p in s.policies if p.whole_cards)
    assert {g.sharing for n in s.nodes_for(fifo) for g in n.gpus} == {Sharing.EXCLUSIVE}


def test_a_synthetic_block_adds_a_mixed_stream_set_per_team():
    doc = copy.deepcopy(BASE)
    doc["teams"].append({"name": "ai-lab/inference"})
    doc["synthetic"] = {"jobs_per_hour": 20, "duration": "4h", "shares": [0.5, 0.5, 0]}
    s = parse_scenario(doc)
    kinds = {(st.team, st.kind) for st in s.streams if st.name != "train"}
    assert kinds == {(t, k) for t in ("ai-lab/training", "ai-lab/inference") for k in ("inference", "batch")}
    jobs = s.jobs(seed=4)
    assert jobs == s.jobs(seed=4)
    assert all(j.submit_time_s < 4 * 3600 for j in jobs if not j.id.startswith("train"))


def test_a_synthetic_block_needs_a_positive_rate():
    doc = copy.deepcopy(BASE)
    doc["synthetic"] = {"jobs_per_hour": 0}
    with pytest.raises(ScenarioError, match=r"^synthetic\.jobs_per_hour"):
        parse_scenario(doc)
