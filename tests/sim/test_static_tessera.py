"""Tessera's packing rules, each on a cluster small enough to reason about by hand."""

from __future__ import annotations

import random

import pytest

from scheduling.engine.fragmentation import TaskClass, workload_as_requests
from scheduling.engine.framework import CycleContext
from scheduling.engine.openb_profiles import openb_profile
from scheduling.engine.plugins.fgd import FgdScore
from scheduling.engine.plugins.tessera import TesseraScore, cpu_per_gpu_milli, model_pressure, stranded_milli
from scheduling.engine.types import Gpu, Job, Node, Request, Sharing, Snapshot


def node(name: str, model: str, gpus: int, cpu_milli: int, *, cpu_used: int = 0) -> Node:
    cards = tuple(Gpu(i, f"{name}-{i}", model, 16384, sharing=Sharing.MPS) for i in range(gpus))
    return Node(name, cpu_milli, 1 << 20, cards, allocated_cpu_milli=cpu_used)


def ctx_for(nodes, workload) -> CycleContext:
    snapshot = Snapshot(now=0.0, nodes=tuple(nodes), workload=workload_as_requests(workload))
    return CycleContext(snapshot=snapshot, profile=openb_profile("tessera"), rng=random.Random(0))


def test_the_typical_cpu_per_gpu_ratio_ignores_cpu_only_tasks():
    workload = (
        (TaskClass(8000, 1000, 1), 0.5),
        (TaskClass(2000, 500, 1), 0.25),
        (TaskClass(32000, 0, 0), 0.25),
    )
    # (0.5 * 8000 + 0.25 * 2000) / (0.5 * 1000 + 0.25 * 500) = 4500 / 625
    assert cpu_per_gpu_milli(workload) == pytest.approx(7.2)


def test_gpu_is_stranded_when_the_free_cpu_cannot_feed_it():
    assert stranded_milli(16000, 2000, 8.0) == 0.0  # 16 cores feed two cards at 8 cores a card
    assert stranded_milli(4000, 2000, 8.0) == pytest.approx(1500.0)  # 4 cores feed half a card


def test_a_cpu_heavy_pod_goes_where_it_strands_no_gpu():
    # A whole card with 12 cores: on the CPU-poor node it leaves 4 cores for the other card; the CPU-rich one is fine.
    poor = node("poor", "P100", 2, 16000)
    rich = node("rich", "T4", 2, 104000)
    workload = ((TaskClass(8000, 1000, 1), 1.0),)
    ctx = ctx_for((poor, rich), workload)
    job = Job("j", "t", Request(gpus=1, cpu_milli=12000))
    plugin = TesseraScore()
    assert plugin.score_node(ctx, job, rich) > plugin.score_node(ctx, job, poor)


def test_unrestricted_pods_leave_the_model_that_restricted_pods_need():
    workload = (
        (TaskClass(1000, 1000, 1), 0.9),
        (TaskClass(1000, 1000, 1, models=("T4",)), 0.1),
    )
    pressure = model_pressure(workload, {"T4": 2, "G2": 8})
    # T4 holds a fifth of the cards but is the only home of a tenth of the demand: pressure 0.1 / 0.2.
    assert pressure == {"T4": pytest.approx(0.5)}
    t4, g2 = node("t4", "T4", 2, 64000), node("g2", "G2", 8, 256000)
    ctx = ctx_for((t4, g2), workload)
    plugin = TesseraScore()
    free_choice = Job("a", "t", Request(gpus=1, cpu_milli=1000))
    assert plugin.score_node(ctx, free_choice, g2) > plugin.score_node(ctx, free_choice, t4)
    restricted = Job("b", "t", Request(gpus=1, cpu_milli=1000, gpu_models=("T4",)))
    # A pod that may only use T4 is not pushed away from it: only the FGD score and the CPU term count.
    assert plugin.score_node(ctx, restricted, t4) == pytest.approx(
        FgdScore().score_node(ctx, restricted, t4) + 0.9
    )


def test_the_fgd_score_still_comes_first():
    # A slice that exactly fills a used card beats any tie-break on an idle node.
    used = Node(
        "used",
        16000,
        1 << 20,
        (
            Gpu(0, "u0", "P100", 16384, sharing=Sharing.MPS, allocated_compute_milli=500, holders=1),
            Gpu(1, "u1", "P100", 16384, sharing=Sharing.MPS, allocated_compute_milli=1000, holders=1),
        ),
        allocated_cpu_milli=15000,
    )
    idle = node("idle", "T4", 2, 104000)
    workload = ((TaskClass(1000, 500, 1), 0.5), (TaskClass(1000, 1000, 1), 0.5))
    ctx = ctx_for((used, idle), workload)
    job = Job("j", "t", Request(gpu_compute_milli=500, cpu_milli=1000))
    plugin = TesseraScore()
    assert plugin.score_node(ctx, job, used) > plugin.score_node(ctx, job, idle)


def test_cpu_balance_counts_stranding_in_quarter_cards():
    from scheduling.engine.plugins.tessera import cpu_balance

    poor = node("poor", "P100", 2, 16000)
    # 8.8 cores with one card leave 7.2 cores for the other: 100 milli stranded, under a quarter card: no penalty.
    assert cpu_balance(Job("a", "t", Request(gpus=1, cpu_milli=8800)), poor, 8.0) == 1.0
    # 12 cores leave 4: half a card stranded, out of a node's worth (8 cards).
    assert cpu_balance(Job("b", "t", Request(gpus=1, cpu_milli=12000)), poor, 8.0) == pytest.approx(
        1 - 500 / 8000
    )
