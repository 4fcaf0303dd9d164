"""Declarative scenarios, one per engine feature: a cluster, teams, running and pending jobs, and what must happen."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import pytest

from scheduling.engine import run_cycle
from scheduling.engine.framework import Profile
from tests.engine.builders import (
    job,
    model_quota,
    node,
    profile,
    quota,
    running,
    snapshot,
    with_ledger,
)

NOW = 10_000.0


@dataclass
class Scenario:
    name: str
    nodes: list
    pending: list
    running: list = field(default_factory=list)  # (job, {node: [cards]}, start, borrowed)
    quotas: list = field(default_factory=list)
    usage: dict = field(default_factory=dict)
    profile: Profile | None = None
    # job -> node name, or {node: [card indexes]}; jobs listed here must be placed exactly so.
    placed: dict[str, Any] = field(default_factory=dict)
    # job -> (memory MiB, compute milli) of its single assignment.
    charged: dict[str, tuple[int, int]] = field(default_factory=dict)
    borrowed: dict[str, bool] = field(default_factory=dict)
    evicted: dict[str, str] = field(default_factory=dict)  # victim -> code; no other eviction may happen
    waiting: dict[str, str] = field(default_factory=dict)  # job -> expected pending reason code
    reason_has: dict[str, str] = field(default_factory=dict)  # job -> substring of its reason
    # job -> its reservation's estimated start; when given, no other job may hold a reservation (None: unchecked)
    reserved: dict[str, float | None] | None = None
    estimated: dict[str, float | None] = field(default_factory=dict)  # pending job -> its estimated start
    order: list[str] | None = None  # expected placement order (queue order)
    grace: dict[str, float] = field(default_factory=dict)


def run(sc: Scenario):
    run_jobs = [
        running(j, on, nodes=sc.nodes, start=start, borrowed=borrowed)
        for j, on, start, borrowed in sc.running
    ]
    snap = snapshot(
        sc.nodes, pending=sc.pending, running_jobs=run_jobs, quotas=sc.quotas, usage=sc.usage, now=NOW
    )
    return run_cycle(snap, sc.profile or profile("default"))


def R(j, on, start=0.0, borrowed=False):
    return (j, on, start, borrowed)


TOPO_ONLY = profile(fields={"node_scores": (("topology", 1.0),), "gpu_scores": (("topology", 1.0),)})
SPREAD = profile("spread")
BINPACK = profile("binpack")
NO_PREEMPT = profile(fields={"actions": ("admit", "allocate")})
SHARE = profile(fields={"actions": ("admit", "allocate", "backfill", "reclaim", "share", "preempt")})
TRAIN = "ai-lab/training"

SCENARIOS = [
    # 1. Requests ------------------------------------------------------------------------------------------
    Scenario(
        "whole GPUs take the lowest-index free cards of the first node",
        nodes=[node("a"), node("b")],
        pending=[job("j", gpus=3)],
        placed={"j": {"a": [0, 1, 2]}},
        profile=BINPACK,
    ),
    Scenario(
        "a gang lands on as many nodes as it asks for",
        nodes=[node("a"), node("b", gpus=4), node("c")],
        pending=[job("g", gpus=8, nodes=2)],
        placed={"g": {"a": list(range(8)), "c": list(range(8))}},
    ),
    Scenario(
        "a gang that cannot get all its nodes takes none",
        nodes=[node("a"), node("b", gpus=4)],
        pending=[job("g", gpus=8, nodes=2)],
        waiting={"g": "gang-incomplete"},
        reason_has={"g": "needs 2 nodes"},
    ),
    Scenario(
        "a memory slice holds its memory and the proportional compute share",
        nodes=[node("a", gpus=1, sharing="mps")],
        pending=[job("s", memory_gib=10)],
        charged={"s": (10 * 1024, 125)},
    ),
    Scenario(
        "a CPU-only job takes host resources and no card",
        nodes=[node("busy", cpu=8), node("roomy", cpu=64)],
        pending=[job("etl", cpu=32, host_memory_gib=64)],
        placed={"etl": "roomy"},
    ),
    Scenario(
        "a gang of NVLink jobs takes a whole island on each of its nodes",
        nodes=[node("a", nvlink=[4, 4]), node("b"), node("c", nvlink=[4, 4])],
        running=[R(job("r", gpus=2), {"b": [0, 4]})],
        pending=[job("g", gpus=4, nodes=2, topology="nvlink")],
        placed={"g": {"a": [0, 1, 2, 3], "c": [0, 1, 2, 3]}},
        profile=TOPO_ONLY,
    ),
    Scenario(
        "allowed models steer the job to the right card",
        nodes=[node("a", model="A100"), node("h", model="H100", cc=(9, 0))],
        pending=[job("j", gpus=1, models=["H100"])],
        placed={"j": "h"},
    ),
    Scenario(
        "no card of the allowed model is a clear reason",
        nodes=[node("a", model="A100")],
        pending=[job("j", gpus=1, models=["H100"])],
        waiting={"j": "no-matching-gpu"},
        reason_has={"j": "H100"},
    ),
    Scenario(
        "minimum GPU memory skips smaller cards",
        nodes=[node("small", memory_gib=40), node("big", memory_gib=80)],
        pending=[job("j", gpus=1, min_memory_gib=80)],
        placed={"j": "big"},
    ),
    Scenario(
        "minimum compute capability skips older cards",
        nodes=[node("v100", model="V100", cc=(7, 0)), node("h100", model="H100", cc=(9, 0))],
        pending=[job("j", gpus=1, min_cc=(8, 0))],
        placed={"j": "h100"},
    ),
    Scenario(
        "CPU and host memory must fit on the same node",
        nodes=[node("thin", cpu=8, host_memory_gib=64), node("fat")],
        pending=[job("j", gpus=1, cpu=16, host_memory_gib=128)],
        placed={"j": "fat"},
    ),
    Scenario(
        "a job needing more CPU than any node has says how much is free",
        nodes=[node("thin", cpu=8)],
        pending=[job("j", gpus=1, cpu=16)],
        waiting={"j": "insufficient-host"},
        reason_has={"j": "8 CPU cores"},
    ),
    Scenario(
        "a NUMA job takes cards of one NUMA node",
        nodes=[node("a", numa=4)],
        running=[R(job("r", gpus=2), {"a": [0, 1]})],
        pending=[job("j", gpus=4, topology="numa")],
        placed={"j": {"a": [4, 5, 6, 7]}},
        profile=NO_PREEMPT,
    ),
    Scenario(
        "an NVLink job takes a whole free island",
        nodes=[node("a", nvlink=[4, 4])],
        running=[R(job("r", gpus=1), {"a": [0]})],
        pending=[job("j", gpus=4, topology="nvlink")],
        placed={"j": {"a": [4, 5, 6, 7]}},
        profile=NO_PREEMPT,
    ),
    Scenario(
        "an NVLink job larger than any free island names the largest one",
        nodes=[node("a100-02", nvlink=[4, 4])],
        pending=[job("j", gpus=8, topology="nvlink")],
        waiting={"j": "no-nvlink-group"},
        reason_has={"j": "needs 8 NVLink-connected GPUs on one node; the largest free group is 4 on a100-02"},
    ),
    # 2. Sharing modes -------------------------------------------------------------------------------------
    Scenario(
        "exclusive cards take no slices",
        nodes=[node("a", gpus=2)],
        pending=[job("s", memory_gib=4)],
        waiting={"s": "no-slice"},
        reason_has={"s": "shares its GPUs"},
    ),
    Scenario(
        "MPS compute shares never exceed 100 percent",
        nodes=[node("a", gpus=1, sharing="mps")],
        pending=[job(f"s{i}", compute_pct=30, submit=i) for i in range(4)],
        placed={"s0": "a", "s1": "a", "s2": "a"},
        waiting={"s3": "no-slice"},
        profile=NO_PREEMPT,
    ),
    Scenario(
        "MPS memory never exceeds the card",
        nodes=[node("a", gpus=1, sharing="mps")],
        pending=[job(f"s{i}", memory_gib=30, compute_pct=10, submit=i) for i in range(3)],
        placed={"s0": "a", "s1": "a"},
        waiting={"s2": "no-slice"},
        reason_has={"s2": "largest free slice is 20 GiB"},
        profile=NO_PREEMPT,
    ),
    Scenario(
        "time-sliced cards oversubscribe compute up to the factor but never memory",
        nodes=[node("a", gpus=1, sharing="timeslice")],
        pending=[job(f"s{i}", memory_gib=10, compute_pct=80, submit=i) for i in range(3)],
        placed={"s0": "a", "s1": "a"},
        waiting={"s2": "no-slice"},
        profile=profile("default", timeslice_oversubscription=2.0, fields={"actions": ("allocate",)}),
    ),
    Scenario(
        "a MIG slice rounds up to the card's next profile size",
        nodes=[
            node(
                "h200",
                gpus=1,
                model="H200",
                memory_gib=140,
                sharing="mig",
                mig_profiles_gib=[16, 32.5, 69.75, 140],
            )
        ],
        pending=[job("small", memory_gib=10), job("mid", memory_gib=20, submit=1)],
        charged={"small": (16 * 1024, 115), "mid": (int(32.5 * 1024), 233)},
    ),
    Scenario(
        "a MIG slice larger than every profile explains the profile sizes",
        nodes=[
            node("h200", gpus=1, model="H200", memory_gib=140, sharing="mig", mig_profiles_gib=[16, 32.5])
        ],
        pending=[job("huge", memory_gib=40)],
        waiting={"huge": "no-slice"},
        reason_has={"huge": "MIG slices come only in the card's profile sizes"},
    ),
    Scenario(
        "cordoned, draining and lost nodes are never used",
        nodes=[node("c", state="cordoned"), node("d", state="draining"), node("l", state="lost")],
        pending=[job("j", gpus=1)],
        waiting={"j": "node-unavailable"},
    ),
    Scenario(
        "a failed card is never used",
        nodes=[node("a", gpus=2, failed=[0])],
        pending=[job("j", gpus=1), job("k", gpus=1, submit=1)],
        placed={"j": {"a": [1]}},
        waiting={"k": "insufficient-gpus"},
    ),
    # 3. Scoring -------------------------------------------------------------------------------------------
    Scenario(
        "binpack fills the busier node",
        nodes=[node("a"), node("b")],
        running=[R(job("r", gpus=4), {"b": [0, 1, 2, 3]})],
        pending=[job("j", gpus=1)],
        placed={"j": {"b": [4]}},
        profile=BINPACK,
    ),
    Scenario(
        "spread picks the emptier node",
        nodes=[node("a"), node("b")],
        running=[R(job("r", gpus=4), {"a": [0, 1, 2, 3]})],
        pending=[job("j", gpus=1)],
        placed={"j": {"b": [0]}},
        profile=SPREAD,
    ),
    Scenario(
        "binpack puts a slice on the fullest card that fits, ties to the lowest index",
        nodes=[node("a", gpus=4, sharing="mps")],
        running=[R(job("r1", compute_pct=20), {"a": [2]}), R(job("r2", compute_pct=50), {"a": [3]})],
        pending=[job("s", compute_pct=40)],
        placed={"s": {"a": [3]}},
        profile=BINPACK,
    ),
    Scenario(
        "topology prefers the node whose free island fits exactly",
        nodes=[node("a"), node("b", nvlink=[4, 4])],
        running=[R(job("r", gpus=4), {"b": [0, 1, 2, 3]})],
        pending=[job("j", gpus=4, topology="nvlink")],
        placed={"j": {"b": [4, 5, 6, 7]}},
        profile=TOPO_ONLY,
    ),
    Scenario(
        "topology takes the tightest island and keeps the big one whole",
        nodes=[node("a", nvlink=[4, 2, 2])],
        pending=[job("j", gpus=2, topology="nvlink")],
        placed={"j": {"a": [4, 5]}},
        profile=TOPO_ONLY,
    ),
    Scenario(
        "a single-card job does not break a whole island when a broken one has room",
        nodes=[node("a", nvlink=[4, 4])],
        running=[R(job("r", gpus=1), {"a": [4]})],
        pending=[job("j", gpus=1)],
        placed={"j": {"a": [5]}},
        profile=TOPO_ONLY,
    ),
    # 4. Queue order ----------------------------------------------------------------------------------------
    Scenario(
        "higher priority goes first even when submitted later",
        nodes=[node("a", gpus=1)],
        pending=[job("low", gpus=1, priority=1, submit=0), job("high", gpus=1, priority=9, submit=5)],
        placed={"high": "a"},
        waiting={"low": "insufficient-gpus"},
    ),
    Scenario(
        "among equal priorities the team below its fair share goes first",
        nodes=[node("a", gpus=1)],
        quotas=[quota("rich", guaranteed_gpus=4), quota("poor", guaranteed_gpus=4)],
        usage={"rich": 4_000 * 7 * 24 * 3600.0},
        pending=[job("r", team="rich", gpus=1, submit=0), job("p", team="poor", gpus=1, submit=5)],
        placed={"p": "a"},
    ),
    Scenario(
        "fair share interleaves two teams' backlogs",
        nodes=[node("a", gpus=4)],
        quotas=[quota("x", guaranteed_gpus=4), quota("y", guaranteed_gpus=4)],
        pending=[job(f"x{i}", team="x", gpus=1, submit=i) for i in range(4)]
        + [job(f"y{i}", team="y", gpus=1, submit=10 + i) for i in range(4)],
        placed={"x0": "a", "y0": "a", "x1": "a", "y1": "a"},
    ),
    Scenario(
        "among equals the earlier submission goes first",
        nodes=[node("a", gpus=1)],
        pending=[job("late", gpus=1, submit=50), job("early", gpus=1, submit=10)],
        placed={"early": "a"},
        reason_has={"late": "needs 1 free GPU"},
    ),
    Scenario(
        "waiting long enough lifts a job above a slightly higher priority",
        nodes=[node("a", gpus=1)],
        pending=[
            job("old", gpus=1, priority=1, submit=NOW - 3 * 3600),
            job("new", gpus=1, priority=2, submit=NOW),
        ],
        placed={"old": "a"},
    ),
    # 5. Quota admission --------------------------------------------------------------------------------------
    Scenario(
        "within its guarantee a team's work is not borrowed",
        nodes=[node("a")],
        quotas=[quota("t", guaranteed_gib=160, guaranteed_gpus=2)],
        pending=[job("j", gpus=2)],
        borrowed={"j": False},
    ),
    Scenario(
        "beyond its guarantee a team borrows, and the work is marked reclaimable",
        nodes=[node("a")],
        quotas=[quota("t", guaranteed_gib=80, guaranteed_gpus=1)],
        pending=[job("j", gpus=2)],
        borrowed={"j": True},
    ),
    Scenario(
        "a team never goes above its limit",
        nodes=[node("a")],
        quotas=[quota("t", guaranteed_gib=80, limit_gib=400, guaranteed_gpus=1, limit_gpus=3)],
        running=[R(job("r", team="t", gpus=2), {"a": [0, 1]})],
        pending=[job("j", gpus=2)],
        waiting={"j": "quota-limit"},
        reason_has={"j": "it holds 2 of 3 GPUs and this job needs 2 more"},
    ),
    Scenario(
        "a job larger than its team's limit is told it can never start, with no estimate",
        nodes=[node("a")],
        quotas=[quota("t", guaranteed_gib=80, limit_gib=160, guaranteed_gpus=1, limit_gpus=2)],
        pending=[job("j", gpus=3)],
        waiting={"j": "quota-never"},
        reason_has={"j": "needs 3 GPUs but team t may hold at most 2 GPUs (its limit): it can never start"},
        estimated={"j": None},
    ),
    Scenario(
        "quota counts slices exactly: a slice that lands exactly on the limit is admitted",
        nodes=[node("a", gpus=1, sharing="mps")],
        quotas=[quota("t", limit_gib=20)],
        running=[R(job("r", team="t", memory_gib=10), {"a": [0]})],
        pending=[job("fits", memory_gib=10), job("over", memory_gib=0.5, submit=1)],
        placed={"fits": "a"},
        waiting={"over": "quota-limit"},
    ),
    # 5b. Per-GPU-model quotas -------------------------------------------------------------------------------
    Scenario(
        "a team capped at 4 H100 gets no more even with idle H100s, and the reason names the limit",
        nodes=[node("h", model="H100", cc=(9, 0))],
        quotas=[quota(TRAIN, per_model=[model_quota("H100", limit_gpus=4)])],
        running=[R(job("r", team=TRAIN, gpus=3), {"h": [0, 1, 2]})],
        pending=[
            job("two", team=TRAIN, gpus=2, models=["H100"], submit=0),
            job("one", team=TRAIN, gpus=1, models=["H100"], submit=1),
        ],
        placed={"one": {"h": [3]}},
        waiting={"two": "model-quota-limit"},
        reason_has={"two": "ai-lab/training would go past its H100 limit (4 GPUs): it holds 3 H100 GPUs"},
        reserved={},
    ),
    Scenario(
        "a team at its H100 limit still runs on the other models, even when an H100 node comes first",
        nodes=[node("h", model="H100", cc=(9, 0)), node("a", model="A100")],
        quotas=[quota(TRAIN, per_model=[model_quota("H100", limit_gpus=4)])],
        running=[R(job("r", team=TRAIN, gpus=4), {"h": [0, 1, 2, 3]})],
        pending=[job("any", team=TRAIN, gpus=2)],
        placed={"any": {"a": [0, 1]}},
        profile=BINPACK,
    ),
    Scenario(
        "a gang stays all-or-nothing: it goes whole to the models its team may still use",
        nodes=[
            node("h1", gpus=4, model="H100", cc=(9, 0)),
            node("h2", gpus=4, model="H100", cc=(9, 0)),
            node("a1", gpus=4, model="A100"),
            node("a2", gpus=4, model="A100"),
        ],
        quotas=[quota(TRAIN, per_model=[model_quota("H100", limit_gpus=4)])],
        pending=[job("gang", team=TRAIN, gpus=4, nodes=2)],
        placed={"gang": {"a1": [0, 1, 2, 3], "a2": [0, 1, 2, 3]}},
    ),
    Scenario(
        "a job kept off its capped model by busy other models says both: the limit, then what the rest lacks",
        nodes=[node("h", gpus=4, model="H100", cc=(9, 0)), node("a", gpus=4, model="A100")],
        quotas=[quota(TRAIN, per_model=[model_quota("H100", limit_gpus=2)])],
        running=[
            R(job("mine", team=TRAIN, gpus=2, priority=5), {"h": [0, 1]}),
            R(job("theirs", team="other", gpus=4, priority=5), {"a": [0, 1, 2, 3]}),
        ],
        pending=[job("j", team=TRAIN, gpus=1)],
        waiting={"j": "model-quota-limit"},
        reason_has={
            "j": "is at its H100 limit (2 GPUs): it holds 2 H100 GPUs and this job needs 1 more; "
            "on the GPU models it may still use: needs 1 free A100 GPU"
        },
    ),
    Scenario(
        "per-model limits count slices exactly: a slice landing exactly on the limit is admitted, the next is not",
        nodes=[node("h", gpus=1, model="H100", cc=(9, 0), sharing="mps")],
        quotas=[quota(TRAIN, per_model=[model_quota("H100", limit_gib=20)])],
        running=[R(job("r", team=TRAIN, memory_gib=10), {"h": [0]})],
        pending=[job("fits", team=TRAIN, memory_gib=10), job("over", team=TRAIN, memory_gib=0.5, submit=1)],
        placed={"fits": "h"},
        charged={"fits": (10 * 1024, 125)},
        waiting={"over": "model-quota-limit"},
        reason_has={"over": "is at its H100 limit (20 GiB of GPU memory): it holds 20 GiB on H100"},
    ),
    Scenario(
        "a MIG instance that rounds a slice past the model's limit sends the slice to another model",
        nodes=[
            node("hm", gpus=1, model="H100", cc=(9, 0), sharing="mig", mig_profiles_gib=[10, 20, 40]),
            node("a", gpus=1, model="A100", sharing="mps"),
        ],
        quotas=[quota(TRAIN, per_model=[model_quota("H100", limit_gib=15)])],
        pending=[job("s", team=TRAIN, memory_gib=12)],
        placed={"s": "a"},
        profile=BINPACK,
    ),
    Scenario(
        "a high-priority job of a team at its H100 limit evicts on another model, never to take an H100",
        nodes=[node("h", gpus=1, model="H100", cc=(9, 0)), node("a", gpus=1, model="A100")],
        quotas=[quota(TRAIN, per_model=[model_quota("H100", limit_gpus=0)])],
        running=[
            # Evicting low-h would lose less work: only the limit makes low-a the victim.
            R(job("low-h", team=TRAIN, gpus=1, priority=1), {"h": [0]}, start=NOW - 600),
            R(job("low-a", team=TRAIN, gpus=1, priority=1), {"a": [0]}, start=0.0),
        ],
        pending=[job("high", team=TRAIN, gpus=1, priority=10)],
        evicted={"low-a": "preempted"},
        placed={"high": "a"},
    ),
    Scenario(
        "work beyond the model's guarantee is borrowed even within the all-models guarantee",
        nodes=[node("h", gpus=4, model="H100", cc=(9, 0)), node("a", gpus=4, model="A100")],
        quotas=[
            quota(
                TRAIN,
                guaranteed_gib=640,
                guaranteed_gpus=8,
                per_model=[model_quota("H100", guaranteed_gib=80, guaranteed_gpus=1)],
            )
        ],
        pending=[
            job("h1", team=TRAIN, gpus=1, models=["H100"], submit=0),
            job("h2", team=TRAIN, gpus=1, models=["H100"], submit=1),
            job("a1", team=TRAIN, gpus=1, models=["A100"], submit=2),
        ],
        borrowed={"h1": False, "h2": True, "a1": False},
    ),
    Scenario(
        "a team without per-model rows is unaffected by another team's",
        nodes=[node("h", gpus=4, model="H100", cc=(9, 0))],
        quotas=[
            quota(TRAIN, per_model=[model_quota("H100", limit_gpus=1)]),
            quota("free", guaranteed_gpus=2),
        ],
        pending=[job("big", team="free", gpus=3, models=["H100"])],
        placed={"big": {"h": [0, 1, 2]}},
        borrowed={"big": True},
    ),
    # 6. Gangs, reservations, backfill ------------------------------------------------------------------------
    Scenario(
        "a blocked big job reserves cards and gets an estimated start; a short job backfills, a long one waits",
        nodes=[node("a")],
        running=[R(job("busy", gpus=6, max_runtime_s=4000.0), {"a": [0, 1, 2, 3, 4, 5]}, start=NOW - 1000)],
        pending=[
            job("big", gpus=8, priority=10, submit=0),
            job("short", gpus=1, submit=1, max_runtime_s=1800.0),
            job("long", gpus=1, submit=2, max_runtime_s=7200.0),
            job("open", gpus=1, submit=3),
        ],
        reserved={"big": NOW + 3000},
        placed={"short": "a"},
        waiting={"big": "waiting-for-capacity", "long": "reserved", "open": "reserved"},
        reason_has={"long": "reserved for job big", "big": "50 min"},
        profile=profile(fields={"actions": ("admit", "allocate", "backfill")}),
    ),
    Scenario(
        "blocked jobs hold their closest node even when no running job declares an end, bounded by "
        "reservations_max; other nodes stay open to small jobs",
        nodes=[node(n, gpus=4) for n in ("a", "b", "c")],
        running=[
            R(job(f"{n}{i}", gpus=1, priority=1, preemptible=False), {n: [i]}, start=NOW - 10)
            for n in ("a", "b", "c")
            for i in range(2 if n != "b" else 3)
        ],
        pending=[
            job("big1", gpus=4, priority=10, submit=0),
            job("big2", gpus=4, priority=10, submit=1),
            job("big3", gpus=4, priority=10, submit=2),
            job("small", gpus=1, priority=1, submit=3, max_runtime_s=60.0),
        ],
        # Each big job holds the node needing the fewest jobs to end (a, then c); b stays open.
        reserved={"big1": None, "big2": None},
        placed={"small": "b"},
        waiting={"big1": "insufficient-gpus", "big2": "insufficient-gpus", "big3": "insufficient-gpus"},
        reason_has={"big1": "node a is reserved for this job", "big2": "node c is reserved for this job"},
        estimated={"big1": None, "big3": None},
    ),
    Scenario(
        "every pending job gets an estimated start projected in queue order from the declared max runtimes",
        nodes=[node("a", gpus=4)],
        running=[
            R(job("r1", gpus=2, max_runtime_s=1000.0), {"a": [0, 1]}, start=NOW - 500),
            R(job("r2", gpus=2, max_runtime_s=3000.0), {"a": [2, 3]}, start=NOW),
        ],
        pending=[
            job("j1", gpus=2, submit=0, max_runtime_s=600.0),
            job("j2", gpus=2, submit=1, max_runtime_s=1000.0),
            job("j3", gpus=4, submit=2),
            job("j4", gpus=1, submit=3, max_runtime_s=60.0),
        ],
        # j1 when r1 ends; j2 when j1 ends; j3 when j2 and r2 have ended; j4 never (j3 declares no end).
        estimated={"j1": NOW + 500, "j2": NOW + 1100, "j3": NOW + 3000, "j4": None},
        reason_has={"j1": "estimated start in about 8 min", "j3": "estimated start in about 50 min"},
        profile=NO_PREEMPT,
    ),
    Scenario(
        "slices are projected on the shared cards' free compute: a memory-only slice counts its proportional share",
        nodes=[node("a", gpus=1, sharing="mps")],
        running=[
            R(job("r1", memory_gib=40, max_runtime_s=600.0), {"a": [0]}, start=NOW),
            R(job("r2", memory_gib=40), {"a": [0]}, start=NOW),
        ],
        pending=[
            job("s1", memory_gib=40, submit=0, max_runtime_s=300.0),
            job("s2", memory_gib=20, submit=1),
            job("s3", memory_gib=30, submit=2),
        ],
        # s1 when r1 ends; s2 when s1 ends; s3 never (s2 and r2 hold the rest with no known end).
        estimated={"s1": NOW + 600, "s2": NOW + 900, "s3": None},
        reason_has={"s1": "estimated start in about 10 min"},
        profile=NO_PREEMPT,
    ),
    # 7. Preemption and reclaim -----------------------------------------------------------------------------
    Scenario(
        "a higher-priority job evicts the fewest lower-priority jobs it needs, carrying their grace",
        nodes=[node("a", gpus=4)],
        running=[R(job(f"low{i}", gpus=1, priority=1, grace_s=60.0 + i), {"a": [i]}) for i in range(4)],
        pending=[job("high", gpus=2, priority=10)],
        evicted={"low0": "preempted", "low1": "preempted"},
        placed={"high": {"a": [0, 1]}},
        grace={"low0": 60.0, "low1": 61.0},
    ),
    Scenario(
        "preemption prefers the victims that lose the least work",
        nodes=[node("a", gpus=2)],
        running=[
            R(job("old", gpus=1, priority=1), {"a": [0]}, start=0.0),
            R(job("young", gpus=1, priority=1), {"a": [1]}, start=NOW - 600),
        ],
        pending=[job("high", gpus=1, priority=10)],
        evicted={"young": "preempted"},
        placed={"high": {"a": [1]}},
    ),
    Scenario(
        "preemption prefers the lowest priority victims",
        nodes=[node("a", gpus=2)],
        running=[
            R(job("p5", gpus=1, priority=5), {"a": [0]}, start=NOW - 600),
            R(job("p1", gpus=1, priority=1), {"a": [1]}, start=0.0),
        ],
        pending=[job("high", gpus=1, priority=10)],
        evicted={"p1": "preempted"},
    ),
    Scenario(
        "non-preemptible, equal-priority and too-young jobs are never evicted",
        nodes=[node("a", gpus=3)],
        running=[
            R(job("pinned", gpus=1, priority=1, preemptible=False), {"a": [0]}),
            R(job("peer", gpus=1, priority=10), {"a": [1]}),
            R(job("fresh", gpus=1, priority=1), {"a": [2]}, start=NOW - 10),
        ],
        pending=[job("high", gpus=1, priority=10)],
        # It holds the card of the job that becomes evictable first, and says when.
        waiting={"high": "waiting-for-capacity"},
        reason_has={"high": "5 min"},
        reserved={"high": NOW + 290},
    ),
    Scenario(
        "a gang victim is evicted whole, freeing all its nodes",
        nodes=[node("a", gpus=2), node("b", gpus=2)],
        running=[R(job("gang", gpus=2, nodes=2, priority=1), {"a": [0, 1], "b": [0, 1]})],
        pending=[job("high", gpus=2, priority=10)],
        evicted={"gang": "preempted"},
        placed={"high": "a"},
    ),
    Scenario(
        "room an eviction frees beyond the evicting job's need goes to the next job in the queue",
        nodes=[node("a", gpus=2)],
        running=[R(job("low", gpus=2, priority=1), {"a": [0, 1]})],
        pending=[job("high", gpus=1, priority=10), job("peer", gpus=1, priority=1, submit=1)],
        evicted={"low": "preempted"},
        placed={"high": {"a": [0]}, "peer": {"a": [1]}},
    ),
    Scenario(
        "a team below its guarantee reclaims borrowed capacity even from higher priority",
        nodes=[node("a", gpus=2)],
        quotas=[quota("owner", guaranteed_gib=160, guaranteed_gpus=2), quota("guest")],
        running=[R(job("borrowed", team="guest", gpus=2, priority=50), {"a": [0, 1]}, borrowed=True)],
        pending=[job("mine", team="owner", gpus=1, priority=10)],
        evicted={"borrowed": "reclaimed"},
        placed={"mine": "a"},
    ),
    Scenario(
        "a team above its guarantee cannot reclaim",
        nodes=[node("a", gpus=2)],
        quotas=[quota("owner", guaranteed_gib=0, guaranteed_gpus=0), quota("guest")],
        running=[R(job("borrowed", team="guest", gpus=2, priority=50), {"a": [0, 1]}, borrowed=True)],
        pending=[job("mine", team="owner", gpus=1, priority=10)],
        waiting={"mine": "insufficient-gpus"},
    ),
    Scenario(
        "work within its quota is not reclaimed",
        nodes=[node("a", gpus=2)],
        quotas=[quota("owner", guaranteed_gib=160, guaranteed_gpus=2), quota("guest", guaranteed_gpus=2)],
        running=[R(job("own", team="guest", gpus=2, priority=50), {"a": [0, 1]}, borrowed=False)],
        pending=[job("mine", team="owner", gpus=1, priority=10)],
        waiting={"mine": "insufficient-gpus"},
    ),
    # 7b. Guarantees are promises ---------------------------------------------------------------------------
    Scenario(
        "a higher-priority job of another team never evicts work within its owner's guarantee",
        nodes=[node("a", gpus=2)],
        quotas=[quota("owner", guaranteed_gpus=2), quota("vip", guaranteed_gpus=1)],
        running=[R(job(f"own{i}", team="owner", gpus=1, priority=1), {"a": [i]}) for i in range(2)],
        pending=[job("urgent", team="vip", gpus=1, priority=100)],
        waiting={"urgent": "insufficient-gpus"},
        borrowed={"own0": False, "own1": False},
    ),
    Scenario(
        "across teams priority never preempts, not even borrowed work: only reclaim evicts across teams",
        nodes=[node("a", gpus=2)],
        quotas=[quota("lender", guaranteed_gpus=1), quota("vip")],
        running=[
            R(job("kept", team="lender", gpus=1, priority=1), {"a": [0]}),
            R(job("lent", team="lender", gpus=1, priority=1), {"a": [1]}, start=100.0),
        ],
        # vip has no guarantee, so it cannot reclaim; its priority does not take lender's borrowed card.
        pending=[job("urgent", team="vip", gpus=1, priority=100)],
        waiting={"urgent": "insufficient-gpus"},
        borrowed={"kept": False, "lent": True},
    ),
    Scenario(
        "a team's higher-priority job takes the guarantee first; its older, lower-priority work is then borrowed",
        nodes=[node("a", gpus=2)],
        quotas=[quota("t", guaranteed_gpus=1)],
        running=[R(job("old", gpus=1, priority=1), {"a": [0]}, start=0.0)],
        pending=[job("urgent", gpus=1, priority=100)],
        placed={"urgent": {"a": [1]}},
        borrowed={"old": True, "urgent": False},
    ),
    Scenario(
        "within a team priority decides: its higher-priority job preempts its own lower-priority work",
        nodes=[node("a", gpus=2)],
        quotas=[quota("t", guaranteed_gpus=2)],
        running=[R(job(f"low{i}", gpus=1, priority=1), {"a": [i]}) for i in range(2)],
        pending=[job("high", gpus=1, priority=10)],
        evicted={"low0": "preempted"},
    ),
    Scenario(
        "never-preempted work beyond its team's guarantee runs on borrowed capacity, reclaimable",
        nodes=[node("a", gpus=4)],
        quotas=[quota("t", guaranteed_gpus=1)],
        pending=[job("train", gpus=2, priority=100, preemptible=False)],
        placed={"train": "a"},
        borrowed={"train": True},
    ),
    Scenario(
        "reclaim takes borrowed never-preempted work, and borrowed work younger than the minimum runtime",
        nodes=[node("a", gpus=2)],
        quotas=[quota("owner", guaranteed_gpus=2), quota("guest")],
        running=[
            R(job("pinned", team="guest", gpus=1, priority=100, preemptible=False), {"a": [0]}),
            R(job("fresh", team="guest", gpus=1, priority=1), {"a": [1]}, start=NOW - 10),
        ],
        pending=[job("mine", team="owner", gpus=2, priority=1)],
        evicted={"pinned": "reclaimed", "fresh": "reclaimed"},
        placed={"mine": "a"},
    ),
    Scenario(
        "reclaim evicts the victim that loses the least work since its last checkpoint",
        nodes=[node("a", gpus=2)],
        quotas=[quota("owner", guaranteed_gpus=1), quota("guest")],
        running=[
            # Both started at 0: "plain" would lose all 10,000 s, "checkpointed" only 10,000 mod 3,000 = 1,000 s.
            R(job("plain", team="guest", gpus=1), {"a": [0]}),
            R(job("checkpointed", team="guest", gpus=1, checkpoint_s=3000.0), {"a": [1]}),
        ],
        pending=[job("mine", team="owner", gpus=1)],
        evicted={"checkpointed": "reclaimed"},
        placed={"mine": {"a": [1]}},
    ),
    Scenario(
        "reclaim never takes a team below its guarantee: only its borrowed work is taken, or nothing",
        nodes=[node("a", gpus=2)],
        quotas=[quota("owner", guaranteed_gpus=2), quota("guest", guaranteed_gpus=1)],
        running=[
            R(job("kept", team="guest", gpus=1), {"a": [0]}, start=0.0),
            R(job("lent", team="guest", gpus=1), {"a": [1]}, start=100.0),
        ],
        # Two cards would need both of guest's jobs; one of them is within guest's guarantee.
        pending=[job("mine", team="owner", gpus=2)],
        waiting={"mine": "insufficient-gpus"},
        borrowed={"kept": False, "lent": True},
    ),
    Scenario(
        "reclaim takes first from the team that borrows the most per weight",
        nodes=[node("a", gpus=3)],
        quotas=[quota("owner", guaranteed_gpus=1), quota("heavy", weight=1), quota("light", weight=4)],
        running=[
            R(job("h0", team="heavy", gpus=1), {"a": [0]}, start=5000.0),
            R(job("l0", team="light", gpus=1), {"a": [1]}, start=9000.0),
            R(job("l1", team="light", gpus=1), {"a": [2]}, start=9000.0),
        ],
        # heavy borrows 1 GPU per weight, light 0.5: heavy's job goes, though it would lose more work.
        pending=[job("mine", team="owner", gpus=1)],
        evicted={"h0": "reclaimed"},
    ),
    Scenario(
        "work within a guarantee goes before borrowing work, whatever its priority",
        nodes=[node("a", gpus=1)],
        quotas=[quota("owner", guaranteed_gpus=1), quota("rich", guaranteed_gpus=1)],
        running=[R(job("r", team="rich", gpus=1), {"a": []}) for _ in ()] or [],
        pending=[
            job("borrowing", team="rich", gpus=2, priority=100, submit=0),
            job("owed", team="owner", gpus=1, priority=1, submit=5),
        ],
        placed={"owed": "a"},
        order=["owed"],
    ),
    Scenario(
        "idle capacity beyond the guarantees is lent by weight (weighted max-min)",
        nodes=[node("a", gpus=3)],
        quotas=[quota("two", weight=2), quota("one", weight=1)],
        pending=[
            *[job(f"two{i}", team="two", gpus=1, submit=10 + i) for i in range(3)],
            *[job(f"one{i}", team="one", gpus=1, submit=i) for i in range(3)],
        ],
        placed={"two0": "a", "one0": "a", "two1": "a"},
        waiting={"two2": "insufficient-gpus", "one1": "insufficient-gpus"},
    ),
    Scenario(
        "the borrowed label follows the team's standing: its longest-running work fills the guarantee",
        nodes=[node("a", gpus=4)],
        quotas=[quota("t", guaranteed_gpus=2)],
        running=[
            R(job("second", gpus=1), {"a": [1]}, start=100.0, borrowed=True),
            R(job("third", gpus=1), {"a": [2]}, start=200.0),
        ],
        pending=[job("next", gpus=1, submit=300.0)],
        # "first" has ended: "second" (placed as borrowed) is now within the guarantee; the new job borrows.
        borrowed={"second": False, "third": False, "next": True},
    ),
    Scenario(
        "with share, a borrowing team takes lent capacity from a team borrowing more per weight",
        nodes=[node("a", gpus=4)],
        quotas=[quota("early", weight=1), quota("late", weight=1)],
        running=[R(job(f"e{i}", team="early", gpus=1), {"a": [i]}, start=float(i)) for i in range(4)],
        # late would borrow 1 GPU, early keeps 3 without its victim: the gap narrows from 4:0 to 3:1.
        pending=[job("l0", team="late", gpus=1)],
        evicted={"e3": "reclaimed"},
        placed={"l0": {"a": [3]}},
        profile=SHARE,
    ),
    Scenario(
        "share never turns the gap round: a team borrowing as much per weight keeps its work",
        nodes=[node("a", gpus=2)],
        quotas=[quota("one", weight=1), quota("two", weight=2)],
        running=[R(job("o0", team="one", gpus=1), {"a": [0]}), R(job("t0", team="two", gpus=1), {"a": [1]})],
        # two would borrow 2 GPUs / weight 2 = 1 per weight, as much as one borrows now: nothing moves.
        pending=[job("t1", team="two", gpus=1)],
        waiting={"t1": "insufficient-gpus"},
        profile=SHARE,
    ),
    Scenario(
        "without share (tessera-prod) lent capacity comes back only as it frees",
        nodes=[node("a", gpus=4)],
        quotas=[quota("early", weight=1), quota("late", weight=1)],
        running=[R(job(f"e{i}", team="early", gpus=1), {"a": [i]}, start=float(i)) for i in range(4)],
        pending=[job("l0", team="late", gpus=1)],
        waiting={"l0": "insufficient-gpus"},
    ),
    # 7c. Who may use which priority, and what admission charges ---------------------------------------------
    Scenario(
        "a team's limit at a priority class holds: it waits at that class, other classes still run",
        nodes=[node("a", gpus=4)],
        quotas=[quota("t", class_limits_gpus={"critical": 2})],
        running=[R(job("c0", gpus=2, priority=100, priority_class="critical"), {"a": [0, 1]})],
        pending=[
            job("c1", gpus=1, priority=100, priority_class="critical"),
            job("n1", gpus=1, priority=10, priority_class="normal", submit=1),
        ],
        placed={"n1": "a"},
        waiting={"c1": "quota-limit"},
        reason_has={"c1": "its limit at priority class critical: it holds 2 of 2 GPUs at that class"},
    ),
    Scenario(
        "a job larger than its team's limit at its class is told it can never start at that class",
        nodes=[node("a", gpus=8)],
        quotas=[quota("t", class_limits_gpus={"critical": 2})],
        pending=[job("big", gpus=4, priority=100, priority_class="critical")],
        waiting={"big": "quota-never"},
        reason_has={"big": "may hold at most 2 GPUs at priority class critical"},
    ),
    Scenario(
        "admission charges the memory of the cards a job will hold: at its memory limit, a team's 1-GPU and "
        "critical 4-GPU jobs both wait as quota-limit and nothing of its own is preempted",
        nodes=[node("a", gpus=8)],
        quotas=[quota("t", limit_gib=320), quota("o")],
        running=[
            *[R(job(f"t{i}", gpus=1, priority=1), {"a": [i]}) for i in range(4)],
            *[R(job(f"o{i}", team="o", gpus=1, priority=1), {"a": [4 + i]}) for i in range(4)],
        ],
        pending=[
            job("one", gpus=1, priority=10),
            job("crit", gpus=4, priority=1000, preemptible=False, priority_class="critical", submit=1),
        ],
        waiting={"one": "quota-limit", "crit": "quota-limit"},
        reason_has={"crit": "it holds 320 GiB of 320 GiB and this job needs 320 GiB more"},
    ),
    Scenario(
        "evictions roll back whole when the evicting job still cannot be admitted",
        # Estimated on the smallest cards it may get (2 x 40 GiB) it is within its 100 GiB limit; the only room
        # eviction can make is on 80 GiB cards, whose exact charge is past the limit.
        nodes=[node("a", gpus=2), node("b", gpus=2, memory_gib=40)],
        quotas=[quota("t", guaranteed_gpus=2, limit_gib=100)],
        running=[
            R(job("low", team="o", gpus=2, priority=1), {"a": [0, 1]}),
            R(job("pinned", team="o", gpus=2, priority=1, preemptible=False), {"b": [0, 1]}),
        ],
        pending=[job("high", team="t", gpus=2, priority=10)],
        waiting={"high": "quota-limit"},
    ),
]


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario(sc: Scenario) -> None:
    decisions = run(sc)
    placements = {p.job_id: p for p in decisions.placements}
    pending = {p.job_id: p for p in decisions.pending}
    for job_id, where in sc.placed.items():
        assert job_id in placements, f"{job_id} not placed: {pending.get(job_id)}"
        got = placements[job_id].assignments
        if isinstance(where, str):
            assert {a.node for a in got} == {where} or (not got and where in placements[job_id].cpu)
        else:
            assert {n: sorted(a.gpu_index for a in got if a.node == n) for n in where} == where
            assert {a.node for a in got} == set(where)
    for job_id, (mem, comp) in sc.charged.items():
        (a,) = placements[job_id].assignments
        assert (a.memory_mib, a.compute_milli) == (mem, comp)
    for job_id, flag in sc.borrowed.items():
        assert (job_id in decisions.borrowed) is flag, f"{job_id} borrowed: {job_id in decisions.borrowed}"
        if job_id in placements:
            assert placements[job_id].borrowed is flag
    assert {e.job_id: e.code for e in decisions.evictions} == sc.evicted
    for victim, grace in sc.grace.items():
        assert next(e.grace_s for e in decisions.evictions if e.job_id == victim) == grace
    for job_id, code in sc.waiting.items():
        assert job_id in pending, f"{job_id} unexpectedly placed"
        assert pending[job_id].status.code == code, pending[job_id].status
    for job_id, text in sc.reason_has.items():
        assert text in pending[job_id].status.reason, pending[job_id].status.reason
    reservations = {r.job_id: r for r in decisions.reservations}
    assert sc.reserved is None or set(reservations) == set(sc.reserved)
    for job_id, start in (sc.reserved or {}).items():
        assert reservations[job_id].estimated_start == start
        assert pending[job_id].estimated_start == start
    for job_id, start in sc.estimated.items():
        assert pending[job_id].estimated_start == start, pending[job_id]


def test_every_pending_job_gets_a_reason_and_a_queue_position() -> None:
    nodes = [node("a", gpus=2)]
    pending = [job(f"j{i}", gpus=1, submit=i) for i in range(5)]
    decisions = run_cycle(snapshot(nodes, pending=pending), profile())
    assert len(decisions.placements) == 2
    assert [p.position for p in decisions.pending] == [1, 2, 3]
    assert all(p.status.code and p.status.reason for p in decisions.pending)


def test_the_seed_case_study_trains_on_8_nvlink_cards_and_packs_inference_onto_mps_slices() -> None:
    """The seed (shared/seed/README.md): 20 light inference jobs hold cards when an 8-GPU training job arrives.
    With MPS slicing and reclaim the training job gets 8 NVLink-connected A100s at once and the inference jobs
    share two cards. Inference is guaranteed 40 GiB (ten of its jobs): the ten that started last, on the second
    node, run on borrowed capacity, and training (within its own guarantee) takes them back."""
    nodes = [node(f"a100-0{i}", sharing="mps") for i in (1, 2)]
    quotas = [
        quota("ai-lab/training", guaranteed_gib=640, guaranteed_gpus=8),
        quota("ai-lab/inference", guaranteed_gib=40),
    ]
    # Before: inference spread whole-card style over the cards of both nodes (the "45 %" situation).
    infer = [
        job(f"inf{i:02d}", team="ai-lab/inference", priority=50, memory_gib=4, compute_pct=10)
        for i in range(20)
    ]
    spread_out = [
        R(j, {f"a100-0{1 + i % 2}": [i // 2 % 8]}, start=100.0 * (i % 2)) for i, j in enumerate(infer)
    ]
    train = job("train", team="ai-lab/training", priority=100, gpus=8, min_memory_gib=40, topology="nvlink")
    sc = Scenario("seed", nodes=nodes, running=spread_out, quotas=quotas, pending=[train])
    decisions = run(sc)
    (placement,) = decisions.placements
    cards = placement.assignments
    assert len(cards) == 8 and len({a.node for a in cards}) == 1
    evicted = {e.job_id for e in decisions.evictions}
    assert evicted == {j.id for i, j in enumerate(infer) if i % 2}  # the borrowed ones, on a100-02
    # Taken back (reclaimed), and moved at once to the other node's MPS cards where they fit there.
    assert all(e.code in ("reclaimed", "moved") for e in decisions.evictions)
    assert all(e.to_nodes == ("a100-01",) for e in decisions.evictions if e.code == "moved")
    # The evicted inference jobs come back as slices and pack onto MPS cards of the other node.
    requeued = [j for j in infer if j.id in evicted]
    kept = [r for r in spread_out if r[0].id not in evicted]
    run_jobs = [running(j, on, nodes=nodes, start=s) for j, on, s, _ in kept]
    train_running = running(train, {cards[0].node: [a.gpu_index for a in cards]}, nodes=nodes, start=NOW)
    after = run_cycle(
        snapshot(
            nodes, pending=requeued, running_jobs=[*run_jobs, train_running], quotas=quotas, now=NOW + 60
        ),
        profile(),
    )
    assert {p.job_id for p in after.placements} == {j.id for j in requeued}
    used_cards = {(a.node, a.gpu_index) for r in kept for a in running(r[0], r[1], nodes=nodes).assignments}
    used_cards |= {(a.node, a.gpu_index) for p in after.placements for a in p.assignments}
    assert all(node_name != cards[0].node for node_name, _ in used_cards)
    assert len(used_cards) <= 8


def test_the_same_snapshot_gives_the_same_decisions_cold_or_warm() -> None:
    nodes = [node(f"n{i}", gpus=4, sharing="mps" if i % 2 else "exclusive") for i in range(6)]
    pending = [
        job(f"j{i}", gpus=i % 3, memory_gib=0 if i % 3 else 8, submit=i, priority=i % 4) for i in range(30)
    ]
    snap = snapshot(nodes, pending=pending)
    p = profile()
    first = run_cycle(snap, p)
    assert run_cycle(snap, p) == first
    assert run_cycle(snap, profile()) == first


def test_a_node_whose_numa_layout_changes_is_looked_at_again() -> None:
    """A node that did not fit and comes back with the same cards on other NUMA nodes (or another compute
    capability, or other labels) has not merely lost capacity: the warm engine must look at it again."""
    p = profile(fields={"actions": ("admit", "allocate")})
    j = job("j", gpus=3, topology="numa")
    assert not run_cycle(snapshot([node("n1", gpus=4, numa=2)], pending=[j]), p).placements
    regrouped = snapshot([node("n1", gpus=4)], pending=[j])
    assert run_cycle(regrouped, p) == run_cycle(regrouped, profile(fields={"actions": ("admit", "allocate")}))
    assert run_cycle(regrouped, p).placements


def test_a_warm_engine_that_saw_other_gpu_models_refuses_a_model_limited_slice_as_a_cold_one_does() -> None:
    """Charged exactly (a MIG instance rounds the slice up to 40 GiB) the slice would take its team past its
    A100 limit, and the cluster has no other model: it waits with `model-quota-limit`. An engine that placed
    work on L4 cards in an earlier cycle must answer the same (it used to look again on the L4 it remembered)."""
    nodes = [node("a", gpus=2, sharing=["exclusive", "mig"], mig_profiles_gib=(10, 20, 40))]
    held = running(job("held", team="b", gpus=1), {"a": [0]}, nodes=nodes)
    snap = snapshot(
        nodes,
        pending=[job("s", team="b", compute_pct=30)],
        running_jobs=[held],
        quotas=[quota("b", per_model=[model_quota("A100", limit_gib=100)])],
    )
    cold = run_cycle(snap, profile())
    assert cold.pending[0].status.code == "model-quota-limit"
    warm = profile()
    run_cycle(snapshot([node("l4", gpus=1, model="L4")], pending=[job("x", gpus=1)]), warm)
    assert run_cycle(snap, warm) == cold


class _RefuseNodeB:
    """A profile filter for the test below: node b is off limits."""

    NAME = "test-refuse-node-b"

    def filter(self, ctx, job, node):
        from scheduling.engine.types import Status

        return Status("test", "node b is off limits") if node.name == "b" else None


def test_a_profile_filter_that_refuses_the_only_roomy_node_is_named_in_the_reason() -> None:
    from scheduling.engine.plugins import register

    register(_RefuseNodeB)
    p = profile(fields={"filters": ("fits", "test-refuse-node-b")})
    nodes = [node("a", gpus=1), node("b", gpus=2)]
    busy = running(job("r", gpus=1), {"a": [0]}, nodes=nodes)
    decisions = run_cycle(snapshot(nodes, pending=[job("j", gpus=2)], running_jobs=[busy]), p)
    (pending,) = decisions.pending
    assert pending.status.code == "filtered"
    assert "test-refuse-node-b refused b: node b is off limits" in pending.status.reason
    placed = run_cycle(snapshot(nodes, pending=[job("k", gpus=2)], running_jobs=[busy]), profile())
    assert {a.node for a in placed.placements[0].assignments} == {"b"}


def test_every_plugin_module_is_registered_under_its_name() -> None:
    import importlib
    import pkgutil

    from scheduling.engine import plugins

    for info in pkgutil.iter_modules(plugins.__path__):
        module = importlib.import_module(f"scheduling.engine.plugins.{info.name}")
        if hasattr(module, "NAME"):
            assert plugins.REGISTRY[module.NAME].__module__ == module.__name__


def test_a_profile_naming_an_unknown_plugin_fails_when_looked_up() -> None:
    from scheduling.engine import PROFILES, get_profile, register_profile

    register_profile(Profile(name="test-broken", node_scores=(("no-such-score", 1.0),)))
    try:
        with pytest.raises(KeyError, match="no-such-score"):
            get_profile("test-broken")
    finally:
        PROFILES.pop("test-broken")


def _starvation_run(p: Profile, cycles: int = 12) -> int | None:
    """A big job waits while one-card jobs keep arriving; returns the cycle it starts in (None if never)."""
    nodes = [node("a", gpus=4)]
    now = NOW
    big = job("big", gpus=4, priority=5, submit=now)
    running_jobs = [
        replace_job(job(f"r{i}", gpus=1, max_runtime_s=600.0), "a", i, now - 300 * i) for i in range(4)
    ]
    pending = [big]
    for cycle in range(cycles):
        pending += [job(f"s{cycle}-{k}", gpus=1, submit=now, max_runtime_s=3000.0) for k in range(2)]
        snap = snapshot(nodes, pending=pending, running_jobs=running_jobs, now=now)
        decisions = run_cycle(snap, p)
        placed = {pl.job_id: pl for pl in decisions.placements}
        if "big" in placed:
            return cycle
        by_id = {j.id: j for j in pending}
        running_jobs += [
            replace(
                by_id[i],
                assignments=pl.assignments,
                cpu_assignments=MappingProxyType(dict(pl.cpu)),
                start_time=now,
            )
            for i, pl in placed.items()
        ]
        pending = [j for j in pending if j.id not in placed]
        now += 300.0
        running_jobs = [j for j in running_jobs if j.start_time + j.max_runtime_s > now]
        assert with_ledger(nodes, running_jobs)  # the ledger stays consistent
    return None


def replace_job(j, node_name: str, card: int, start: float):
    return running(j, {node_name: [card]}, nodes=[node("a", gpus=4)], start=start)


def test_a_big_job_does_not_starve_behind_a_stream_of_small_ones() -> None:
    without = _starvation_run(profile(fields={"actions": ("admit", "allocate")}))
    with_reservations = _starvation_run(profile(fields={"actions": ("admit", "allocate", "backfill")}))
    assert without is None  # the small jobs keep taking every card that frees up
    assert with_reservations is not None and with_reservations <= 4


def _unknown_runtime_run(p: Profile, cycles: int = 15) -> tuple[int | None, int]:
    """A 4-card job waits on a node of one-card jobs that declare no max runtime and run 4 min (less than the
    5 min minimum runtime, so none can be preempted); two such jobs arrive every minute. Returns the cycle the
    big job starts in (None if never) and how many small jobs were placed on the node after the first cycle."""
    nodes = [node("a", gpus=4)]
    now = NOW
    lifetime_s = 240.0
    running_jobs = [
        running(job(f"r{i}", gpus=1, priority=1), {"a": [i]}, nodes=nodes, start=now - 60 * i)
        for i in range(4)
    ]
    pending = [job("big", gpus=4, priority=10, submit=now)]
    refilled = 0
    for cycle in range(cycles):
        pending += [job(f"s{cycle}-{k}", gpus=1, priority=1, submit=now) for k in range(2)]
        decisions = run_cycle(snapshot(nodes, pending=pending, running_jobs=running_jobs, now=now), p)
        placed = {pl.job_id: pl for pl in decisions.placements}
        if "big" in placed:
            return cycle, refilled
        if cycle:
            refilled += len(placed)
        by_id = {j.id: j for j in pending}
        running_jobs += [
            replace(
                by_id[i],
                assignments=pl.assignments,
                cpu_assignments=MappingProxyType(dict(pl.cpu)),
                start_time=now,
            )
            for i, pl in placed.items()
        ]
        pending = [j for j in pending if j.id not in placed]
        now += 60.0
        running_jobs = [j for j in running_jobs if j.start_time + lifetime_s > now]
        assert with_ledger(nodes, running_jobs)
    return None, refilled


def test_a_big_job_does_not_starve_when_the_small_jobs_declare_no_max_runtime() -> None:
    without, refilled_without = _unknown_runtime_run(profile(reserve_unknown_start=False))
    started, refilled = _unknown_runtime_run(profile())
    assert without is None and refilled_without > 0  # freed cards go to the stream of small jobs
    # The cards are held as they free up: nothing lower lands on the node, and the job starts once the four
    # jobs running there at first have ended (4 min).
    assert refilled == 0
    assert started is not None and started <= 4
