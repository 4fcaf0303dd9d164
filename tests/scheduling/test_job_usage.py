"""Per-job usage from the agents' samples: utilisation now, the idle warning, peak memory on whole cards."""

from __future__ import annotations

import time

import pytest

from scheduling.agents import live_metrics
from scheduling.coordination import redis_client


@pytest.fixture
def job_id():
    number = 987_654_321
    r = redis_client()
    if r is not None:
        r.delete(live_metrics.job_usage_key(number))
    live_metrics._local_usage.pop(number, None)
    yield number
    if r is not None:
        r.delete(live_metrics.job_usage_key(number))


def _gpu(util: float, used_mib: int) -> dict:
    return {"index": 0, "uuid": "GPU-x", "util_pct": util, "memory_used_mib": used_mib}


def test_a_job_under_5_percent_for_10_minutes_is_flagged_idle_and_a_busy_sample_clears_it(job_id):
    now = time.time()
    live_metrics._usage_note(job_id, now - live_metrics.IDLE_WARN_AFTER_S - 30, [_gpu(1.0, 1200)], True)
    live_metrics._usage_note(job_id, now - 1, [_gpu(2.0, 1190)], True)  # memory unchanged, give or take
    usage = live_metrics.job_usage(job_ids=[job_id])[job_id]
    assert usage["idle_warning"] and usage["idle_s"] >= live_metrics.IDLE_WARN_AFTER_S
    assert usage["util_pct"] == 2.0 and usage["fresh"]
    live_metrics._usage_note(job_id, now, [_gpu(80.0, 900)], True)
    usage = live_metrics.job_usage(job_ids=[job_id])[job_id]
    assert not usage["idle_warning"] and usage["idle_s"] == 0.0
    assert usage["peak_memory_mib"] == 1200  # the highest seen, not the last
    # Under 5% but its memory moving (loading data): not idle.
    live_metrics._usage_note(job_id, now + 1, [_gpu(1.0, 900)], True)
    live_metrics._usage_note(job_id, now + 2, [_gpu(1.0, 4000)], True)
    assert live_metrics.job_usage(job_ids=[job_id])[job_id]["idle_s"] == 0.0


def test_memory_on_a_shared_card_is_not_taken_as_the_jobs_own(job_id):
    live_metrics._usage_note(job_id, time.time(), [_gpu(50.0, 40_000)], False)
    assert live_metrics.job_usage(job_ids=[job_id])[job_id]["peak_memory_mib"] is None


def test_a_job_with_no_samples_has_no_usage(job_id):
    assert live_metrics.job_usage(job_ids=[job_id]) == {}
