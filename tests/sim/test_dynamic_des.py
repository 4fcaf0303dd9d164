"""The discrete-event simulator's clock, ordering, preemption and failure handling, with a test-only scheduler."""

from __future__ import annotations

import pytest

from scheduling.engine.types import Assignment, Decisions, Eviction, Gpu, Node, Placement, Request
from scheduling.sim.des import JobState, SimConfig, SimulationError, simulate
from scheduling.sim.metrics import summarize
from scheduling.sim.workload import NodeFailure, SimJob
from tests.sim._firstfit import first_fit


def _node(name: str, gpus: int = 1) -> Node:
    return Node(name, 64_000, 1 << 20, gpus=tuple(Gpu(i, f"{name}-{i}", "A100", 40_960) for i in range(gpus)))


def _job(job_id: str, submit: float, runtime: float, **kw) -> SimJob:
    kw.setdefault("request", Request(gpus=1))
    return SimJob(id=job_id, team=kw.pop("team", "t"), submit_time_s=submit, runtime_s=runtime, **kw)


def _by_id(result):
    return {r.spec.id: r for r in result.jobs}


def test_it_starts_arrivals_at_the_next_cycle_on_the_cadence_grid():
    result = simulate(
        nodes=[_node("n0")],
        jobs=[_job("a", 3, 50)],
        profile={},
        scheduler=first_fit,
        config=SimConfig(cycle_interval_s=10),
    )
    a = _by_id(result)["a"]
    assert (a.first_start_s, a.finish_s, a.state) == (10, 60, JobState.DONE)
    assert a.wait_s == 7


def test_it_frees_a_card_before_the_cycle_that_runs_at_the_same_instant():
    jobs = [_job("a", 0, 100), _job("b", 5, 50), _job("c", 7, 10)]
    result = simulate(
        nodes=[_node("n0")], jobs=jobs, profile={}, scheduler=first_fit, config=SimConfig(cycle_interval_s=10)
    )
    r = _by_id(result)
    # b was first in line and starts the moment a completes; c follows b.
    assert [(r[k].first_start_s, r[k].finish_s) for k in "abc"] == [(0, 100), (100, 150), (150, 160)]


def test_it_runs_no_cycle_while_nothing_waits():
    result = simulate(
        nodes=[_node("n0")],
        jobs=[_job("a", 0, 10_000)],
        profile={},
        scheduler=first_fit,
        config=SimConfig(cycle_interval_s=1),
    )
    assert result.cycles == 1


def test_it_requeues_a_preempted_job_with_its_submit_time_and_loses_work_since_its_checkpoint():
    seen_submit = []

    def scheduler(snapshot, profile):
        seen_submit.extend(j.submit_time for j in snapshot.pending if j.id == "low")
        return first_fit(snapshot, {"preempt": True})

    jobs = [
        _job("low", 0, 1000, priority=0, checkpoint_interval_s=60, grace_s=30),
        _job("high", 125, 100, priority=10),
    ]
    result = simulate(
        nodes=[_node("n0")], jobs=jobs, profile={}, scheduler=scheduler, config=SimConfig(cycle_interval_s=10)
    )
    r = _by_id(result)
    # Evicted at the 130 s cycle, gone after its 30 s grace at 160 s: 160 s of work, checkpoints at 60 and 120.
    assert r["low"].preemptions == 1
    assert r["low"].lost_work_s == pytest.approx(40)
    assert r["high"].first_start_s == 160
    # Requeued keeping its place by submit time; it resumes from its checkpoint when the card is free again.
    assert seen_submit and set(seen_submit) == {0}
    assert r["low"].first_start_s == 0
    assert r["low"].finish_s == pytest.approx(260 + (1000 - 120))
    assert summarize(result)["preemptions"] == 1


def test_it_loses_all_progress_of_a_job_that_never_checkpoints():
    jobs = [_job("low", 0, 1000, priority=0, grace_s=0), _job("high", 200, 10, priority=10)]
    result = simulate(
        nodes=[_node("n0")],
        jobs=jobs,
        profile={"preempt": True},
        scheduler=first_fit,
        config=SimConfig(cycle_interval_s=10),
    )
    low = _by_id(result)["low"]
    assert low.lost_work_s == pytest.approx(200)
    assert low.finish_s == pytest.approx(210 + 1000)


def test_it_holds_a_preemptors_cards_until_its_victims_grace_ends():
    """The engine evicts and places the preemptor in one cycle; the card is handed over only after the grace."""

    def evict_and_place(snapshot, profile):
        high = [j for j in snapshot.pending if j.id == "high"]
        low = [j for j in snapshot.running if j.id == "low"]
        if high and low:
            a = low[0].assignments[0]
            return Decisions(
                placements=(Placement("high", (Assignment(a.node, a.gpu_index, 40_960, 1000),)),),
                evictions=(Eviction("low", "high", "preempted", 45.0),),
            )
        return first_fit(snapshot, profile)

    jobs = [
        _job("low", 0, 1000, priority=0, checkpoint_interval_s=100, grace_s=45),
        _job("high", 300, 100, priority=10),
    ]
    result = simulate(
        nodes=[_node("n0")],
        jobs=jobs,
        profile={},
        scheduler=evict_and_place,
        config=SimConfig(cycle_interval_s=10),
    )
    r = _by_id(result)
    assert r["high"].first_start_s == 345
    assert r["low"].lost_work_s == pytest.approx(45)  # ran to 345, checkpointed at 300
    # While low used its grace, the card counted as allocated once, never twice.
    assert max(p.allocated_milli for p in result.series) == 1000


def test_it_refuses_a_placement_on_a_card_that_is_already_full():
    def double_book(snapshot, profile):
        return Decisions(
            placements=tuple(Placement(j.id, (Assignment("n0", 0, 40_960, 1000),)) for j in snapshot.pending)
        )

    with pytest.raises(SimulationError, match="over capacity"):
        simulate(
            nodes=[_node("n0")], jobs=[_job("a", 0, 10), _job("b", 0, 10)], profile={}, scheduler=double_book
        )


def test_it_requeues_the_jobs_of_a_failed_node_and_restarts_them_elsewhere():
    jobs = [_job("a", 0, 1000, checkpoint_interval_s=100)]
    result = simulate(
        nodes=[_node("n0"), _node("n1")],
        jobs=jobs,
        profile={},
        scheduler=first_fit,
        config=SimConfig(cycle_interval_s=10),
        failures=[NodeFailure("n0", 250)],
    )
    a = _by_id(result)["a"]
    assert a.failures == 1 and a.preemptions == 0
    assert a.lost_work_s == pytest.approx(50)
    assert a.finish_s == pytest.approx(250 + 800)
    assert summarize(result)["failure_requeues"] == 1
    assert result.node_failures == 1


def test_it_brings_a_repaired_node_back():
    jobs = [_job("a", 0, 100), _job("b", 300, 100)]
    result = simulate(
        nodes=[_node("n0")],
        jobs=jobs,
        profile={},
        scheduler=first_fit,
        config=SimConfig(cycle_interval_s=10),
        failures=[NodeFailure("n0", 50, repair_s=500)],
    )
    r = _by_id(result)
    assert r["a"].failures == 1
    # Nothing can run until the node is back at 550 s; a (submitted first) goes first.
    assert r["a"].finish_s == pytest.approx(650) and r["b"].first_start_s == pytest.approx(650)


def test_it_counts_allocation_and_real_use_separately():
    """A light server on a whole card: the card is fully allocated but only a tenth used."""
    jobs = [_job("srv", 0, 1000, usage_milli=100)]
    result = simulate(
        nodes=[_node("n0", gpus=2)],
        jobs=jobs,
        profile={},
        scheduler=first_fit,
        config=SimConfig(cycle_interval_s=10, horizon_s=1000),
    )
    figures = summarize(result)
    assert figures["allocation"] == pytest.approx(0.5)
    assert figures["utilization"] == pytest.approx(0.05)


def test_it_stops_at_the_horizon_and_counts_unstarted_jobs():
    jobs = [_job("a", 0, 5000), _job("b", 10, 10)]
    result = simulate(
        nodes=[_node("n0")],
        jobs=jobs,
        profile={},
        scheduler=first_fit,
        config=SimConfig(cycle_interval_s=10, horizon_s=1000),
    )
    figures = summarize(result)
    assert result.end_s == 1000
    assert figures["wait"]["never_started"] == 1
    assert figures["allocation"] == pytest.approx(1.0)


def test_it_draws_random_node_failures_from_the_seed():
    cfg = SimConfig(cycle_interval_s=10, horizon_s=20_000, node_mtbf_s=5_000, node_repair_s=100, seed=3)
    runs = [
        simulate(
            nodes=[_node("n0"), _node("n1")],
            jobs=[_job("a", 0, 15_000, checkpoint_interval_s=600)],
            profile={},
            scheduler=first_fit,
            config=cfg,
        )
        for _ in range(2)
    ]
    assert runs[0].node_failures > 0
    assert runs[0].node_failures == runs[1].node_failures
    assert _by_id(runs[0])["a"].lost_work_s == _by_id(runs[1])["a"].lost_work_s


def test_a_node_failure_voids_a_placement_that_waits_on_its_victims():
    def evict_and_place(snapshot, profile):
        high = [j for j in snapshot.pending if j.id == "high"]
        low = [j for j in snapshot.running if j.id == "low"]
        if high and low:
            a = low[0].assignments[0]
            return Decisions(
                placements=(Placement("high", (Assignment(a.node, a.gpu_index, 40_960, 1000),)),),
                evictions=(Eviction("low", "high", "preempted", 45.0),),
            )
        return first_fit(snapshot, profile)

    jobs = [
        _job("low", 0, 5000, priority=0, grace_s=45),
        _job("filler", 1, 1000, priority=5),
        _job("high", 300, 100, priority=10),
    ]
    result = simulate(
        nodes=[_node("n0"), _node("n1")],
        jobs=jobs,
        profile={},
        scheduler=evict_and_place,
        config=SimConfig(cycle_interval_s=10),
        failures=[NodeFailure("n0", 320)],
    )
    r = _by_id(result)
    assert r["low"].failures == 1
    # high never ran on the failed node: it went back to the queue and took n1 when filler finished.
    assert r["high"].first_start_s == 1010
    assert {a.node for a in r["high"].assignments} == {"n1"}
