"""Property tests over random small clusters and queues: the engine's invariants hold whatever it is given."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations
from types import MappingProxyType

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine import run_cycle
from scheduling.engine.accounting import borrowed_ids, keeps_guarantee
from scheduling.engine.resources import charge_of, job_host_on, release_on_node
from scheduling.engine.types import WHOLE_GPU_MILLI, Health, Sharing, Snapshot, TopologyNeed
from tests.engine.builders import job, model_quota, node, profile, quota, snapshot

NOW = 100_000.0
FACTOR = 2.0
MIN_RUNTIME_S = 300.0
PROFILE = profile(timeslice_oversubscription=FACTOR, min_runtime_s=MIN_RUNTIME_S)
FILL = profile("binpack", fields={"actions": ("allocate",), "admit": ()}, timeslice_oversubscription=FACTOR)
SETTINGS = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def clusters(draw, crowded: bool = False):
    nodes = []
    for i in range(draw(st.integers(1, 3))):
        gpus = draw(st.integers(1, 4))
        nodes.append(
            node(
                f"n{i}",
                gpus=gpus,
                model=draw(st.sampled_from(["A100", "H100"])),
                memory_gib=draw(st.sampled_from([40, 80])),
                sharing=draw(
                    st.lists(
                        st.sampled_from(["exclusive", "mps", "timeslice", "mig"]),
                        min_size=gpus,
                        max_size=gpus,
                    )
                ),
                nvlink=draw(st.sampled_from(["all", "none", [gpus // 2, gpus - gpus // 2]])),
                numa=draw(st.sampled_from([None, 2])),
                cpu=draw(st.sampled_from([8, 32, 64])),
                host_memory_gib=draw(st.sampled_from([64, 256])),
                state="ready" if crowded else draw(st.sampled_from(["ready"] * 8 + ["cordoned", "lost"])),
                failed=draw(st.sets(st.integers(0, gpus - 1), max_size=1)),
                mig_profiles_gib=[10, 20, 40],
            )
        )
    return nodes


@st.composite
def jobs(draw, prefix: str, count: int, priorities: tuple[int, int] = (0, 3), crowded: bool = False):
    out = []
    for i in range(count):
        kind = draw(st.sampled_from(["whole", "whole", "slice", "slice", "cpu"]))
        common = dict(
            team=draw(st.sampled_from(["a", "b", "c"])),
            priority=draw(st.integers(*priorities)),
            preemptible=draw(st.sampled_from([True, True, True, False])),
            submit=float(draw(st.integers(0, 1000))),
            max_runtime_s=draw(st.sampled_from([None, 600.0, 7200.0])),
            cpu=0 if crowded else draw(st.sampled_from([0, 4, 4, 16])),
            host_memory_gib=0 if crowded else draw(st.sampled_from([0, 32])),
            models=[] if crowded else draw(st.sampled_from([[], [], ["A100"], ["H100"]])),
        )
        if kind == "whole":
            req = dict(
                gpus=draw(st.integers(1, 4)),
                nodes=draw(st.sampled_from([1, 1, 1, 2])),
                topology=draw(st.sampled_from(["none", "numa", "nvlink"])),
                min_memory_gib=0 if crowded else draw(st.sampled_from([0, 0, 0, 80])),
            )
        elif kind == "slice":
            mem = draw(st.sampled_from([0, 5, 10, 20]))
            req = dict(
                memory_gib=mem,
                compute_pct=draw(st.sampled_from([10, 30, 60] if mem == 0 else [0, 10, 30, 60])),
            )
        else:
            req = {}
        out.append(job(f"{prefix}{i}", **common, **req))
    return out


@st.composite
def model_quotas(draw):
    """A per-GPU-model row; limits small enough to bind in these small clusters (0 forbids the model)."""
    return model_quota(
        draw(st.sampled_from(["A100", "H100"])),
        guaranteed_gib=draw(st.sampled_from([0, 40, 160])),
        limit_gib=draw(st.sampled_from([None, None, 20, 100])),
        guaranteed_gpus=draw(st.sampled_from([0, 1, 2])),
        limit_gpus=draw(st.sampled_from([None, 0, 0.5, 1, 3])),
    )


@st.composite
def worlds(draw) -> Snapshot:
    """Random worlds; half of them crowded (all nodes ready, no model or host needs, many running jobs) so that
    preemption and reclaim happen often."""
    crowded = draw(st.booleans())
    nodes = draw(clusters(crowded))
    first = draw(jobs("r", draw(st.integers(6 if crowded else 0, 12)), priorities=(0, 2), crowded=crowded))
    placed = run_cycle(snapshot(nodes, pending=first), FILL).placements
    by_id = {j.id: j for j in first}
    running_jobs = [
        replace(
            by_id[p.job_id],
            assignments=p.assignments,
            cpu_assignments=MappingProxyType(dict(p.cpu)),
            start_time=float(draw(st.sampled_from([0.0, NOW - 100, NOW - 5000]))),
            borrowed=draw(st.booleans()),
        )
        for p in placed
    ]
    pending = draw(jobs("p", draw(st.integers(1, 6)), priorities=(1, 3), crowded=crowded))
    quotas = [
        quota(
            team,
            guaranteed_gib=draw(st.sampled_from([0, 80, 320])),
            limit_gib=draw(st.sampled_from([None, None, 160, 640])),
            guaranteed_gpus=draw(st.sampled_from([0, 1, 4])),
            limit_gpus=draw(st.sampled_from([None, None, 2, 8])),
            per_model=draw(st.lists(model_quotas(), max_size=2, unique_by=lambda m: m.model)),
        )
        for team in ("a", "b")
    ]
    return snapshot(
        nodes,
        pending=pending,
        running_jobs=running_jobs,
        quotas=quotas,
        now=NOW,
        seed=draw(st.integers(0, 3)),
    )


def after(snap: Snapshot, decisions) -> dict:
    """The nodes once evictions and placements are applied to the snapshot's ledger."""
    nodes = {n.name: n for n in snap.nodes}
    evicted = {e.job_id for e in decisions.evictions}
    for j in snap.running:
        if j.id not in evicted:
            continue
        names = {a.node for a in j.assignments} | set(j.cpu_assignments)
        for name in names:
            cpu, mem = job_host_on(j, name)
            nodes[name] = release_on_node(
                nodes[name], tuple(a for a in j.assignments if a.node == name), cpu, mem
            )
    from scheduling.engine.resources import allocate_on_node

    for p in decisions.placements:
        for name in {a.node for a in p.assignments} | set(p.cpu):
            cpu, mem = p.cpu.get(name, (0, 0))
            nodes[name] = allocate_on_node(
                nodes[name], tuple(a for a in p.assignments if a.node == name), cpu, mem
            )
    return nodes


@SETTINGS
@given(worlds())
def test_no_gpu_or_host_is_over_committed(snap: Snapshot) -> None:
    decisions = run_cycle(snap, PROFILE)
    for n in after(snap, decisions).values():
        assert n.allocated_cpu_milli <= n.cpu_milli and n.allocated_memory_mib <= n.memory_mib
        for g in n.gpus:
            assert g.allocated_memory_mib <= g.memory_mib
            cap = WHOLE_GPU_MILLI * (FACTOR if g.sharing is Sharing.TIMESLICE else 1)
            assert g.allocated_compute_milli <= cap
    # A whole card is never shared with anyone.
    held: dict[tuple[str, int], int] = {}
    whole: set[tuple[str, int]] = set()
    evicted = {e.job_id for e in decisions.evictions}
    live = [j.assignments for j in snap.running if j.id not in evicted] + [
        p.assignments for p in decisions.placements
    ]
    for assigns in live:
        for a in assigns:
            held[(a.node, a.gpu_index)] = held.get((a.node, a.gpu_index), 0) + 1
            if a.compute_milli == WHOLE_GPU_MILLI and a.memory_mib >= 40 * 1024:
                whole.add((a.node, a.gpu_index))
    for card in whole:
        assert held[card] == 1


@SETTINGS
@given(worlds())
def test_no_placement_violates_a_constraint(snap: Snapshot) -> None:
    decisions = run_cycle(snap, PROFILE)
    nodes = {n.name: n for n in snap.nodes}
    pending = {j.id: j for j in snap.pending}
    for p in decisions.placements:
        req = pending[p.job_id].request
        used = {a.node for a in p.assignments} | set(p.cpu)
        assert len(used) == req.nodes
        for name in used:
            n = nodes[name]
            assert n.schedulable
            assert p.cpu[name] == (req.cpu_milli, req.memory_mib)
            cards = [a for a in p.assignments if a.node == name]
            gpus = {g.index: g for g in n.gpus}
            for a in cards:
                g = gpus[a.gpu_index]
                assert g.health is not Health.FAILED
                assert not req.gpu_models or g.model in req.gpu_models
                assert g.memory_mib >= req.min_gpu_memory_mib
                if req.is_slice:
                    assert g.sharing is not Sharing.EXCLUSIVE
                    assert a.memory_mib >= req.gpu_memory_mib and a.compute_milli >= req.gpu_compute_milli
                    if g.sharing is Sharing.MIG:
                        assert a.memory_mib in g.mig_profiles_mib
            if req.gpus:
                assert len(cards) == req.gpus
                idx = [a.gpu_index for a in cards]
                if req.topology is TopologyNeed.NVLINK:
                    assert all((min(x, y), max(x, y)) in n.nvlink for x, y in combinations(idx, 2))
                if req.topology is TopologyNeed.NUMA:
                    assert len({gpus[i].numa_node for i in idx}) == 1
            elif req.is_slice:
                assert len(cards) == 1
            else:
                assert not cards
    # A job on whole cards held for a reservation backfills: it must end before the reserved job starts. Cards
    # held with no estimated start count as needed soon: nobody backfills them; the only job on them is one
    # placed earlier in the cycle whose end the hold waits for (declared, or when it may be preempted).
    for r in decisions.reservations:
        held = {(a.node, a.gpu_index) for a in r.assignments if a.compute_milli >= WHOLE_GPU_MILLI}
        for p in decisions.placements:
            if held & {(a.node, a.gpu_index) for a in p.assignments}:
                placed, holder = pending[p.job_id], pending[r.job_id]
                runtime = placed.max_runtime_s
                ends_first = runtime is not None and (
                    r.estimated_start is None or snap.now + runtime <= r.estimated_start
                )
                preemptible = placed.preemptible and placed.priority < holder.priority
                assert ends_first or preemptible, f"{p.job_id} is on cards held for {r.job_id}"


@SETTINGS
@given(worlds())
def test_nobody_is_evicted_by_an_equal_or_lower_priority_job_except_through_reclaim(snap: Snapshot) -> None:
    """Priority preempts within a team, and across teams only borrowed work; reclaim takes only other teams'
    borrowed work; a move stops only preemptible work and holds its new place for it. Work within another team's
    guarantee is never evicted: what a team ends the cycle with (its running work less its victims, plus what
    the cycle placed for it) is at least its guarantee wherever another team took work from it."""
    decisions = run_cycle(snap, PROFILE)
    running = {j.id: j for j in snap.running}
    pending = {j.id: j for j in snap.pending}
    placed = {p.job_id for p in decisions.placements}
    homes = {r.job_id: r for r in decisions.reservations if r.job_id in running}
    charges = {j.id: charge_of(j.assignments) for j in snap.running}
    borrowed = borrowed_ids(snap.quotas, snap.running, charges)
    held: dict[str, list[int]] = {}
    for j in snap.running:
        row = held.setdefault(j.team, [0, 0])
        row[0] += charges[j.id][0]
        row[1] += charges[j.id][1]
    for p in decisions.placements:
        row = held.setdefault(pending[p.job_id].team, [0, 0])
        mem, comp = charge_of(p.assignments)
        row[0] += mem
        row[1] += comp
    taken: dict[str, list[int]] = {}
    for e in decisions.evictions:
        victim, preemptor = running[e.job_id], pending[e.preemptor_id]
        assert e.preemptor_id in placed
        assert e.grace_s == victim.grace_s
        if e.code == "moved":
            # It runs on elsewhere: its new place is held for it, and no guarantee loses it.
            assert victim.preemptible
            assert e.job_id in homes and e.to_nodes == tuple(
                sorted({a.node for a in homes[e.job_id].assignments})
            )
            continue
        if victim.team != preemptor.team:
            row = taken.setdefault(victim.team, [0, 0])
            row[0] += charges[victim.id][0]
            row[1] += charges[victim.id][1]
            if not victim.preemptible:
                assert victim.id in borrowed, f"never-preempted {victim.id} was within its guarantee"
        if e.code == "preempted":
            assert victim.preemptible
            assert NOW - victim.start_time >= MIN_RUNTIME_S
            assert victim.priority < preemptor.priority
        else:
            assert e.code == "reclaimed"
            assert victim.team != preemptor.team
    # What another team's work took from a team never takes it below its guarantee.
    for team, row in taken.items():
        assert keeps_guarantee(snap.quotas.get(team), held[team], row), f"team {team} lost guaranteed work"


def _usage(assignment_sets) -> tuple[int, int]:
    mem = comp = 0
    for assigns in assignment_sets:
        for a in assigns:
            mem += a.memory_mib
            comp += a.compute_milli
    return mem, comp


def _model_usage(snap: Snapshot, assignment_sets) -> dict[str, tuple[int, int]]:
    """(memory MiB, compute milli) held per GPU model, fractions exactly."""
    models = {(n.name, g.index): g.model for n in snap.nodes for g in n.gpus}
    out: dict[str, tuple[int, int]] = {}
    for assigns in assignment_sets:
        for a in assigns:
            model = models[(a.node, a.gpu_index)]
            mem, comp = out.get(model, (0, 0))
            out[model] = (mem + a.memory_mib, comp + a.compute_milli)
    return out


@SETTINGS
@given(worlds())
def test_no_team_goes_above_its_limit(snap: Snapshot) -> None:
    """Neither the all-models limit nor, on each model it was placed on this cycle, a per-model limit (a team
    may start a cycle above a limit; it must then get nothing more there)."""
    decisions = run_cycle(snap, PROFILE)
    evicted = {e.job_id for e in decisions.evictions}
    pending = {j.id: j for j in snap.pending}
    for team in {pending[p.job_id].team for p in decisions.placements}:
        q = snap.quotas.get(team)
        if q is None:
            continue
        held = [j.assignments for j in snap.running if j.team == team and j.id not in evicted]
        placed = [p.assignments for p in decisions.placements if pending[p.job_id].team == team]
        mem, comp = _usage(held + placed)
        assert q.limit_gpu_memory_mib is None or mem <= q.limit_gpu_memory_mib
        assert q.limit_compute_milli is None or comp <= q.limit_compute_milli
        per_model = _model_usage(snap, held + placed)
        for model in _model_usage(snap, placed):
            row = q.for_model(model)
            if row is None:
                continue
            mem, comp = per_model[model]
            assert row.limit_gpu_memory_mib is None or mem <= row.limit_gpu_memory_mib, (team, model)
            assert row.limit_compute_milli is None or comp <= row.limit_compute_milli, (team, model)


@SETTINGS
@given(worlds())
def test_per_model_rules_change_nothing_for_teams_without_per_model_rows(snap: Snapshot) -> None:
    plain = replace(
        snap, quotas=MappingProxyType({t: replace(q, per_model=()) for t, q in snap.quotas.items()})
    )
    without = profile(
        fields={"admit": ("quota",)}, timeslice_oversubscription=FACTOR, min_runtime_s=MIN_RUNTIME_S
    )
    assert run_cycle(plain, PROFILE) == run_cycle(plain, without)


@SETTINGS
@given(worlds())
def test_the_same_input_gives_the_same_output(snap: Snapshot) -> None:
    warm = run_cycle(snap, PROFILE)
    again = run_cycle(snap, PROFILE)
    cold = run_cycle(snap, profile(timeslice_oversubscription=FACTOR, min_runtime_s=MIN_RUNTIME_S))
    assert warm == again == cold


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(crowded=True), jobs("s", 25, crowded=True), st.booleans())
def test_caches_kept_between_cycles_never_change_a_decision(nodes, stream, dedupe) -> None:
    """A simulator-style run (one pending job per cycle, the placed node replaced in the next snapshot, or a
    varying node list) decides exactly what a cold engine decides on every snapshot."""
    from scheduling.engine.resources import allocate_on_node

    warm = profile("default", fields={"actions": ("allocate",), "admit": ()})
    current = list(nodes)
    for number, j in enumerate(stream):
        offered = tuple(current[number % 2 :] if dedupe else current)
        snap = Snapshot(now=NOW, nodes=offered, pending=(j,), seed=number)
        got = run_cycle(snap, warm)
        assert got == run_cycle(snap, replace(warm, name=f"cold-{number}"))
        for p in got.placements:
            names = {a.node for a in p.assignments} | set(p.cpu)
            for i, n in enumerate(current):
                if n.name in names:
                    cpu, mem = p.cpu.get(n.name, (0, 0))
                    current[i] = allocate_on_node(
                        n, tuple(a for a in p.assignments if a.node == n.name), cpu, mem
                    )


@SETTINGS
@given(worlds(), st.data())
def test_a_focus_gets_the_answers_the_whole_cycle_gives(snap: Snapshot, data) -> None:
    """A what-if asks about a few pending jobs: the cycle decides everything as it always does, and the pending
    list holds those jobs' entries exactly as the unfocused cycle gives them."""
    ids = [j.id for j in snap.pending]
    asked = frozenset(data.draw(st.lists(st.sampled_from(ids), max_size=3))) if ids else frozenset()
    whole = run_cycle(snap, PROFILE)
    focused = run_cycle(replace(snap, focus=asked), PROFILE)
    assert focused.placements == whole.placements
    assert focused.evictions == whole.evictions
    assert focused.reservations == whole.reservations
    expected = tuple(p for p in whole.pending if p.job_id in asked) if asked else whole.pending
    assert focused.pending == expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(), st.data())
def test_cycles_on_one_snapshot_with_other_queues_decide_as_a_cold_engine(snap: Snapshot, data) -> None:
    """What-ifs run many cycles on one snapshot's nodes and running jobs with other queues; what the engine keeps
    from the running jobs between them (where each holds what, when each ends) never changes a decision."""
    warm = profile(timeslice_oversubscription=FACTOR, min_runtime_s=MIN_RUNTIME_S)
    run_cycle(snap, warm)
    for number in range(3):
        kept = (
            data.draw(st.lists(st.sampled_from(snap.pending), unique_by=lambda j: j.id))
            if snap.pending
            else []
        )
        trial = replace(snap, pending=tuple(kept))
        cold = profile(timeslice_oversubscription=FACTOR, min_runtime_s=MIN_RUNTIME_S)
        assert run_cycle(trial, warm) == run_cycle(trial, replace(cold, name=f"cold-{number}"))


def test_a_cycle_leaves_the_collector_as_it_found_it() -> None:
    import gc

    snap = snapshot(nodes=[node("n1", gpus=2)], pending=[job("a", gpus=1)])
    assert gc.isenabled()
    run_cycle(snap, PROFILE)
    assert gc.isenabled()
    gc.disable()
    try:
        run_cycle(snap, PROFILE)
        assert not gc.isenabled()
    finally:
        gc.enable()
