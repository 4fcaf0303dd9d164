"""The simulator's guarantee and fairness figures, each worked out by hand on a one- or two-node cluster."""

from __future__ import annotations

import pytest

from scheduling.engine import profiles
from scheduling.engine.actions import ACTIONS
from scheduling.engine.actions.preempt import LowerPriority, Preempt
from scheduling.engine.framework import DEFAULT_PARAMS, Profile
from scheduling.engine.profiles import get_profile
from scheduling.engine.types import Assignment, Decisions, Gpu, Node, Placement, Quota, Request
from scheduling.sim.cli_dynamic import _table
from scheduling.sim.des import SimConfig, simulate
from scheduling.sim.guarantees import jain_index, water_fill
from scheduling.sim.metrics import summarize
from scheduling.sim.workload import NodeFailure, SimJob
from tests.sim._firstfit import first_fit


def _node(name: str, gpus: int = 1) -> Node:
    return Node(name, 64_000, 1 << 20, gpus=tuple(Gpu(i, f"{name}-{i}", "A100", 40_960) for i in range(gpus)))


def _job(job_id: str, team: str, submit: float, runtime: float, **kw) -> SimJob:
    kw.setdefault("request", Request(gpus=1))
    return SimJob(id=job_id, team=team, submit_time_s=submit, runtime_s=runtime, **kw)


def _by_id(result):
    return {r.spec.id: r for r in result.jobs}


_ONE_GPU_EACH = {t: Quota(t, guaranteed_compute_milli=1000) for t in ("a", "b")}


def test_snapshot_jobs_carry_their_priority_class_and_checkpoint_interval():
    seen = {}

    def scheduler(snapshot, profile):
        for job in (*snapshot.pending, *snapshot.running):
            seen[job.id] = (job.priority_class, job.checkpoint_interval_s)
        return first_fit(snapshot, profile)

    jobs = [
        _job("a", "t", 0, 100, priority_class="batch", checkpoint_interval_s=600.0),
        _job("b", "t", 0, 100, priority_class="inference"),
    ]
    simulate(nodes=[_node("n0", 2)], jobs=jobs, profile={}, scheduler=scheduler, config=SimConfig())
    assert seen == {"a": ("batch", 600.0), "b": ("inference", None)}


# -- quota satisfaction and time to guarantee ---------------------------------------------------------------


def test_satisfaction_owes_a_team_only_the_waiting_work_that_fits_within_its_guarantee():
    """Team a (guarantee 2 GPUs) holds 1 card 0-100 s with a2 (1 GPU) and a3 (2 GPUs) waiting: a2 is owed
    (1 + 1 <= 2), a3 is not (1 + 1 + 2 > 2), so a is entitled to 2 and satisfied 1/2. From 100 s a2 runs and
    only a3 waits, which would take it beyond: entitled 1, held 1, satisfied. Over 200 s: (0.5 + 1) / 2."""
    jobs = [
        _job("b1", "b", 0, 100, priority=1),
        _job("a1", "a", 0, 100),
        _job("a2", "a", 0, 100),
        _job("a3", "a", 0, 100, request=Request(gpus=2)),
    ]
    result = simulate(
        nodes=[_node("n0", 2)],
        jobs=jobs,
        profile={},
        quotas={"a": Quota("a", guaranteed_compute_milli=2000)},
        scheduler=first_fit,
        config=SimConfig(horizon_s=200),
    )
    figures = summarize(result)
    assert figures["quota_satisfaction"] == {"a": 0.75}
    # One episode: a2 was owed from 0 s and ran at 100 s; a3 is never owed, so no episode is left open.
    ttg = figures["time_to_guarantee"]
    assert (ttg["episodes"], ttg["open_at_end"], ttg["max_s"]) == (1, 0, 100.0)
    assert ttg["by_team"] == {
        "a": {"episodes": 1, "open_at_end": 0, "p50_s": 100.0, "p95_s": 100.0, "max_s": 100.0}
    }


def test_time_to_guarantee_is_the_grace_of_the_borrowed_job_it_reclaims():
    """b borrows the second card of a 2-card node from 0 s. a1 (within a's guarantee) arrives at 290 s, on a
    cycle's tick: that cycle reclaims b2 (30 s grace; the 300 s minimum runtime protects nothing from reclaim) and
    a1 waits for it (placed, not yet running: still waiting) until 320 s: the victim's grace."""
    jobs = [_job("b1", "b", 0, 10_000), _job("b2", "b", 0, 10_000), _job("a1", "a", 290, 100)]
    result = simulate(
        nodes=[_node("n0", 2)],
        jobs=jobs,
        profile=get_profile("tessera-prod"),
        quotas=_ONE_GPU_EACH,
        config=SimConfig(horizon_s=600, idle_recheck_s=10),
    )
    figures = summarize(result)
    assert _by_id(result)["a1"].first_start_s == 320
    assert figures["time_to_guarantee"]["by_team"] == {
        "a": {"episodes": 1, "open_at_end": 0, "p50_s": 30.0, "p95_s": 30.0, "max_s": 30.0}
    }
    # b2 was b's borrowed job: reclaiming it takes nothing within b's guarantee.
    assert figures["evictions_cross_team"] == 1
    assert figures["within_guarantee_evictions_by_other_teams"] == 0
    # a wanted from 290 s to 420 s (a1 ran 320-420) and held its due for 100 of those 130 s; b always held its
    # guarantee (b2 requeued at 320 s would only borrow).
    assert figures["quota_satisfaction"] == {"a": round(100 / 130, 4), "b": 1.0}


class _AnyTeamLowerPriority(LowerPriority):
    """What Tessera's preempt no longer does: priority across teams, whatever their guarantees."""

    def victims(self, s, job):
        priority, evicted = job.priority, s.evicted
        return lambda held: [v for v in held if v.job.priority < priority and v.job.id not in evicted]


class _PreemptAnyTeam(Preempt):
    NAME = "preempt-any-team"
    VICTIMS = _AnyTeamLowerPriority()


def test_it_counts_an_eviction_of_work_within_its_teams_guarantee_for_another_team(monkeypatch):
    """A profile that preempts by priority across teams: a1 (priority 10) evicts b1, b's only job and within
    b's guarantee; later a2 (priority 20) evicts a1, a within-team eviction."""
    monkeypatch.setitem(ACTIONS, _PreemptAnyTeam.NAME, _PreemptAnyTeam)
    monkeypatch.setattr(profiles, "KNOWN_ACTIONS", frozenset(ACTIONS))
    profile = Profile(
        name="allocate-preempt", actions=("allocate", "preempt-any-team"), params=DEFAULT_PARAMS
    )
    jobs = [
        _job("b1", "b", 0, 10_000),
        _job("a1", "a", 400, 10_000, priority=10),
        _job("a2", "a", 900, 100, priority=20),
    ]
    result = simulate(
        nodes=[_node("n0", 1)],
        jobs=jobs,
        profile=profile,
        quotas=_ONE_GPU_EACH,
        config=SimConfig(horizon_s=1000),
    )
    figures = summarize(result)
    assert [_by_id(result)[j].preemptions for j in ("b1", "a1")] == [1, 1]
    assert figures["within_guarantee_evictions_by_other_teams"] == 1
    assert figures["within_guarantee_evictions_by_team"] == {"b": 1}
    assert (figures["evictions_cross_team"], figures["evictions_within_team"]) == (1, 1)


# -- priority inversions ------------------------------------------------------------------------------------


def _greedy(snapshot, profile):
    """Whole cards, highest priority first, and a job that does not fit is skipped (no strict FIFO): later,
    lower-priority jobs may start ahead of a blocked one. Only for these tests."""
    free = {n.name: [g.index for g in n.gpus if g.holders == 0] for n in snapshot.nodes if n.schedulable}
    placements = []
    for job in sorted(snapshot.pending, key=lambda j: (-j.priority, j.submit_time, j.id)):
        for node, idle in free.items():
            if len(idle) >= job.request.gpus:
                taken, free[node] = idle[: job.request.gpus], idle[job.request.gpus :]
                placements.append(Placement(job.id, tuple(Assignment(node, i, 40_960, 1000) for i in taken)))
                break
    return Decisions(placements=tuple(placements))


def test_a_start_ahead_of_an_earlier_higher_priority_job_is_an_inversion_unless_it_is_a_backfill():
    """j (2 cards, priority 10) waits from 5 s on a 2-card node while x holds one card until 100 s.
    k1 starts at 10 s declaring 50 s, done before j can start: a backfill. k2 starts at 70 s declaring nothing:
    an inversion. k3 starts at 110 s declaring 300 s (it needs 100), past j's start at 270 s (when k2 ends):
    an inversion. o, of another team, starts at 210 s ahead of j: none of team t's business."""
    jobs = [
        _job("x", "t", 0, 100),
        _job("j", "t", 5, 100, priority=10, request=Request(gpus=2)),
        _job("k1", "t", 10, 50, max_runtime_s=50),
        _job("k2", "t", 70, 200),
        _job("k3", "t", 105, 100, max_runtime_s=300),
        _job("o", "u", 200, 10),
    ]
    result = simulate(
        nodes=[_node("n0", 2)], jobs=jobs, profile={}, scheduler=_greedy, config=SimConfig(horizon_s=600)
    )
    starts = {k: _by_id(result)[k].first_start_s for k in ("x", "k1", "k2", "k3", "o", "j")}
    assert starts == {"x": 0, "k1": 10, "k2": 70, "k3": 110, "o": 210, "j": 270}
    figures = summarize(result)
    assert figures["priority_inversions"] == 2
    assert figures["priority_inversions_by_team"] == {"t": 2}


def test_a_backfill_whose_declared_end_lies_beyond_the_window_is_an_inversion_when_the_job_never_starts():
    """j asks for 3 cards of a 2-card node and never starts. k1 declares it ends at 60 s, inside the 200 s
    window: a backfill. k2 declares it ends at 370 s, past the end of the window: an inversion."""
    jobs = [
        _job("j", "t", 0, 100, priority=10, request=Request(gpus=3)),
        _job("k1", "t", 5, 50, max_runtime_s=50),
        _job("k2", "t", 65, 100, max_runtime_s=300),
    ]
    result = simulate(
        nodes=[_node("n0", 2)], jobs=jobs, profile={}, scheduler=_greedy, config=SimConfig(horizon_s=200)
    )
    assert [_by_id(result)[k].first_start_s for k in ("k1", "k2", "j")] == [10, 70, None]
    assert summarize(result)["priority_inversions"] == 1


# -- borrowed shares and Jain's index -----------------------------------------------------------------------


def test_water_filling_splits_by_weight_and_passes_on_what_a_capped_team_cannot_take():
    weights = {"a": 2.0, "b": 1.0}
    assert water_fill(900, {"a": 1000, "b": 1000}, weights) == {"a": 600, "b": 300}
    assert water_fill(900, {"a": 400, "b": 1000}, weights) == {"a": 400, "b": 500}
    assert water_fill(900, {"a": 100, "b": 200}, weights) == {"a": 100, "b": 200}


def test_jain_index_is_one_for_equal_shares_and_one_over_n_when_one_team_has_everything():
    assert jain_index([0.8, 0.8, 0.8]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)
    assert jain_index([1.5, 0.75]) == pytest.approx(0.9)
    assert jain_index([]) is None


def test_borrowed_capacity_split_2_to_1_and_jain_over_the_fair_shares():
    """Teams a (weight 2) and b (weight 1) guarantee nothing, so all they hold is borrowed. 0-100 s a holds all
    3 cards while b waits for 3: the ideal split of the 3 borrowed cards is 2:1, a is 1 over and b 1 under,
    error (1 + 1) / (2 * 3) = 1/3. 100-200 s only b borrows or waits: error 0. Average 1/6.
    Fair shares of the 3 cards: 0-100 s a 2, b 1; 100-200 s b 3. Held: a 3 x 100, b 3 x 100 card-seconds, so
    a holds 300/200 = 1.5 of its fair share and b 300/400 = 0.75: Jain (2.25)^2 / (2 (1.5^2 + 0.75^2)) = 0.9."""
    quotas = {"a": Quota("a", weight=2.0), "b": Quota("b", weight=1.0)}
    jobs = [_job(f"{t}{i}", t, 0, 100) for t in ("a", "b") for i in range(3)]
    result = simulate(
        nodes=[_node("n0", 3)],
        jobs=jobs,
        profile={},
        quotas=quotas,
        scheduler=first_fit,
        config=SimConfig(horizon_s=200),
    )
    assert [_by_id(result)[f"b{i}"].first_start_s for i in range(3)] == [100, 100, 100]
    figures = summarize(result)
    assert figures["borrowed_share_error"] == round(1 / 6, 4)
    assert figures["fair_share_ratio"] == {"a": 1.5, "b": 0.75}
    assert figures["jain_index"] == 0.9
    # Neither team has a guarantee: no satisfaction to report, no episodes.
    assert figures["quota_satisfaction"] == {"a": None, "b": None}
    assert figures["time_to_guarantee"]["episodes"] == 0


def test_jain_index_is_one_when_teams_of_equal_weight_get_equal_shares():
    jobs = [_job("a1", "a", 0, 100), _job("b1", "b", 0, 100)]
    result = simulate(
        nodes=[_node("n0", 2)], jobs=jobs, profile={}, scheduler=first_fit, config=SimConfig(horizon_s=100)
    )
    figures = summarize(result)
    assert figures["fair_share_ratio"] == {"a": 1.0, "b": 1.0}
    assert figures["jain_index"] == 1.0
    assert figures["borrowed_share_error"] == 0.0


# -- lost GPU-hours -----------------------------------------------------------------------------------------


def test_lost_gpu_hours_split_between_preemption_and_failure_as_a_share_of_what_was_delivered():
    """One card. low (checkpoint every 60 s) is evicted at 130 s and gone at 160 s: 160 s of work, 120 kept,
    40 card-seconds lost. high runs 160-260 s; low resumes at 260 s from 120 s of work and its node fails at
    530 s: 390 s of work, 360 kept, 30 lost. The node is back at 630 s and low runs to the 700 s horizon.
    Delivered: 160 + 100 + 270 + 70 = 600 card-seconds; lost 70, 11.67 % of it."""
    jobs = [
        _job("low", "t", 0, 1000, checkpoint_interval_s=60, grace_s=30),
        _job("high", "t", 125, 100, priority=10),
    ]
    result = simulate(
        nodes=[_node("n0")],
        jobs=jobs,
        profile={"preempt": True},
        scheduler=first_fit,
        failures=[NodeFailure("n0", 530, 100)],
        config=SimConfig(horizon_s=700),
    )
    figures = summarize(result)
    assert figures["lost_gpu_h"] == round(70 / 3600, 4)
    assert figures["lost_gpu_h_preemption"] == round(40 / 3600, 4)
    assert figures["lost_gpu_h_failure"] == round(30 / 3600, 4)
    assert figures["delivered_gpu_h"] == round(600 / 3600, 4)
    assert figures["lost_pct_of_delivered"] == round(100 * 70 / 600, 4)


# -- the scenario table -------------------------------------------------------------------------------------


def test_the_scenario_table_prints_the_guarantee_figures_of_each_policy():
    """The figures of the 2:1 borrowing run above, as `tessera simulate scenario` prints them."""
    quotas = {"a": Quota("a", weight=2.0), "b": Quota("b", weight=1.0)}
    jobs = [_job(f"{t}{i}", t, 0, 100) for t in ("a", "b") for i in range(3)]
    result = simulate(
        nodes=[_node("n0", 3)],
        jobs=jobs,
        profile={},
        quotas=quotas,
        scheduler=first_fit,
        config=SimConfig(horizon_s=200),
    )
    summary = {"scenario": "tiny", "gpus": 3, "nodes": 1, "policies": {"fifo": summarize(result)}}
    lines = _table(summary).splitlines()
    head = lines.index(next(line for line in lines if line.startswith("guarantees")))
    assert lines[head + 1].split() == [
        "fifo", "-", "0", "-", "-", "-", "0", "0", "0", "0", "16.7%", "0.900", "0.00/0.00", "0.00",
    ]  # fmt: skip
