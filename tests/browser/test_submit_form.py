"""The submit form in the browser: the priority list follows the team field, the what-if's suggestion is a
button that fills the form and asks again, and a job with no runtime limit is nudged beside that field."""

from __future__ import annotations

import pytest

from quotas.models import Membership
from quotas.services import membership_set

pytestmark = pytest.mark.slow

TIMEOUT_MS = 60_000  # a loaded 2-core machine answers slowly, not wrongly
# The words of an element's text laid out on more than one line; a break after a hyphen or a slash is a wrap, not
# a cut (tests/browser/reading.py).
CUT_WORDS = """(sel) => {
  const node = document.querySelector(sel).firstChild;
  const cut = [];
  for (const m of node.data.matchAll(/[^\\s\\/-]+[\\/-]?/g)) {
    const range = document.createRange();
    range.setStart(node, m.index);
    range.setEnd(node, m.index + m[0].length);
    if (new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size > 1) cut.push(m[0]);
  }
  return cut;
}"""


def _wait_text(page, selector: str, words: str, *, present: bool = True) -> None:
    page.wait_for_function(
        "([sel, words, present]) => { const el = document.querySelector(sel);"
        " return !!el && el.textContent.includes(words) === present; }",
        arg=[selector, words, present],
        timeout=TIMEOUT_MS,
    )


def _options(page) -> list[str]:
    return page.eval_on_selector_all("#id_priority option", "os => os.map(o => o.value)")


def test_a_suggestion_fills_the_form_and_the_priority_list_follows_the_team(browse):
    cluster = browse.cluster
    alice, other = cluster.people["alice"], cluster.people["other"]
    membership_set(user=alice, team=other)  # a second team, whose classes differ
    try:
        page = browse("alice")
        page.goto("/jobs/new/")
        page.select_option("#id_team", "pipe-lab")
        page.fill("#id_name", "split-me")
        page.fill("#id_command", "python train.py")
        page.fill("#id_gpus", "4")  # no node has 4 whole GPUs; two nodes have 2 each
        _wait_text(page, "#whatif", "Can never run here: 4 GPUs on one node can never be had")
        _wait_text(page, "#whatif-alt", "2 nodes x 2 GPUs starts now.")
        _wait_text(
            page, "#note-max_runtime", "Without a runtime limit the scheduler cannot backfill this job"
        )
        browse.shots(page, "suggested")
        # The command line wraps between its words: it read "--team pipe-la b", "python tra in.py".
        assert page.evaluate(CUT_WORDS, "#preview-cli") == []
        page.get_by_role("button", name="Use 2 nodes x 2 GPUs").click()
        assert (page.input_value("#id_gpus"), page.input_value("#id_nodes")) == ("2", "2")
        _wait_text(page, "#whatif", "Starts now")
        page.fill("#id_max_runtime", "2h")
        _wait_text(page, "#note-max_runtime", "Without a runtime limit", present=False)
        browse.shots(page, "applied")

        assert _options(page) == ["", "pipe-high", "pipe-low"]
        page.select_option("#id_priority", "pipe-high")
        page.select_option("#id_team", "other-lab")  # may use pipe-low only
        assert _options(page) == ["", "pipe-low", "pipe-high"]
        assert "not allowed for other-lab" in page.inner_text("#id_priority option[value=pipe-high]")
        _wait_text(
            page,
            "#said-priority",
            "team other-lab may not use priority class pipe-high; it may use: pipe-low",
        )
        assert "Can never run" not in page.inner_text("#preview") and "{#" not in page.inner_text("#preview")
        browse.shots(page, "priority-refused")
        assert page.errors == []
    finally:
        Membership.objects.filter(user=alice, team=other).delete()
