"""The simulator's guarantee and fairness figures, each worked out by hand on a one- or two-node cluster."""

from __future__ import annotations

from scheduling.engine.types import Gpu, Node, Request
from scheduling.sim.des import JobSpec, SimConfig, simulate
from tests.sim._firstfit import first_fit


def _node(name: str, gpus: int = 1) -> Node:
    return Node(name, 64_000, 1 << 20, gpus=tuple(Gpu(i, f"{name}-{i}", "A100", 40_960) for i in range(gpus)))


def _job(job_id: str, team: str, submit: float, runtime: float, **kw) -> JobSpec:
    kw.setdefault("request", Request(gpus=1))
    return JobSpec(id=job_id, team=team, submit_time_s=submit, runtime_s=runtime, **kw)


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
