"""A job page says, without a reload, that the job's node has stopped responding, and that a job cancelled
meanwhile still holds its card there ("releasing") until its agent, back, confirms the stop."""

from __future__ import annotations

import pytest

from scheduling.choices import JobState
from scheduling.jobs.transitions import job_cancel
from tests.browser.test_portal import _expect_text
from tests.pipeline.harness import NODE_LOST_AFTER_S, submit, wait_for, wait_state

pytestmark = pytest.mark.slow


@pytest.mark.timeout(150, func_only=True)  # the node-lost timeout (10 s) and an agent restart: about 30 s
def test_the_job_page_says_its_node_stopped_responding_then_that_its_card_is_releasing(browse):
    job = submit(browse.cluster, name="on-a-silent-node", command="sleep 300", gpus=1)
    wait_state(job, JobState.RUNNING)
    node = job.events.filter(to_state=JobState.PLACED).latest("at", "id").data["nodes"][0]
    page = browse("alice")
    page.goto(f"/jobs/{job.pk}/")
    _expect_text(page, "#live", "live")
    page.evaluate("window.__noReload = true")
    assert page.query_selector("#node-condition") is None

    browse.cluster.procs[f"agent-{node}"].kill9()
    # Pushed when the watchdog marks the node lost: the node-lost timeout and a watchdog round.
    _expect_text(
        page, "#node-condition", f"Node {node} has not responded for", timeout_s=NODE_LOST_AFTER_S * 2
    )
    assert "Running" in page.inner_text("#job-state")
    browse.shots(page, "node-not-responding")

    job_cancel(job=job, actor=browse.cluster.people["alice"])
    _expect_text(page, "#job-state", "Cancelled")
    _expect_text(page, "#node-condition", f"Its GPUs on {node} are held \\(releasing\\)")
    browse.shots(page, "releasing")
    page.goto(f"/cluster/{node}/")
    assert "releasing" in page.inner_text("#node-gpus")
    browse.shots(page, "node-page-releasing")

    browse.cluster.start_agent(node)
    wait_for(
        "the agent to confirm the stop",
        lambda: job.events.filter(code="gpus_released").exists(),
        timeout_s=45,
    )
    page.goto(f"/jobs/{job.pk}/")
    assert page.query_selector("#node-condition") is None
    assert "free again" in page.inner_text("body")
    assert page.errors == []
