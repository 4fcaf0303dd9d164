"""Invariants of random simulated days through the production engine: no card over-booked (the simulator refuses
such a decision), work conserved, preempted jobs requeued and finished, and the same seed gives the same day."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine.profiles import get_profile
from scheduling.engine.types import Request, TopologyNeed
from scheduling.sim.des import JobState, SimConfig, simulate
from scheduling.sim.metrics import summarize
from scheduling.sim.scenario import parse_scenario
from scheduling.sim.synthetic import Arrival, Runtime, Stream, generate

CLUSTER = parse_scenario(
    {
        "cluster": [
            {"name": "dgx", "count": 2, "model": "A100-40GB", "gpus": 8, "nvlink": "all", "sharing": "mps"},
            {"name": "l4", "count": 2, "model": "L4", "gpus": 4, "sharing": "timeslice"},
        ],
        "streams": [{"name": "x", "team": "t", "count": 1, "request": {"gpus": 1}, "runtime": 60}],
    }
).nodes

REQUESTS = st.sampled_from(
    [
        Request(gpus=1),
        Request(gpus=2),
        Request(gpus=8, topology=TopologyNeed.NVLINK),
        Request(gpu_memory_mib=4096, gpu_compute_milli=100),
        Request(gpu_memory_mib=10_240, gpu_compute_milli=250),
    ]
)
STREAMS = st.lists(
    st.builds(
        lambda i, req, rate, prio, ckpt: Stream(
            name=f"s{i}",
            team=f"team-{i % 2}",
            count=12,
            request=req,
            arrival=Arrival("poisson", 0, 4 * 3600, rate),
            runtime=Runtime("exponential", 1800, max_s=3 * 3600),
            priority=prio,
            preemptible=prio < 100,
            grace_s=30,
            checkpoint_interval_s=ckpt,
        ),
        st.integers(0, 1000),
        REQUESTS,
        st.floats(1, 20),
        st.sampled_from([0, 10, 50, 100]),
        st.sampled_from([None, 600.0]),
    ),
    min_size=1,
    max_size=4,
    unique_by=lambda s: s.name,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams=STREAMS, seed=st.integers(0, 10_000))
def test_random_days_keep_the_books_straight(streams, seed):
    jobs = generate(streams, seed)
    config = SimConfig(cycle_interval_s=10, horizon_s=None, seed=seed)
    result = simulate(nodes=CLUSTER, jobs=jobs, profile=get_profile("tessera-prod"), config=config)
    capacity = result.capacity_milli
    assert all(0 <= p.allocated_milli <= capacity for p in result.series)
    assert all(0 <= p.used_milli <= capacity for p in result.series)
    for r in result.jobs:
        assert r.state in (JobState.DONE, JobState.PENDING), (r.spec.id, r.state)
        if r.state is JobState.DONE:
            assert r.progress_s >= r.spec.runtime_s - 1e-6
            assert r.finish_s >= r.first_start_s >= r.spec.submit_time_s
        assert r.lost_work_s >= 0
        if r.preemptions:
            assert r.spec.preemptible
    figures = summarize(result)
    assert 0 <= figures["utilization"] <= figures["allocation"] + 1e-9 <= 1 + 1e-9
    again = simulate(nodes=CLUSTER, jobs=jobs, profile=get_profile("tessera-prod"), config=config)
    assert summarize(again) == {**figures, "cycle_wall_s": summarize(again)["cycle_wall_s"]}
