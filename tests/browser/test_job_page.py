"""A job page as it changes under its reader: the "why others go first" card goes once the job waits no more, and
the time bar's running phase counts on without a reload."""

from __future__ import annotations

import pytest

from scheduling.choices import JobState
from scheduling.jobs.transitions import job_cancel
from tests.browser.test_portal import _expect_text
from tests.pipeline.harness import submit, wait_state

pytestmark = pytest.mark.slow


@pytest.mark.timeout(150, func_only=True)  # about 20 s
def test_a_job_that_starts_loses_its_waiting_card_and_its_running_phase_counts_on(browse):
    # Every A100 of the cluster taken, so a third whole-card job waits.
    blockers = [submit(browse.cluster, name=f"blocker-{i}", command="sleep 300", gpus=2) for i in range(2)]
    for blocker in blockers:
        wait_state(blocker, JobState.RUNNING)
    waiting = submit(browse.cluster, name="waits-then-runs", command="sleep 300", gpus=1)
    page = browse("alice")
    page.goto(f"/jobs/{waiting.pk}/")
    _expect_text(page, "#live", "live")
    page.evaluate("window.__noReload = true")
    _expect_text(page, "#ahead", "Why other teams' jobs go first")
    assert page.is_visible("#ahead")
    browse.shots(page, "waiting")

    job_cancel(job=blockers[0], actor=browse.cluster.people["alice"])
    _expect_text(page, "#job-state", "Running", timeout_s=40)
    page.wait_for_function(
        "() => !document.querySelector('#ahead') || !document.querySelector('#ahead').checkVisibility()"
    )
    assert "no longer waiting" not in page.inner_text("body")
    running = page.locator(".phase-running")
    first = running.inner_text()
    page.wait_for_function(
        "(first) => document.querySelector('.phase-running').innerText !== first", arg=first, timeout=15_000
    )
    assert page.evaluate("window.__noReload") is True, "the page reloaded"
    browse.shots(page, "running")
    assert page.errors == []
