"""Big jobs among small ones: moving work to make room, holds for moved jobs, reservations that hold, no thrash,
priority inside a team, and placement that keeps whole NVLink nodes for the work that needs them."""

from __future__ import annotations

from dataclasses import replace

from scheduling.engine import run_cycle
from scheduling.engine.accounting import guarantee_order
from tests.engine.builders import job, node, profile, quota, request, running, snapshot

NOW = 10_000.0
TRAIN = dict(gpus=8, topology="nvlink")


def cluster():
    """One NVSwitch node (the only place an 8-GPU NVLink job fits) and a PCIe node of four cards."""
    return [
        node("nv", gpus=8, nvlink="all", sharing="mps"),
        node("pcie", gpus=4, nvlink="none", sharing="mps"),
    ]


def test_a_guaranteed_big_job_moves_small_work_off_the_only_whole_node_and_holds_its_new_place() -> None:
    nodes = cluster()
    quotas = [quota("llm", guaranteed_gpus=8), quota("vision", guaranteed_gpus=4)]
    # vision's single card sits on the NVSwitch node, within vision's guarantee; the PCIe node has room.
    small = running(
        job("small", team="vision", gpus=1, checkpoint_s=600, grace_s=45),
        {"nv": [3]},
        nodes=nodes,
        start=NOW - 100,
    )
    big = job("big", team="llm", priority=100, preemptible=False, **TRAIN)
    d = run_cycle(snapshot(nodes, pending=[big], running_jobs=[small], quotas=quotas, now=NOW), profile())
    (placement,) = d.placements
    assert placement.job_id == "big" and {a.node for a in placement.assignments} == {"nv"}
    (ev,) = d.evictions
    assert (ev.job_id, ev.preemptor_id, ev.code, ev.grace_s) == ("small", "big", "moved", 45.0)
    assert ev.to_nodes == ("pcie",)
    assert ev.why == "moved to pcie to free an NVLink node for team llm's guaranteed 8-GPU job big"
    # Its new place is held for it until its grace ends.
    (home,) = [r for r in d.reservations if r.job_id == "small"]
    assert {a.node for a in home.assignments} == {"pcie"} and home.estimated_start == NOW + 45
    # It keeps its place in its team's guarantee.
    assert "small" not in d.borrowed


def test_work_is_moved_only_where_it_can_run_elsewhere_now() -> None:
    """The PCIe node is full of llm's own never-preempted work: vision's card cannot go anywhere, so it stays
    (within its team's guarantee) and the big job waits."""
    nodes = cluster()
    quotas = [quota("llm", guaranteed_gpus=12), quota("vision", guaranteed_gpus=4)]
    small = running(job("small", team="vision", gpus=1), {"nv": [3]}, nodes=nodes, start=NOW - 100)
    pinned = running(
        job("pinned", team="llm", gpus=4, preemptible=False), {"pcie": [0, 1, 2, 3]}, nodes=nodes
    )
    big = job("big", team="llm", priority=100, **TRAIN)
    d = run_cycle(
        snapshot(nodes, pending=[big], running_jobs=[small, pinned], quotas=quotas, now=NOW), profile()
    )
    assert not d.placements and not d.evictions
    # It holds the cards as they free up, and says for whom.
    (p,) = d.pending
    assert "node nv is reserved for this job" in p.status.reason


def test_a_job_being_moved_holds_its_new_place_until_it_is_ready() -> None:
    """Listed pending with `ready_at` while it stops where it ran: later jobs may not take its held card."""
    nodes = [node("pcie", gpus=1, nvlink="none")]
    moving = replace(job("moving", team="vision", gpus=1, submit=5.0), ready_at=NOW + 30)
    later = job("later", team="vision", gpus=1, submit=10.0)
    d = run_cycle(snapshot(nodes, pending=[moving, later], now=NOW), profile())
    assert not d.placements
    (hold,) = d.reservations
    assert hold.job_id == "moving" and hold.estimated_start == NOW + 30
    reasons = {p.job_id: p.status for p in d.pending}
    assert reasons["moving"].code == "moving"
    assert "restarts there in about 30 s" in reasons["moving"].reason
    assert reasons["later"].code == "reserved"


def test_a_job_evicted_twice_in_the_last_hour_is_left_alone() -> None:
    nodes = [node("a", gpus=2, nvlink="none")]
    quotas = [quota("owner", guaranteed_gpus=2), quota("lender")]
    lent = [
        replace(
            running(job(f"lent{i}", team="lender", gpus=1), {"a": [i]}, nodes=nodes, start=NOW - 60),
            recent_evictions=evicted,
        )
        for i, evicted in enumerate((2, 1))
    ]
    mine = job("mine", team="owner", gpus=1)
    d = run_cycle(snapshot(nodes, pending=[mine], running_jobs=lent, quotas=quotas, now=NOW), profile())
    assert [(e.job_id, e.code) for e in d.evictions] == [("lent1", "reclaimed")]


def test_a_teams_high_priority_job_is_owed_its_guarantee_while_the_teams_batch_work_holds_it() -> None:
    """research holds its whole guarantee with young batch work (too young to preempt); its training is within
    the guarantee counted at its own priority, so it takes back what vision borrows instead of waiting for its
    own batch to end."""
    nodes = [node("a", gpus=4, nvlink="none"), node("b", gpus=4, nvlink="none")]
    quotas = [quota("research", guaranteed_gpus=4), quota("vision", guaranteed_gpus=2)]
    batch = [
        running(
            job(f"batch{i}", team="research", gpus=1, priority=10), {"a": [i]}, nodes=nodes, start=NOW - 60
        )
        for i in range(4)
    ]
    vision = [
        running(job(f"v{i}", team="vision", gpus=1), {"b": [i]}, nodes=nodes, start=NOW - 60)
        for i in range(4)
    ]
    train = job("train", team="research", priority=100, gpus=2)
    d = run_cycle(
        snapshot(nodes, pending=[train], running_jobs=[*batch, *vision], quotas=quotas, now=NOW), profile()
    )
    (placement,) = d.placements
    assert placement.job_id == "train" and {a.node for a in placement.assignments} == {"b"}
    # vision's two borrowed cards (the last in its guarantee order) go back; its guarantee stays whole.
    assert sorted((e.job_id, e.code) for e in d.evictions) == [("v2", "reclaimed"), ("v3", "reclaimed")]


def test_labels_are_kept_a_job_placed_within_its_guarantee_stays_within() -> None:
    """Two jobs of the same class and priority: the one already within the guarantee fills it first, whatever
    their start times say, so a job placed within is not relabelled borrowed (and reclaimed) by the next."""
    first = replace(job("later-start", gpus=1), start_time=200.0, borrowed=False)
    second = replace(job("earlier-start", gpus=1), start_time=100.0, borrowed=True)
    assert sorted([second, first], key=guarantee_order)[0].id == "later-start"


def test_a_reservation_stays_on_its_nodes_while_they_still_make_sense() -> None:
    nodes = [node("a", gpus=2, nvlink="none"), node("b", gpus=2, nvlink="none")]
    holders = [
        running(job("ra", gpus=2, max_runtime_s=3000), {"a": [0, 1]}, nodes=nodes, start=NOW - 100),
        running(job("rb", gpus=2, max_runtime_s=3100), {"b": [0, 1]}, nodes=nodes, start=NOW - 100),
    ]
    big = job("big", gpus=2)
    first = run_cycle(snapshot(nodes, pending=[big], running_jobs=holders, now=NOW), profile())
    (held,) = first.reservations
    assert {a.node for a in held.assignments} == {"a"}  # node a frees first
    # Next cycle it had held b (say a node a job came back to); b still makes sense: it stays there.
    kept = run_cycle(
        snapshot(nodes, pending=[replace(big, reserved_on=("b",))], running_jobs=holders, now=NOW),
        profile(),
    )
    (again,) = kept.reservations
    assert {a.node for a in again.assignments} == {"b"}
    assert again.waits_for == "rb" and "(when job rb ends)" in kept.pending[0].status.reason
    # b is cordoned: the reservation goes, and the job's reason says why.
    cordoned = [nodes[0], replace(nodes[1], state=type(nodes[1].state)("cordoned"))]
    dropped = run_cycle(
        snapshot(cordoned, pending=[replace(big, reserved_on=("b",))], running_jobs=holders[:1], now=NOW),
        profile(),
    )
    assert "its reservation on b was dropped: b is cordoned" in dropped.pending[0].status.reason


def test_moving_a_memory_only_slice_to_a_smaller_card_never_makes_up_for_guaranteed_work_lost() -> None:
    """asr is guaranteed 48 GiB of GPU memory and holds it in four 12 GiB slices on the 80 GB cards that nlp's
    training needs. Only three fit on the 40 GB card; moved there each would hold twice the compute share, which
    must not count as keeping the guarantee while the fourth goes back to the queue: nothing moves."""
    nodes = [
        node("big", gpus=2, memory_gib=80, sharing="mps"),
        node("small", gpus=1, memory_gib=40, sharing="mps"),
    ]
    quotas = [quota("asr", guaranteed_gib=48), quota("nlp", guaranteed_gib=160)]
    slices = [
        running(job(f"s{i}", team="asr", memory_gib=12), {"big": [i % 2]}, nodes=nodes, start=NOW - 60)
        for i in range(4)
    ]
    train = job("train", team="nlp", priority=100, gpus=2, min_memory_gib=80)
    d = run_cycle(snapshot(nodes, pending=[train], running_jobs=slices, quotas=quotas, now=NOW), profile())
    assert not d.placements and not d.evictions


def test_the_production_placement_sends_a_job_that_needs_no_nvlink_to_the_node_no_nvlink_job_could_use() -> (
    None
):
    """Fragmentation counts NVLink: an 8-card job with no topology on the NVSwitch node would leave the NVLink
    trainings of the typical workload nowhere, so it takes the node whose cards are linked in pairs."""
    nodes = [node("nvswitch", gpus=8, nvlink="all"), node("pairs", gpus=8, nvlink=[2, 2, 2, 2])]
    workload = ((request(gpus=8, topology="nvlink"), 0.5), (request(gpus=8), 0.5))
    snap = replace(snapshot(nodes, pending=[job("plain", gpus=8)], now=NOW), workload=workload)
    (placement,) = run_cycle(snap, profile()).placements
    assert {a.node for a in placement.assignments} == {"pairs"}
