"""The cycle runs the profile's actions from the action registry, in the order the profile lists them; a
profile naming an unknown action, an action twice, or a plugin under an extension point it does not implement
fails when it is looked up, not mid-cycle."""

from __future__ import annotations

import pytest

from scheduling.engine import PROFILES, get_profile, register_profile, run_cycle
from scheduling.engine.actions import ACTIONS
from scheduling.engine.framework import Profile
from scheduling.engine.hooks import PluginError
from scheduling.engine.plugins import register
from scheduling.engine.profiles import KNOWN_ACTIONS, check_profile
from tests.engine.builders import job, node, profile, running, snapshot

NOW = 10_000.0


def test_the_known_actions_are_the_registry_s() -> None:
    assert (
        set(ACTIONS)
        == KNOWN_ACTIONS
        == {"admit", "allocate", "backfill", "consolidate", "reclaim", "share", "preempt"}
    )
    for name, cls in ACTIONS.items():
        assert cls.NAME == name


def test_an_unknown_action_is_refused_naming_the_known_ones() -> None:
    register_profile(Profile(name="test-unknown-action", actions=("admit", "allocate", "evict-everything")))
    try:
        with pytest.raises(
            KeyError, match=r"unknown actions: evict-everything; known: admit, allocate, backfill"
        ):
            get_profile("test-unknown-action")
    finally:
        PROFILES.pop("test-unknown-action")


def test_an_action_listed_twice_is_refused() -> None:
    with pytest.raises(KeyError, match="more than once: allocate"):
        check_profile(Profile(name="test-twice", actions=("allocate", "preempt", "allocate")))


def test_a_plugin_under_an_extension_point_it_does_not_implement_is_refused() -> None:
    # binpack scores nodes and cards; it has no filter.
    with pytest.raises(PluginError, match=r"names plugin 'binpack' under filters.*no filter\(\)"):
        check_profile(Profile(name="test-misplaced", filters=("fits", "binpack")))
    with pytest.raises(PluginError, match=r"'quota' under node_scores.*NodeScorePlugin"):
        check_profile(Profile(name="test-misplaced", node_scores=(("quota", 1.0),)))


def test_a_registered_test_plugin_named_at_the_wrong_point_fails_in_get_profile() -> None:
    class _OnlySorts:
        NAME = "test-only-sorts"

        def sort_key(self, ctx, job):
            return ()

    register(_OnlySorts)
    register_profile(Profile(name="test-only-sorts-as-admit", admit=("test-only-sorts",)))
    try:
        with pytest.raises(PluginError, match="does not implement AdmitPlugin"):
            get_profile("test-only-sorts-as-admit")
    finally:
        PROFILES.pop("test-only-sorts-as-admit")


def _blocked_high_priority_job():
    nodes = [node("a", gpus=1)]
    low = running(job("low", gpus=1, priority=1), {"a": [0]}, nodes=nodes, start=0.0)
    return snapshot(nodes, pending=[job("high", gpus=1, priority=10)], running_jobs=[low], now=NOW)


def test_actions_run_in_the_order_the_profile_lists_them() -> None:
    snap = _blocked_high_priority_job()
    # Allocate first: the job is blocked at its turn, and preempt then evicts for it.
    after = run_cycle(snap, profile(fields={"actions": ("admit", "allocate", "preempt")}))
    assert [(e.job_id, e.preemptor_id) for e in after.evictions] == [("low", "high")]
    assert [p.job_id for p in after.placements] == ["high"]
    # Preempt first: nothing is blocked yet when it runs, so nothing is evicted; allocate then finds no room.
    before = run_cycle(snap, profile(fields={"actions": ("admit", "preempt", "allocate")}))
    assert not before.evictions and not before.placements
    assert before.pending[0].status.code == "insufficient-gpus"


def test_each_action_prepares_before_any_executes_and_executes_in_profile_order(monkeypatch) -> None:
    calls: list[str] = []

    def spy(cls):
        class Spy(cls):
            def prepare(self, session):
                calls.append(f"prepare {self.NAME}")
                super().prepare(session)

            def execute(self, session):
                calls.append(f"execute {self.NAME}")
                super().execute(session)

        return Spy

    for name, cls in list(ACTIONS.items()):
        monkeypatch.setitem(ACTIONS, name, spy(cls))
    order = ("admit", "backfill", "allocate", "preempt")
    run_cycle(_blocked_high_priority_job(), profile(fields={"actions": order}))
    assert calls == [f"prepare {n}" for n in order] + [f"execute {n}" for n in order]


def test_backfill_listed_before_allocate_still_makes_allocate_reserve() -> None:
    nodes = [node("a", gpus=2)]
    busy = running(job("r", gpus=1, max_runtime_s=600.0), {"a": [0]}, nodes=nodes, start=NOW - 60)
    snap = snapshot(nodes, pending=[job("big", gpus=2, priority=5)], running_jobs=[busy], now=NOW)
    listed_after = run_cycle(snap, profile(fields={"actions": ("admit", "allocate", "backfill")}))
    listed_before = run_cycle(snap, profile(fields={"actions": ("admit", "backfill", "allocate")}))
    assert [r.job_id for r in listed_after.reservations] == ["big"]
    assert listed_before == listed_after
    without = run_cycle(snap, profile(fields={"actions": ("admit", "allocate")}))
    assert not without.reservations
