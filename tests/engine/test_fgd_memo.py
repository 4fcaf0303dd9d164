"""FGD's answers are kept across cycles (a simulator asks the same questions thousands of times). They must be kept
by what was asked, never by an object's identity, which Python hands out again once the object is freed."""

from __future__ import annotations

import random

from scheduling.engine.framework import CycleContext
from scheduling.engine.plugins import fgd
from scheduling.engine.profiles import get_profile
from scheduling.engine.types import Request, Snapshot
from tests.engine.builders import job, node

NODE = node("n1", gpus=8, memory_gib=80, nvlink="all")
JOB = job("j1", gpus=1)


def _ctx(pairs: tuple) -> CycleContext:
    return CycleContext(
        snapshot=Snapshot(now=0.0, nodes=(NODE,), workload=pairs),
        profile=get_profile("tessera-prod"),
        rng=random.Random(0),
    )


def _fresh_scores(pairs: tuple) -> tuple[int, ...]:
    fgd._frag_memo.clear()
    fgd._score_memo.clear()
    fgd._workloads.clear()
    return fgd.fgd_scores(_ctx(pairs), JOB, NODE)


def _pairs(request: Request) -> tuple:
    return tuple([(request, 1.0)])  # built at run time: a new object each call


def test_workloads_made_and_freed_cycle_after_cycle_each_get_their_own_answers():
    # A snapshot's workload is a new object every cycle, freed with its snapshot; Python then gives its address to
    # a later object. Two workloads alternate here, as the typical workload shifts between cycles.
    whole_node = Request(gpus=8)  # one card taken leaves the node unusable for it
    slices = Request(gpu_memory_mib=10_240, gpu_compute_milli=250)  # one card taken leaves seven
    want = {whole_node: _fresh_scores(_pairs(whole_node)), slices: _fresh_scores(_pairs(slices))}
    assert want[whole_node] != want[slices]  # the two workloads do score this node differently
    key_of: dict[int, Request] = {}
    for i in range(300):
        request = (whole_node, slices)[i % 2]
        pairs = _pairs(request)
        key, _ = fgd.workload_of(_ctx(pairs))
        assert key_of.setdefault(key, request) == request, f"cycle {i}: a key given to another workload"
        assert fgd.fgd_scores(_ctx(pairs), JOB, NODE) == want[request], (
            f"cycle {i}: another workload's answer"
        )
        del pairs


def test_workloads_of_the_same_content_share_their_answers():
    request = Request(gpus=2)
    a, b = _pairs(request), _pairs(request)
    assert a is not b
    assert fgd.workload_of(_ctx(a))[0] == fgd.workload_of(_ctx(b))[0]
    assert fgd.workload_of(_ctx(a))[0] != fgd.workload_of(_ctx(_pairs(Request(gpus=1))))[0]
