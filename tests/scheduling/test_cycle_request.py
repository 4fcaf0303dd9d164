"""A cycle request sets the wanted flag and queues at most one task, in one Redis command that survives a
Redis that lost its scripts; the cycle lock is kept alive by its holder and freed within a TTL without it."""

import pytest
from django.conf import settings

from scheduling import coordination, tasks
from scheduling.cycle import requests
from tests.support import TIMEOUT_SCALE, wait_for


@pytest.fixture
def redis_keys(monkeypatch):
    if not settings.REDIS_URL:
        pytest.skip("needs Redis: set REDIS_URL")
    r = coordination.redis_client()
    r.delete(*requests.KEYS)
    queued = []
    monkeypatch.setattr(tasks.run_cycle_task, "apply_async", lambda **kw: queued.append(kw))
    yield r, queued
    r.delete(*requests.KEYS)


def _renewals(lock) -> list[bool]:
    """Watch the keeper renew `lock`: one entry per renewal that found it still ours (the others raise)."""
    extend = lock.extend
    seen: list[bool] = []

    def counted(*args, **kwargs):
        seen.append(extend(*args, **kwargs))
        return seen[-1]

    lock.extend = counted
    return seen


def _lapsed(r) -> bool:
    return not r.exists(requests.KEY_LOCK)


def test_a_burst_of_requests_queues_one_task_and_leaves_the_flag_set(redis_keys):
    r, queued = redis_keys
    for _ in range(5):
        requests.cycle_request()
    assert len(queued) == 1
    assert r.exists(requests.KEY_WANTED)
    assert 0 < r.ttl(requests.KEY_QUEUED) <= requests.QUEUED_TTL_S
    r.delete(requests.KEY_QUEUED)  # the task started: the next request queues another
    requests.cycle_request()
    assert len(queued) == 2


def test_a_request_after_redis_forgot_its_scripts_still_counts(redis_keys):
    r, queued = redis_keys
    requests.cycle_request()
    r.script_flush()
    r.delete(*requests.KEYS)
    requests.cycle_request()
    assert len(queued) == 2
    assert r.exists(requests.KEY_WANTED)


def test_the_holder_keeps_the_cycle_lock_alive_past_its_ttl_and_a_dead_one_frees_it_within_one_ttl(
    redis_keys, settings
):
    r, _ = redis_keys
    # Renewed every third of a TTL: a TTL long enough that a loaded machine's late wake-up still renews in time.
    settings.TESSERA_CYCLE_LOCK_TTL_S = 1.5
    lock = requests.lock_acquire(r, holder="alive")
    assert lock is not None and requests.lock_acquire(r, holder="other") is None
    renewed = _renewals(lock)
    with requests.LockKeeper(lock, holder="alive") as keeper:
        # Four renewals, a third of a TTL apart: the lock has outlived its first TTL.
        wait_for("four renewals of the cycle lock", lambda: len(renewed) >= 4, timeout_s=10)
        assert r.get(requests.KEY_LOCK) == b"alive" and not keeper.lost.is_set()
    # The holder stopped renewing (as a killed one does): the lock lapses within one TTL.
    assert r.pttl(requests.KEY_LOCK) <= requests.lock_ttl_ms()  # no more than one TTL left
    wait_for("the unrenewed cycle lock to lapse", lambda: _lapsed(r), timeout_s=5)


def test_a_holder_stuck_in_one_cycle_lets_its_lock_lapse_after_the_cycle_limit(redis_keys, settings):
    r, _ = redis_keys
    settings.TESSERA_CYCLE_LOCK_TTL_S = 1.5
    settings.TESSERA_CYCLE_MAX_S = 2.0
    lock = requests.lock_acquire(r, holder="busy")
    assert lock is not None and requests.lock_acquire(r, holder="other") is None
    renewed = _renewals(lock)
    with requests.LockKeeper(lock, holder="busy") as keeper:
        # A cycle finishes after each renewal: five renewals (2.5 s) take the holder past the 2 s limit, renewed.
        for n in range(1, 6):
            wait_for(f"renewal {n} of the cycle lock", lambda n=n: len(renewed) >= n, timeout_s=10)
            keeper.progress()
        assert r.get(requests.KEY_LOCK) == b"busy" and not keeper.lost.is_set()
        # Then one that never finishes: no more renewals once it has run past the limit.
        assert keeper.lost.wait(10 * TIMEOUT_SCALE)
        assert r.pttl(requests.KEY_LOCK) <= requests.lock_ttl_ms()
        # Another worker may take it.
        wait_for("the stuck holder's lock to lapse", lambda: _lapsed(r), timeout_s=5)


def test_a_holder_whose_lock_was_taken_meanwhile_knows_it_lost_it(redis_keys, settings):
    r, _ = redis_keys
    settings.TESSERA_CYCLE_LOCK_TTL_S = 0.6
    lock = requests.lock_acquire(r, holder="stalled")
    assert lock is not None and requests.lock_acquire(r, holder="other") is None
    with requests.LockKeeper(lock, holder="stalled") as keeper:
        r.set(requests.KEY_LOCK, "another", px=5000)  # it expired under a stalled holder and was taken
        assert keeper.lost.wait(2.0 * TIMEOUT_SCALE)
    requests.lock_release(lock)  # as the runner does on its way out
    assert r.get(requests.KEY_LOCK) == b"another"  # never renewed, nor released, by the one that lost it


def test_tasks_finding_the_lock_busy_queue_one_retry_for_when_it_would_expire(redis_keys):
    from scheduling.cycle import runner

    r, queued = redis_keys
    r.set(requests.KEY_LOCK, "someone", px=5000)
    for _ in range(3):
        assert runner.cycles_run_locked() == {"ran": 0, "busy": True}
    assert len(queued) == 1
    # Its countdown is what the lock had left when asked (more than it has now) and a tenth of a second.
    assert r.pttl(requests.KEY_LOCK) / 1000 < queued[0]["countdown"] <= 5.1
