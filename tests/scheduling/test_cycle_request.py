"""A cycle request sets the wanted flag and queues at most one task, in one Redis command that survives a
Redis that lost its scripts."""

import pytest
from django.conf import settings

from scheduling import coordination, tasks
from scheduling.cycle import requests


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
