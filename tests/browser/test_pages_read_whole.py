"""The portal's main pages, as a researcher and as a member of another team see them: no server error, no script
error, and each reads whole as tests/browser/reading.py checks (no debug page or template text, no value shown as
None/NaN/undefined/null, no word cut across two lines in a table cell, a top bar that fits)."""

from __future__ import annotations

import pytest

from scheduling.choices import JobState
from tests.browser.reading import unreadable
from tests.pipeline.harness import submit, wait_state

pytestmark = pytest.mark.slow

PAGES = (
    "/",
    "/jobs/",
    "/queue/",
    "/teams/",
    "/teams/pipe-lab/",
    "/cluster/",
    "/fairness/",
    "/history/",
    "/capacity/",
)


@pytest.mark.timeout(180, func_only=True)
def test_the_main_pages_read_whole_for_a_researcher_and_for_another_team(browse):
    waiting = submit(browse.cluster, name="resnet50imagenetbaselinerun", command="sleep 300", gpus=1)
    wait_state(waiting, JobState.RUNNING)
    for who in ("alice", "bob"):
        page = browse(who)
        page.set_viewport_size({"width": 900, "height": 800})  # a laptop's half screen: columns get narrow
        for path in (*PAGES, f"/jobs/{waiting.pk}/" if who == "alice" else "/jobs/new/"):
            response = page.goto(path)
            page.wait_for_load_state("networkidle")
            assert response is not None and response.status < 500, (
                f"{who} {path}: {response and response.status}"
            )
            assert unreadable(page) == [], f"{who} {path}"
        browse.shots(page, f"{who}-last")
        assert page.errors == [], f"{who}: {page.errors}"
