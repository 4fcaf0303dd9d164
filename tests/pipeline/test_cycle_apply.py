"""The cycle's two crossings with the database: the snapshot it reads and the decisions it writes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from scheduling import coordination
from scheduling.choices import JobState, NodeState
from scheduling.cycle import apply, lease, runner, snapshot, watchdog
from scheduling.cycle.desired_state import desired_state_for_node
from scheduling.cycle.watchdog import lost_jobs_check, nodes_check
from scheduling.engine import types as eng
from scheduling.inventory.models import Gpu, Node
from scheduling.jobs import usage
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job, Slice
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_cancel

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


def submit(user, team, **spec):
    spec.setdefault("command", "echo hi")
    spec.setdefault("name", "job")
    return job_submit(submitter=user, team=team, spec=JobSpec(**spec))


def overcommitted_in_sql() -> int:
    """GPUs whose slices add up to more than the card: counted by the database, not by the ledger columns."""
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT count(*) FROM (
              SELECT g.id FROM scheduling_gpu g JOIN scheduling_slice s ON s.gpu_id = g.id
              GROUP BY g.id, g.memory_mib, g.compute_capacity_pct
              HAVING sum(s.memory_mib) > g.memory_mib OR sum(s.compute_pct) > g.compute_capacity_pct
            ) over
            """
        )
        return cur.fetchone()[0]


def test_the_snapshot_speaks_engine_units(node, alice, teams):
    sliced = submit(alice, teams["training"], gpu_memory_mib=8192, compute_pct=25)
    snap = snapshot.snapshot_from_db()
    (n,) = snap.nodes
    assert n.name == "a100-01" and len(n.gpus) == 8
    assert (0, 1) in n.nvlink
    assert n.gpus[6].sharing is eng.Sharing.MPS
    (job,) = snap.pending
    assert job.id == str(sliced.pk)
    assert job.request.gpu_compute_milli == 250 and job.request.gpu_memory_mib == 8192
    assert snap.quotas["ai-lab/training"].guaranteed_compute_milli == 4000


def test_a_cycle_places_a_pending_job_and_the_ledger_holds_it(node, alice, teams):
    job = submit(alice, teams["training"], gpus=2)
    report = runner.cycle_run_once()
    job.refresh_from_db()
    assert report.placed == 1
    assert job.state == JobState.PLACED and job.attempt == 1
    assert Slice.objects.filter(job=job).count() == 2
    assert sum(Gpu.objects.values_list("allocated_compute_pct", flat=True)) == 200
    placed = job.events.get(to_state=JobState.PLACED)
    assert placed.data["nodes"] == ["a100-01"] and placed.data["epoch"] == report.epoch


def test_it_refuses_a_stale_epoch_whole(node, alice, teams):
    job = submit(alice, teams["training"], gpus=1)
    old = lease.epoch_issue()
    decisions = eng.Decisions(
        placements=(
            eng.Placement(job_id=str(job.pk), assignments=(eng.Assignment("a100-01", 0, 81920, 1000),)),
        )
    )
    lease.epoch_issue()  # a newer cycle started: the older one may no longer write
    with pytest.raises(lease.StaleEpoch):
        apply.apply_decisions(decisions=decisions, epoch=old)
    job.refresh_from_db()
    assert job.state == JobState.PENDING and not Slice.objects.exists()


def test_an_epoch_applies_only_once(node, alice, teams):
    job = submit(alice, teams["training"], gpus=1)
    epoch = lease.epoch_issue()
    apply.apply_decisions(decisions=eng.Decisions(), epoch=epoch)
    with pytest.raises(lease.StaleEpoch):
        apply.apply_decisions(
            decisions=eng.Decisions(
                placements=(eng.Placement(str(job.pk), (eng.Assignment("a100-01", 0, 81920, 1000),)),)
            ),
            epoch=epoch,
        )


def test_a_placement_the_ledger_refuses_leaves_the_job_pending_with_a_reason(node, alice, teams):
    first = submit(alice, teams["training"], gpus=1)
    second = submit(alice, teams["training"], gpus=1)
    same_gpu = (eng.Assignment("a100-01", 3, 81920, 1000),)
    decisions = eng.Decisions(
        placements=(eng.Placement(str(first.pk), same_gpu), eng.Placement(str(second.pk), same_gpu))
    )
    result = apply.apply_decisions(decisions=decisions, epoch=lease.epoch_issue())
    assert result.placed == [first.pk] and second.pk in result.conflicts
    second.refresh_from_db()
    assert second.state == JobState.PENDING and second.pending_reason_code == "conflict"
    assert overcommitted_in_sql() == 0
    assert not second.events.filter(to_state=JobState.PLACED).exists()


def test_an_eviction_preempts_with_its_grace_recorded_and_frees_the_gpus(node, alice, teams):
    victim = submit(alice, teams["training"], gpus=8)
    runner.cycle_run_once()
    victim.refresh_from_db()
    decisions = eng.Decisions(evictions=(eng.Eviction(str(victim.pk), "999", "preempted", 30.0),))
    apply.apply_decisions(decisions=decisions, epoch=lease.epoch_issue())
    victim.refresh_from_db()
    assert victim.state == JobState.PREEMPTED
    event = victim.events.get(to_state=JobState.PREEMPTED)
    assert event.data["grace_s"] == 30.0 and event.data["preemptor"] == "999"
    assert not Slice.objects.filter(job=victim).exists()
    assert sum(Gpu.objects.values_list("allocated_memory_mib", flat=True)) == 0


def test_the_desired_version_moves_only_when_the_content_does(node, alice, teams):
    state0, moved0 = desired_state_for_node(node=node)
    again, moved_again = desired_state_for_node(node=node)
    assert not moved_again and again.version == state0.version
    job = submit(alice, teams["training"], gpus=1, env={"A": "1"})
    runner.cycle_run_once()
    state1, moved1 = desired_state_for_node(node=node)
    assert moved1 and state1.version == state0.version + 1
    (entry,) = state1.jobs
    assert entry["job_id"] == str(job.pk) and entry["attempt"] == 1 and entry["env"]["A"] == "1"
    assert entry["gpus"][0]["sharing"] == "exclusive" and entry["gpus"][0]["memory_mib"] is None
    job_cancel(job=job, actor=alice)
    state2, moved2 = desired_state_for_node(node=node)
    assert moved2 and state2.version == state1.version + 1 and state2.jobs == ()


def _watched_since(start, until, step_s: float = 10.0) -> None:
    """The watchdog ran every step_s from start to just before until (and found everyone alive)."""
    at = start
    while at < until:
        watchdog.watch_resumed_at(now=at)
        at += timedelta(seconds=step_s)


def test_a_watchdog_resuming_after_a_long_pause_gives_every_node_a_full_grace_period(
    node, alice, teams, settings, fresh_watch
):
    settings.TESSERA_NODE_LOST_AFTER_S = 30
    job = submit(alice, teams["training"], gpus=1)
    runner.cycle_run_once()
    now = timezone.now()
    _watched_since(now - timedelta(seconds=300), now - timedelta(seconds=200))
    # Paused (or Redis down) for 200 s; the agents could not report meanwhile.
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=now - timedelta(seconds=200))
    assert nodes_check(now=now) == {}
    assert nodes_check(now=now + timedelta(seconds=20)) == {}
    # Still silent a full timeout after the watchdog resumed: lost.
    assert nodes_check(now=now + timedelta(seconds=31)) == {"a100-01": [job.pk]}


def test_a_silent_node_is_lost_after_the_timeout_and_its_jobs_requeued_only_once_surely_stopped(
    node, alice, teams, settings, fresh_watch
):
    settings.TESSERA_NODE_LOST_AFTER_S = 30
    settings.TESSERA_AGENT_FENCE_AFTER_S = 600
    settings.TESSERA_FENCE_MARGIN_S = 30
    job = submit(alice, teams["training"], gpus=1)
    runner.cycle_run_once()
    grace_s = job.priority_class.preemption_grace_s
    now = timezone.now()
    _watched_since(now - timedelta(seconds=60), now)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=now - timedelta(seconds=29))
    assert nodes_check(now=now) == {}
    heard = now - timedelta(seconds=31)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=heard)
    assert nodes_check(now=now) == {"a100-01": [job.pk]}
    node.refresh_from_db()
    assert node.state == NodeState.LOST
    # Lost: nothing more goes there, but its job may still run (its supervisor stops it at the fence).
    surely_stopped = heard + timedelta(seconds=600 + grace_s + 30)
    assert lost_jobs_check(now=surely_stopped - timedelta(seconds=1)) == []
    job.refresh_from_db()
    assert job.state == JobState.PLACED and Slice.objects.filter(job=job).exists()
    assert lost_jobs_check(now=surely_stopped) == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.PENDING and not Slice.objects.filter(job=job).exists()
    assert list(job.events.values_list("to_state", flat=True))[-2:] == [JobState.LOST, JobState.PENDING]
    assert Job.objects.get(pk=job.pk).submitted_at == job.submitted_at


def test_a_lost_node_that_comes_back_before_its_fence_keeps_its_jobs(
    node, alice, teams, settings, fresh_watch
):
    from scheduling.agents.reports.heartbeats import node_heartbeat

    settings.TESSERA_NODE_LOST_AFTER_S = 30
    job = submit(alice, teams["training"], gpus=1)
    runner.cycle_run_once()
    now = timezone.now()
    _watched_since(now - timedelta(seconds=60), now)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=now - timedelta(seconds=120))
    assert nodes_check(now=now) == {"a100-01": [job.pk]}
    node_heartbeat(node_id=node.pk)  # a network blip, a web outage: it speaks again
    node.refresh_from_db()
    assert node.state == NodeState.READY
    assert lost_jobs_check(now=now + timedelta(days=1)) == []
    job.refresh_from_db()
    assert job.state == JobState.PLACED and job.attempt == 1


def test_a_job_cancelled_on_a_silent_node_keeps_its_cards_until_it_has_surely_stopped_there(
    node, alice, teams, settings, fresh_watch
):
    settings.TESSERA_NODE_LOST_AFTER_S = 30
    settings.TESSERA_AGENT_FENCE_AFTER_S = 600
    settings.TESSERA_FENCE_MARGIN_S = 30
    job = submit(alice, teams["training"], gpus=1)
    runner.cycle_run_once()
    now = timezone.now()
    heard = now - timedelta(seconds=31)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=heard)
    job_cancel(job=job, actor=alice)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    # It may still run there: its card is taken ("releasing") while the node is silent, however long.
    assert Slice.objects.filter(job=job).count() == 1
    assert Gpu.objects.filter(node=node, allocated_memory_mib__gt=0).count() == 1
    surely_stopped = heard + timedelta(seconds=600 + job.priority_class.preemption_grace_s + 30)
    assert watchdog.releasing_check(now=surely_stopped - timedelta(seconds=1)) == []
    assert watchdog.releasing_check(now=surely_stopped) == [job.pk]
    assert not Slice.objects.filter(job=job).exists()
    assert not Gpu.objects.filter(node=node, allocated_memory_mib__gt=0).exists()
    assert "its fence has passed" in job.events.get(code="gpus_released").message


def test_a_job_cancelled_on_a_heard_node_frees_its_cards_at_once(node, alice, teams):
    job = submit(alice, teams["training"], gpus=1)
    runner.cycle_run_once()
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now())
    job_cancel(job=job, actor=alice)
    assert not Slice.objects.filter(job=job).exists()
    assert watchdog.releasing_check() == []


def test_requeues_are_bounded(node, alice, teams, settings, fresh_watch):
    settings.TESSERA_MAX_REQUEUES = 1
    settings.TESSERA_NODE_LOST_AFTER_S = 30
    job = submit(alice, teams["training"], gpus=1)
    _watched_since(timezone.now() - timedelta(seconds=60), timezone.now())
    for _ in range(2):
        Node.objects.filter(pk=node.pk).update(state=NodeState.READY, last_heartbeat_at=timezone.now())
        runner.cycle_run_once()
        Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=60))
        nodes_check()
        lost_jobs_check(now=timezone.now() + timedelta(days=1))
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.attempt == 2
    assert job.events.last().code == "too_many_requeues"


@pytest.mark.django_db(transaction=True)
def test_a_submit_commits_while_redis_is_down_and_the_cycle_request_is_only_logged(
    node, alice, teams, settings, caplog
):

    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # nothing listens there
    job = submit(alice, teams["training"], gpus=1)
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING
    assert "could not request a scheduling cycle" in caplog.text
    coordination._redis_for.cache_clear()


def test_fair_share_usage_decays_with_the_half_life_and_sql_agrees_with_python(node, alice, bob, teams):
    from django.utils import timezone

    now = timezone.now()
    hour = timedelta(hours=1)
    for who, team, started, finished, gpus in [
        (alice, "training", now - 3 * hour, now - 2 * hour, 2),  # finished, two GPUs for an hour
        (alice, "training", now - 720 * hour, now - 719 * hour, 1),  # a month ago: mostly decayed
        (bob, "inference", now - hour, None, 1),  # still running
    ]:
        job = submit(who, teams[team], gpus=gpus)
        Job.objects.filter(pk=job.pk).update(started_at=started, finished_at=finished)
    half_life_s = 7 * 24 * 3600.0
    summed = usage.decayed_usage(now_s=now.timestamp(), half_life_s=half_life_s)  # in SQL on PostgreSQL
    in_python = usage._decayed_usage_python(now_s=now.timestamp(), half_life_s=half_life_s)
    assert summed.keys() == in_python.keys() == {"ai-lab/training", "ai-lab/inference"}
    for team, value in in_python.items():
        assert summed[team] == pytest.approx(value, rel=1e-9)
    # An hour on one GPU, barely decayed, is about 3.6 million milli-GPU-seconds.
    assert in_python["ai-lab/inference"] == pytest.approx(3_600_000, rel=0.01)
    # Two GPUs for an hour two hours ago, plus a month-old hour that counts for about 5 % of its face value.
    month_old = 3_600_000 * 0.5 ** (30 * 24 * 3600 / half_life_s)
    assert in_python["ai-lab/training"] == pytest.approx(7_200_000 + month_old, rel=0.01)


def test_fair_share_charges_a_memory_only_slice_its_memory_share_in_python_and_sql(node, alice, bob, teams):
    from django.utils import timezone

    now = timezone.now()
    # 10 GiB of an 80 GiB MPS card, no compute named: it holds 125 milli-GPU, like the engine charges it.
    memory_only = submit(alice, teams["training"], gpu_memory_mib=10240)
    # Both named: the larger share counts (20 GiB = 250 milli against 10 % = 100 milli).
    both = submit(bob, teams["inference"], gpu_memory_mib=20480, compute_pct=10)
    for job, gpu_index in ((memory_only, 6), (both, 7)):
        assignment = eng.Assignment("a100-01", gpu_index, job.gpu_memory_mib, 125)
        placement = eng.Placement(str(job.pk), (assignment,))
        apply.apply_decisions(decisions=eng.Decisions(placements=(placement,)), epoch=lease.epoch_issue())
        Job.objects.filter(pk=job.pk).update(started_at=now - timedelta(hours=1), finished_at=now)
    half_life_s = 7 * 24 * 3600.0
    summed = usage.decayed_usage(now_s=now.timestamp(), half_life_s=half_life_s)  # in SQL on PostgreSQL
    in_python = usage._decayed_usage_python(now_s=now.timestamp(), half_life_s=half_life_s)
    assert in_python["ai-lab/training"] == pytest.approx(125 * 3600, rel=0.01)
    assert in_python["ai-lab/inference"] == pytest.approx(250 * 3600, rel=0.01)
    for team, value in in_python.items():
        assert summed[team] == pytest.approx(value, rel=1e-9)


def test_a_jobs_working_directory_reaches_its_nodes_desired_state(node, alice, teams):
    job = submit(alice, teams["training"], gpus=1, workdir="/data/run1")
    runner.cycle_run_once()
    state, _ = desired_state_for_node(node=node)
    (entry,) = [e for e in state.jobs if e["job_id"] == str(job.pk)]
    assert entry["cwd"] == "/data/run1"


def test_reclaim_says_whom_it_waits_for_and_labels_follow_the_teams_standing(
    node, alice, teams, django_user_model
):
    """Another team fills the node on borrowed capacity; a team below its guarantee takes two cards back, and its
    placement names the mechanism. Labels follow the teams' standing as it changes."""
    from quotas.services import membership_set, team_create

    guest = team_create(slug="guest", display_name="Guest")  # no quota: all it holds is borrowed
    dave = django_user_model.objects.create_user(username="dave", password="dave-pw")
    membership_set(user=dave, team=guest)
    lent = [submit(dave, guest, gpus=1, priority="inference") for _ in range(8)]
    runner.cycle_run_once()
    assert set(Job.objects.filter(pk__in=[j.pk for j in lent]).values_list("state", "borrowed")) == {
        (JobState.PLACED, True)
    }
    Job.objects.filter(pk__in=[j.pk for j in lent]).update(
        started_at=timezone.now() - timedelta(hours=1), state=JobState.RUNNING
    )

    mine = submit(alice, teams["training"], gpus=2)  # within training's 4-GPU guarantee
    report = runner.cycle_run_once()
    mine.refresh_from_db()
    assert report.placed == 1 and mine.state == JobState.PLACED and not mine.borrowed
    reclaimed = Job.objects.filter(pk__in=[j.pk for j in lent], state=JobState.PREEMPTED)
    assert reclaimed.count() == 2
    grace_s = reclaimed.first().priority_class.preemption_grace_s
    placed = mine.events.get(to_state=JobState.PLACED).message
    assert "(within its team's guarantee)" in placed
    assert (
        f"waiting for 2 GPUs to be reclaimed from team guest; their grace ends in about {grace_s} s" in placed
    )
    assert reclaimed.first().events.get(to_state=JobState.PREEMPTED).code == "reclaimed"


def test_the_borrowed_label_moves_to_the_work_that_fills_the_guarantee_when_a_job_ends(node, alice, teams):
    """Training is guaranteed 4 GPUs: of three 2-GPU jobs the third borrows; once the first ends, it does not."""
    first, second, third = (submit(alice, teams["training"], gpus=2, name=f"j{i}") for i in range(3))
    runner.cycle_run_once()
    labels = dict(Job.objects.filter(pk__in=[first.pk, second.pk, third.pk]).values_list("pk", "borrowed"))
    assert labels == {first.pk: False, second.pk: False, third.pk: True}
    job_cancel(job=first, actor=alice)
    runner.cycle_run_once()
    third.refresh_from_db()
    assert not third.borrowed


def ledger_matches_slices() -> bool:
    """Each GPU's ledger columns equal the sum of the slices it holds."""
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT count(*) FROM scheduling_gpu g LEFT JOIN (
              SELECT gpu_id, sum(memory_mib) m, sum(compute_pct) c FROM scheduling_slice GROUP BY gpu_id
            ) s ON s.gpu_id = g.id
            WHERE g.allocated_memory_mib <> coalesce(s.m, 0) OR g.allocated_compute_pct <> coalesce(s.c, 0)
            """
        )
        return cur.fetchone()[0] == 0


@pytest.mark.postgresql_only("set-based writes; SQLite, in process, takes a statement per row")
def test_a_cycle_writes_its_placements_in_a_number_of_statements_that_does_not_grow_with_them(
    node, alice, teams
):
    from django.test.utils import CaptureQueriesContext

    def placed_with(jobs: list[Job]) -> int:
        decisions = runner.run_cycle(snapshot.snapshot_from_db(), snapshot.cycle_profile())
        assert len(decisions.placements) == len(jobs)
        with CaptureQueriesContext(connection) as queries:
            result = apply.apply_decisions(decisions=decisions, epoch=lease.epoch_issue())
        assert sorted(result.placed) == sorted(j.pk for j in jobs) and not result.conflicts
        return len(queries)

    few = [submit(alice, teams["training"], gpus=1)]
    few_queries = placed_with(few)
    many = [submit(alice, teams["training"], gpus=1) for _ in range(3)]
    many += [submit(alice, teams["training"], gpu_memory_mib=8192, compute_pct=25) for _ in range(4)]
    many_queries = placed_with(many)
    assert many_queries <= few_queries + 2, (few_queries, many_queries)

    assert ledger_matches_slices() and overcommitted_in_sql() == 0
    for job in few + many:
        job.refresh_from_db()
        assert job.state == JobState.PLACED and job.attempt == 1 and job.placed_at is not None
        assert job.queue_position is None and job.pending_reason_code == ""
        (event,) = job.events.filter(to_state=JobState.PLACED)
        assert event.from_state == JobState.PENDING and event.code == "placed"
        assert event.message.startswith("Placed on a100-01/gpu")
        held = list(job.slices.values_list("gpu__index", "memory_mib", "compute_pct"))
        assert [[g, m, c] for g, m, c in held] == [[a[1], a[2], a[3] // 10] for a in event.data["gpus"]]
    # The sliced jobs share the MPS cards; the node's agent hears of it once the write commits.
    assert Slice.objects.filter(compute_pct=25).count() == 4
    state, _ = desired_state_for_node(node=node)
    assert {j["job_id"] for j in state.jobs} == {str(j.pk) for j in few + many}


def test_an_estimated_start_that_only_drifts_with_the_clock_is_not_rewritten_each_cycle(node, alice, teams):
    import time as clock

    job = submit(alice, teams["training"], gpus=1)
    status = eng.Status("insufficient-gpus", "needs 1 free GPU; estimated start in about 1.0 h")

    def cycle(eta_s: float) -> int:
        pending = (eng.Pending(str(job.pk), status, position=1, estimated_start=eta_s),)
        return apply.apply_decisions(
            decisions=eng.Decisions(pending=pending), epoch=lease.epoch_issue()
        ).pending_updated

    start = clock.time() + 3600
    assert cycle(start) == 1
    job.refresh_from_db()
    written = job.estimated_start_at
    # The next cycles, the clock a little further: the same hour-away start, seconds apart, is the same answer.
    assert cycle(start + 5) == 0 and cycle(start + 40) == 0
    job.refresh_from_db()
    assert job.estimated_start_at == written
    # Moving by more than a tenth of the wait ahead (and a minute) is news: written.
    assert cycle(start + 900) == 1
    job.refresh_from_db()
    assert abs((job.estimated_start_at - written).total_seconds() - 900) < 1
