"""The live parts of every page, in Chromium: each part htmx re-requests when the page catches up (what portal.js
fires once its socket opens) is answered and swapped in place; a closed group of the cluster map is left alone until
it is opened again; a part keeps what it shows when its answer is the sign-in page; a waiting job's page reads how
the teams stand after it loads and follows the queue's movement; the signed-out summary, which has no stream, is
re-requested every 5 s. Screenshots under test-artifacts/."""

from __future__ import annotations

import pytest

from tests.browser.test_portal import PUSHED_SWAPS, _expect_text
from tests.pipeline.harness import submit, wait_state

pytestmark = pytest.mark.slow

LIVE_PAGES = (
    "/jobs/",
    "/queue/",
    "/cluster/",
    "/cluster/pipe-a/",
    "/fairness/",
    "/history/",
    "/capacity/",
    "/teams/pipe-lab/",
)

# The parts htmx asked for (as it sends: at once for an event that is not debounced), and the status of the last
# answer it had for each, by the part's id.
WATCH_ANSWERS = """
window.__asked = [];
window.__answers = {};
document.body.addEventListener("htmx:beforeRequest", function (e) { window.__asked.push(e.detail.elt.id); });
document.body.addEventListener("htmx:afterRequest", function (e) {
  window.__answers[e.detail.elt.id] = e.detail.xhr.status;
});
"""

# The page's live parts, but a closed group's tiles (not re-requested until it is opened).
LIVE_PART_IDS = """
Array.from(document.querySelectorAll("[hx-trigger*='tessera:catch-up']"))
  .filter(function (el) { return !el.closest("details:not([open])"); })
  .map(function (el) { return el.id; })
"""


# The text a part shows, less its times, which page.js keeps counting on ("cancelled 18 seconds ago", then 19).
SHOWN = """
sel => {
  const part = document.querySelector(sel).cloneNode(true);
  part.querySelectorAll("time").forEach(function (t) { t.textContent = ""; });
  return part.textContent;
}
"""


def _all_answered(page, ids: list[str]) -> None:
    page.wait_for_function("ids => ids.every(id => window.__answers[id] === 200)", arg=ids, timeout=30_000)


def _quiet(page) -> None:
    """Wait until no part of the page has a request in flight (htmx marks the part asking with htmx-request)."""
    page.wait_for_function("() => !document.querySelector('.htmx-request')", timeout=30_000)


def test_every_live_part_of_every_page_is_re_requested_when_the_page_catches_up(browse):
    page = browse("alice")
    for path in LIVE_PAGES:
        page.goto(path)
        _expect_text(page, "#live", "live")
        parts = page.evaluate(LIVE_PART_IDS)
        assert parts and all(parts), (path, parts)
        page.evaluate(WATCH_ANSWERS)
        page.evaluate("htmx.trigger(document.body, 'tessera:catch-up')")
        _all_answered(page, parts)
        assert page.evaluate(LIVE_PART_IDS) == parts, path  # swapped in place: every part is still there
        browse.shots(page, path.strip("/").replace("/", "-"))
    assert page.errors == []


def test_a_closed_groups_tiles_are_not_re_requested_and_opening_it_again_asks_for_them(browse):
    page = browse("alice")
    page.goto("/cluster/")
    _expect_text(page, "#live", "live")
    _expect_text(page, ".node-tile[data-node='pipe-a']", "heartbeat")
    body = page.evaluate("document.querySelector('details.group .group-body').id")
    page.click("details.group > summary")  # closes it
    page.wait_for_selector("details.group:not([open])", state="attached")
    _quiet(page)  # what was asked before it closed has been answered
    page.evaluate(WATCH_ANSWERS)
    page.evaluate("htmx.trigger(document.body, 'tessera:catch-up')")
    # The rows follow: asked at once, or (htmx queues it) once a request of theirs then in flight has been answered:
    # they are also asked every 5 s and on the stream's node, queue and health events. The closed group never is.
    _all_answered(page, ["cluster-groups"])
    asked = page.evaluate("window.__asked")
    assert "cluster-groups" in asked and body not in asked, asked
    page.click("details.group > summary")  # open again: what changed while it was closed is asked for
    _all_answered(page, [body])
    _expect_text(page, f"#{body} .node-tile[data-node='pipe-a']", "heartbeat")
    assert page.errors == []


def test_a_part_keeps_what_it_shows_when_the_session_has_ended(browse):
    from django.contrib.sessions.models import Session

    page = browse("alice")
    _expect_text(page, "#live", "live")
    _quiet(page)  # the catch-up of the socket's opening has been answered
    shown = page.evaluate(SHOWN, "#job-rows")
    Session.objects.all().delete()  # signed out elsewhere: the part's next answer is the sign-in page
    page.evaluate(WATCH_ANSWERS)
    page.evaluate("htmx.trigger(document.body, 'tessera:catch-up')")
    _all_answered(page, ["job-rows"])
    assert page.evaluate(SHOWN, "#job-rows") == shown
    assert page.errors == []


def test_a_waiting_jobs_page_reads_how_the_teams_stand_and_follows_the_queue(browse):
    blocker = submit(browse.cluster, name="blocker", command="sleep 300", gpus=2, nodes=2)
    wait_state(blocker, "running")
    waiting = submit(browse.cluster, name="waits-its-turn", command="sleep 300", gpus=1)
    page = browse("alice")
    page.goto(f"/jobs/{waiting.pk}/")
    _expect_text(page, "#ahead", "guarantee|has not ranked")  # asked for once the page had loaded
    _expect_text(page, "#live", "live")
    assert "Why it waits" in page.inner_text("#job-live")
    page.wait_for_selector("#job-live[data-pushed]")  # the socket pushes the job's part to this page
    page.evaluate(WATCH_ANSWERS)
    page.evaluate(PUSHED_SWAPS)
    # The queue moves: while the job waits, both parts follow it; the job's own part comes over the socket.
    submit(browse.cluster, name="moves-the-queue", command="sleep 300", gpus=1)
    page.wait_for_function("window.__pushed['job-live'] > 0", timeout=30_000)
    _all_answered(page, ["ahead"])
    assert "job-live" not in page.evaluate("window.__asked")
    browse.shots(page, "waiting")
    # A form in a pushed part is sent with the page's own CSRF token: cancelling works.
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#job-live button.danger")
    _expect_text(page, "#job-state", "Cancelled")
    wait_state(waiting, "cancelled")
    assert page.errors == []


def test_the_signed_out_summary_has_no_stream_and_is_re_requested_every_5_s(browse):
    page = browse(None)
    page.goto("/")
    page.evaluate(WATCH_ANSWERS)
    _all_answered(page, ["summary"])
    assert page.locator("#live").is_hidden()
    assert "GPUs" in page.inner_text("#summary")
    browse.shots(page, "signed-out")
    assert page.errors == []


# Sockets opened one after another from the page: each sends its frame once greeted and resolves with the code
# it was closed with; a socket refused before it opens closes with 1006.
BAD_FRAMES = """
async (count) => {
  const url = "ws://" + location.host + "/ws/queue/";
  function closeCode(frame) {
    return new Promise(function (resolve) {
      const ws = new WebSocket(url);
      ws.onmessage = function (e) { if (JSON.parse(e.data).type === "hello") ws.send(frame); };
      ws.onclose = function (e) { resolve(e.code); };
    });
  }
  const frames = [new Uint8Array([0, 1]), "{{{", "x".repeat(4097), "[".repeat(2000) + "]".repeat(2000)];
  const codes = [];
  for (const frame of frames) codes.push(await closeCode(frame));
  const repeated = [];
  for (let i = 0; i < count; i++) repeated.push(await closeCode("{{{"));
  const greeted = await new Promise(function (resolve) {
    const ws = new WebSocket(url);
    ws.onmessage = function (e) { resolve(JSON.parse(e.data).type); ws.close(); };
    ws.onclose = function (e) { resolve("closed " + e.code); };
  });
  return { codes: codes, repeated: Array.from(new Set(repeated)), greeted: greeted };
}
"""


def test_a_bad_frame_on_the_real_server_closes_with_its_code_and_frees_the_sockets_place(browse):
    """Through daphne, which sends only 1000 and 3000-4999: a binary frame, text that is not JSON, a frame over
    4,096 characters and 2,000-deep JSON each close their socket with 4003/4007/4009/4007, and more bad sockets
    than the session may hold leave its places free."""
    web = browse.cluster.procs["web"]
    logged_from = web.log_size()  # the package's cluster logs every test before this one too
    page = browse("bob")
    page.goto("/queue/")
    result = page.evaluate(BAD_FRAMES, 29)  # with the four above, one over the session's 32
    assert result == {"codes": [4003, 4007, 4009, 4007], "repeated": [4007], "greeted": "hello"}, result
    web_log = web.written_since(logged_from)
    assert "closed a socket of user" in web_log  # the web's log of this test is what is read
    assert "invalid close code" not in web_log and "Traceback" not in web_log, web_log
    assert page.errors == []
