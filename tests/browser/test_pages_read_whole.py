"""The portal's main pages, as a researcher and as a member of another team see them: no server error, no script
error, no value shown as None/NaN/undefined/null, and no word cut across two lines in a table cell (a narrow
column once read "ai-lab/trainin g")."""

from __future__ import annotations

import re

import pytest

from scheduling.choices import JobState
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
SHOWN_AS_NOTHING = re.compile(r"(?<![\w-])(None|NaN|undefined|null)(?![\w-])")

# Each word of each table cell's text (a hyphen or a slash ends one), measured: one laid out on two lines was cut.
CUT_WORDS = """() => {
  const cut = [];
  for (const td of document.querySelectorAll("table td")) {
    const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const re = /[^\\s\\/-]+[\\/-]?/g;  // a break after a hyphen or a slash is a wrap, not a cut
      let m;
      while ((m = re.exec(node.data))) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
        if (tops.size > 1) cut.push(m[0]);
      }
    }
  }
  return cut;
}"""


# The top bar's links all within the window, over the bar's own background.
HEADER_FITS = """() => {
  const bar = document.querySelector("header.top").getBoundingClientRect();
  return [...document.querySelectorAll("header.top a, header.top button")].every(a => {
    const r = a.getBoundingClientRect();
    return r.right <= window.innerWidth && r.bottom <= bar.bottom + 1;
  });
}"""


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
            text = page.inner_text("main")
            assert not SHOWN_AS_NOTHING.search(text), (
                f"{who} {path}: {SHOWN_AS_NOTHING.search(text).group(0)!r}"
            )
            assert "Traceback" not in text and "URLconf" not in text, f"{who} {path}: a debug page"
            assert "{#" not in text and "{%" not in text, f"{who} {path}: template text shown"
            assert page.evaluate(CUT_WORDS) == [], f"{who} {path}: words cut in table cells"
            assert page.evaluate(HEADER_FITS), f"{who} {path}: the header runs past the window"
        browse.shots(page, f"{who}-last")
        assert page.errors == [], f"{who}: {page.errors}"
