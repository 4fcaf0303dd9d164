"""The static replay follows the published protocol, checked on tiny clusters through the production engine."""

from __future__ import annotations

import random

import pytest

from scheduling.engine.fragmentation import TaskClass, fragmentation_milli, typical_workload
from scheduling.engine.framework import CycleContext
from scheduling.engine.openb_profiles import openb_profile
from scheduling.engine.plugins.bestfit import BestFitScore
from scheduling.engine.plugins.fgd import FgdScore
from scheduling.engine.types import Gpu, Job, Node, Request, Sharing, Snapshot
from scheduling.sim.openb import TraceNode, TracePod
from scheduling.sim.static import inflated_workload, run_static, run_static_seed


def pod(name: str, *, cpu: int = 1000, num_gpu: int = 1, gpu_milli: int = 1000, spec: tuple = ()) -> TracePod:
    return TracePod(
        name=name, cpu_milli=cpu, memory_mib=1024, num_gpu=num_gpu, gpu_milli=gpu_milli, gpu_spec=spec
    )


def nodes(count: int, gpus: int = 1, *, cpu: int = 64000, model: str = "T4") -> list[TraceNode]:
    return [TraceNode(f"n{i}", cpu, 262144, gpus, model) for i in range(count)]


def test_ties_go_to_the_first_node_in_the_runs_fixed_order_and_each_pod_gets_one_attempt():
    result = run_static_seed(nodes(4), [pod("p")], profile=openb_profile("bestfit"), seed=7)
    # 1.3 x 4 GPUs asks for 6 one-GPU pods: the four idle nodes fill in the run's order, then two fail for good.
    assert [node for _, node, _ in result.outcomes] == [*result.node_order, None, None]
    assert (result.pods, result.placed, result.failed) == (6, 4, 2)


def test_the_node_order_is_drawn_per_seed():
    orders = {
        run_static_seed(nodes(6), [pod("p")], profile=openb_profile("fgd"), seed=seed).node_order
        for seed in range(42, 48)
    }
    assert len(orders) > 1


def test_a_slice_goes_to_the_tightest_gpu_that_fits_ties_to_the_lowest_index():
    result = run_static_seed(
        nodes(1, gpus=2), [pod("s", gpu_milli=400)], profile=openb_profile("bestfit"), seed=1
    )
    # 400-milli slices on two cards: card 0 twice (1000 -> 600 -> 200), then card 1 twice; the rest do not fit.
    assert [gpus for _, _, gpus in result.outcomes] == [(0,), (0,), (1,), (1,), (), (), ()]


def test_whole_gpu_pods_take_the_lowest_free_indexes():
    result = run_static_seed(
        nodes(1, gpus=4),
        [pod("s", gpu_milli=300), pod("w", num_gpu=2)],
        profile=openb_profile("bestfit"),
        seed=3,
    )
    taken = dict((name, gpus) for name, _, gpus in result.outcomes[:2])
    if result.outcomes[0][0] == "s":
        assert taken == {"s": (0,), "w": (1, 2)}
    else:
        assert taken == {"w": (0, 1), "s": (2,)}


def test_allocation_is_counted_against_arrival_including_failed_pods():
    result = run_static_seed(
        nodes(1, gpus=2), [pod("s", gpu_milli=400)], profile=openb_profile("bestfit"), seed=1
    )
    # Each arrival asks 20% of the capacity; four fit (80%), the others fail but still count as arrived.
    assert result.alloc_curve == {20: 20.0, 40: 40.0, 60: 60.0, 80: 80.0, 100: 80.0, 120: 80.0, 140: 80.0}
    assert result.unallocated_pct_at_100 == pytest.approx(20.0)


def test_the_workload_is_every_pod_once_then_draws_until_1_3_x_capacity():
    pods = [pod("a", gpu_milli=500), pod("b", num_gpu=2), pod("c", num_gpu=0, gpu_milli=0)]
    order = inflated_workload(pods, 10_000, random.Random(5))
    assert sorted(p.name for p in order[:3]) == ["a", "b", "c"]
    requested = [sum(p.gpu_milli_total for p in order[: i + 1]) for i in range(len(order))]
    assert requested[-1] >= 13_000 > requested[-2]


def test_fragmentation_matches_a_hand_computed_node():
    cpu_only = TaskClass(cpu_milli=2000, gpu_milli=0, num_gpu=0)
    half = TaskClass(cpu_milli=4000, gpu_milli=500, num_gpu=1)
    two_whole = TaskClass(cpu_milli=4000, gpu_milli=1000, num_gpu=2)
    workload = ((cpu_only, 0.5), (half, 0.25), (two_whole, 0.25))
    # Free: one whole card and 300 milli. CPU-only counts all 1300; the half slice strands the 300 card;
    # two whole cards do not fit, so all 1300 count: 0.5 * 1300 + 0.25 * 300 + 0.25 * 1300 = 1050.
    assert fragmentation_milli(10_000, (1000, 300), "T4", workload) == pytest.approx(1050.0)
    # Without CPU for the slice class, it strands everything too.
    assert fragmentation_milli(3_000, (1000, 300), "T4", workload) == pytest.approx(1300.0)
    # A class restricted to another model cannot use the node at all.
    other = ((TaskClass(cpu_milli=0, gpu_milli=500, num_gpu=1, models=("A10",)), 1.0),)
    assert fragmentation_milli(10_000, (1000, 300), "T4", other) == pytest.approx(1300.0)


def test_the_typical_workload_covers_95_percent_including_the_crossing_class():
    a, b, c, d = (TaskClass(1000 * i, 0, 0) for i in range(1, 5))
    classes = [a] * 12 + [b] * 6 + [c] * 1 + [d] * 1
    workload = typical_workload(classes)
    assert [cls for cls, _ in workload] == [a, b, c]  # 60%, 90%, then 95% is reached with c
    assert [share for _, share in workload] == pytest.approx([12 / 19, 6 / 19, 1 / 19])


def _ctx(node: Node, workload=()) -> CycleContext:
    snapshot = Snapshot(now=0.0, nodes=(node,), workload=workload)
    return CycleContext(snapshot=snapshot, profile=openb_profile("fgd"), rng=random.Random(0))


def test_bestfit_scores_are_the_references_integers():
    gpus = tuple(Gpu(i, f"g{i}", "G2", 16384, sharing=Sharing.MPS) for i in range(8))
    node = Node("n", 96000, 786432, gpus, allocated_cpu_milli=32000)
    job = Job("j", "t", Request(gpus=1, cpu_milli=8000))
    # int(100 * (1 - 0.5 * (64000 - 8000) / 128000 - 0.5 * (8000 - 1000) / 8000)) = int(34.375)
    assert BestFitScore().score_node(_ctx(node), job, node) == 34.0


def test_fgd_prefers_the_gpu_that_leaves_no_stranded_share():
    from scheduling.engine.fragmentation import workload_as_requests

    half = TaskClass(cpu_milli=0, gpu_milli=500, num_gpu=1)
    gpus = (
        Gpu(0, "g0", "T4", 16384, sharing=Sharing.MPS, allocated_compute_milli=300, holders=1),
        Gpu(1, "g1", "T4", 16384, sharing=Sharing.MPS, allocated_compute_milli=500, holders=1),
    )
    node = Node("n", 64000, 262144, gpus)
    ctx = _ctx(node, workload_as_requests(((half, 1.0),)))
    job = Job("j", "t", Request(gpu_compute_milli=500))
    plugin = FgdScore()
    # On card 1 the slice fills it exactly (no change); on card 0 it leaves 200 that no 500 slice can use.
    assert plugin.score_gpu(ctx, job, node, gpus[1]) > plugin.score_gpu(ctx, job, node, gpus[0])
    assert plugin.score_node(ctx, job, node) == 50.0


def test_seeds_give_mean_and_standard_deviation():
    report = run_static(
        nodes(3, gpus=2), [pod("s", gpu_milli=700), pod("w")], profile=openb_profile("fgd"), seeds=[1, 2, 3]
    )
    values = [seed.unallocated_pct_at_100 for seed in report.seeds]
    assert report.unallocated_pct_at_100 == pytest.approx(sum(values) / 3)
    assert report.as_dict()["per_seed"][0]["seed"] == 1
    assert set(report.as_dict()) >= {
        "unallocated_pct_at_100",
        "unallocated_pct_at_100_sd",
        "frag_pct_at_90",
        "alloc_curve",
        "runtime_s",
    }
