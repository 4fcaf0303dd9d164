"""A cycle request sets the wanted flag and queues at most one task, in one Redis command that survives a
Redis that lost its scripts."""

import pytest
from django.conf import settings

from scheduling import tasks


@pytest.fixture
def redis_keys(monkeypatch):
    if not settings.REDIS_URL:
        pytest.skip("needs Redis: set REDIS_URL")
    r = tasks.redis_client()
    r.delete(*tasks.KEYS)
    queued = []
    monkeypatch.setattr(tasks.run_cycle_task, "apply_async", lambda **kw: queued.append(kw))
    yield r, queued
    r.delete(*tasks.KEYS)


def test_a_burst_of_requests_queues_one_task_and_leaves_the_flag_set(redis_keys):
    r, queued = redis_keys
    for _ in range(5):
        tasks.cycle_request()
    assert len(queued) == 1
    assert r.exists(tasks.KEY_WANTED)
    assert 0 < r.ttl(tasks.KEY_QUEUED) <= tasks.QUEUED_TTL_S
    r.delete(tasks.KEY_QUEUED)  # the task started: the next request queues another
    tasks.cycle_request()
    assert len(queued) == 2


def test_a_request_after_redis_forgot_its_scripts_still_counts(redis_keys):
    r, queued = redis_keys
    tasks.cycle_request()
    r.script_flush()
    r.delete(*tasks.KEYS)
    tasks.cycle_request()
    assert len(queued) == 2
    assert r.exists(tasks.KEY_WANTED)
