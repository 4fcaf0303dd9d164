"""A researcher's day in the browser, live: sign in, submit from the form, watch, read logs, cancel; what other
teams see; refusals next to their field; the what-if; a list that follows its jobs (htmx re-requesting its rows on
the stream's events); a dropped socket."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from scheduling.jobs.models import Job
from tests.pipeline.harness import submit, wait_for, wait_state

# How many times each part came over the socket (portal.js swaps a pushed part in and fires htmx:afterSwap on it,
# with no request).
PUSHED_SWAPS = """
window.__pushed = {};
document.body.addEventListener("htmx:afterSwap", function (e) {
  if (e.detail && e.detail.pushed) window.__pushed[e.target.id] = (window.__pushed[e.target.id] || 0) + 1;
});
"""


pytestmark = pytest.mark.slow

# Slices go to the nodes' MPS L4s (23034 MiB); whole GPUs to their A100s.
# Long enough that "Running" is on the page for a while even on a loaded 2-core machine.
COUNT_TO = "for i in $(seq 1 20); do echo line $i; sleep 1; done; echo done >&2"


def _expect_text(page, selector: str, pattern: str, timeout_s: float = 30) -> None:
    page.wait_for_function(
        "([sel, pat]) => { const el = document.querySelector(sel); return el && new RegExp(pat).test(el.textContent); }",
        arg=[selector, pattern],
        timeout=timeout_s * 1000 * 3,
    )


@pytest.mark.timeout(150, func_only=True)  # its job counts to 20 s; about 30 s in all
def test_alice_submits_a_slice_from_the_form_and_watches_it_run_and_finish_with_its_logs_live(browse):
    page = browse("alice")
    page.goto("/jobs/new/")
    page.fill("#id_name", "count-to-twenty")
    page.check("input[name=kind][value=slice]")
    page.fill("#id_gpu_memory", "4GiB")
    page.fill("#id_compute_pct", "25")
    page.check("input[name=command_form][value=shell]")
    page.fill("#id_command", COUNT_TO)
    _expect_text(page, "#whatif", "Starts now")
    browse.shots(page, "form")
    page.click("#job-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    page.evaluate("window.__noReload = true")
    _expect_text(page, "#live", "live")
    _expect_text(page, "#job-state", "Running")
    _expect_text(page, "#log-text", "line 2")  # while it still runs: the logs arrive live
    assert "Running" in page.inner_text("#job-state")
    browse.shots(page, "running")
    _expect_text(page, "#job-state", "Succeeded", timeout_s=40)
    _expect_text(page, "#log-text", "line 20")
    page.click("#tab-stderr")
    _expect_text(page, "#log-text", "done")
    assert page.evaluate("window.__noReload") is True, "the page reloaded"
    _expect_text(page, "#job-live", "Exit code")  # the re-requested part follows the badge
    assert "GPU-hours" in page.inner_text("#job-live")
    browse.shots(page, "succeeded")
    assert page.errors == []


def test_alice_cancels_a_job_of_hers_from_the_list(browse):
    long = submit(browse.cluster, name="long-one", command="sleep 300", gpus=1)
    page = browse("alice")
    _expect_text(page, f"tr[data-job='{long.pk}']", "Running|Placed|Starting")
    page.check(f"input[name=job][value='{long.pk}']")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel-selected")
    _expect_text(page, ".messages", f"Cancelled job {long.pk}")
    _expect_text(page, f"tr[data-job='{long.pk}']", "Cancelled")
    browse.shots(page, "cancelled")
    long.refresh_from_db()
    assert long.state == "cancelled"


def test_bob_gets_404_on_alices_job_and_sees_her_queue_entry_anonymised_as_the_api_shows_it(browse):
    # Both A100 pairs busy, so alice's next A100 job waits.
    blocker = submit(browse.cluster, name="blocker", command="sleep 300", gpus=2, nodes=2)
    wait_state(blocker, "running")
    waiting = submit(browse.cluster, name="alice-secret-run", command="sleep 1", gpus=1)
    wait_for(
        "a pending reason",
        lambda: waiting.__class__.objects.get(pk=waiting.pk).pending_reason_code not in ("", "queued"),
        timeout_s=20,
    )
    page = browse("bob")
    response = page.goto(f"/jobs/{waiting.pk}/")
    assert response.status == 404
    page.goto("/queue/")
    rows = page.inner_text("#queue-rows")
    assert "pipe-lab" in rows and "another team's job" in rows
    assert "alice-secret-run" not in rows and "alice" not in rows
    api = page.request.get("/api/v1/queue/").json()["results"]
    theirs = [e for e in api if e["team"] == "pipe-lab"]
    assert theirs and all(
        e["id"] is None and e["name"] is None and e["pending_reason"] is None for e in theirs
    )
    browse.shots(page, "queue-as-bob")
    mine = browse("alice")
    mine.goto("/queue/")
    assert "alice-secret-run" in mine.inner_text("#queue-rows")


def test_a_bad_value_is_shown_next_to_its_field_and_nothing_is_stored(browse):
    before = Job.objects.count()
    page = browse("alice")
    page.goto("/jobs/new/")
    page.fill("#id_name", "bad-memory")
    page.check("input[name=kind][value=slice]")
    page.fill("#id_gpu_memory", "lots")
    page.fill("#id_command", "python train.py")
    page.click("#job-form button[type=submit]")
    error = page.locator("#field-gpu_memory .field-error")
    # Beside its field, in words: what a size looks like and what was typed, no spec key.
    assert "Must be a size such as" in error.inner_text() and "lots" in error.inner_text(), error.inner_text()
    assert "gpu_memory" not in error.inner_text()
    assert page.locator("#id_gpu_memory").input_value() == "lots"  # what the user typed is kept
    browse.shots(page, "refused")
    assert Job.objects.count() == before


def test_the_what_if_answer_changes_when_the_request_changes(browse):
    page = browse("alice")
    page.goto("/jobs/new/")
    page.fill("#id_name", "what-if")
    page.fill("#id_command", "python train.py")
    page.fill("#id_gpus", "1")
    _expect_text(page, "#whatif", "Starts now")
    page.fill("#id_gpus", "4")
    _expect_text(page, "#whatif", "Can never run here: 4 GPUs on one node can never be had")
    browse.shots(page, "never")
    page.fill("#id_gpus", "2")
    _expect_text(page, "#whatif", "Starts now")
    assert "tessera submit" in page.inner_text("#preview-cli") and "gpus: 2" in page.inner_text(
        "#preview-yaml"
    )


# Every request htmx makes for a part of the page, as (path, status), and whether the page was ever reloaded.
WATCH_PARTS = """
window.__noReload = true;
window.__parts = [];
document.body.addEventListener("htmx:afterRequest", function (e) {
  window.__parts.push([e.detail.pathInfo.requestPath, e.detail.xhr.status]);
});
"""


def _rows_requests(page) -> list:
    return [status for path, status in page.evaluate("window.__parts") if "part=rows" in path]


def test_a_jobs_row_follows_its_job_through_htmx_while_alice_types_and_keeps_her_selection(browse):
    from scheduling.jobs.transitions import job_cancel

    page = browse("alice")
    _expect_text(page, "#live", "live")
    page.evaluate(WATCH_PARTS)
    kept = submit(browse.cluster, name="kept-selected", command="sleep 300", gpus=1)
    # A new row: only the re-requested rows can bring it.
    _expect_text(page, f"tr[data-job='{kept.pk}']", "Running")
    page.check(f"#select-job-{kept.pk}")
    job = submit(browse.cluster, name="follow-me", command="sleep 300", gpus=1)
    _expect_text(page, f"tr[data-job='{job.pk}']", "Running")
    page.fill("#main input[name=q]", "half-typed")  # the filter form, outside the rows: she is typing in it
    page.evaluate(PUSHED_SWAPS)
    browse.shots(page, "before")
    job_cancel(job=job, actor=job.submitter)
    # The badge changes at once from the event; the row's class and its box only come with the rows, pushed.
    page.wait_for_selector(f"tr[data-job='{job.pk}'].state-cancelled", timeout=30_000)
    assert page.locator(f"#select-job-{job.pk}").count() == 0  # a cancelled job has nothing to select
    assert page.evaluate("window.__pushed['job-rows'] || 0") > 0
    assert set(_rows_requests(page)) <= {200}
    assert page.is_checked(f"#select-job-{kept.pk}"), "the selection was lost when the rows were swapped"
    assert page.evaluate("document.activeElement.name") == "q"
    assert page.input_value("#main input[name=q]") == "half-typed"
    assert page.evaluate("window.__noReload") is True, "the page reloaded"
    browse.shots(page, "after")
    assert page.errors == []


@pytest.mark.timeout(150, func_only=True)  # about 30 s
def test_when_the_server_drops_the_socket_the_page_says_reconnecting_then_catches_up(browse):
    from scheduling.jobs.transitions import job_cancel

    cluster = browse.cluster
    page = browse("alice")
    _expect_text(page, "#live", "live")
    page.evaluate(WATCH_PARTS)
    cluster.procs["web"].kill9()
    _expect_text(page, "#live", "reconnecting")
    browse.shots(page, "reconnecting")
    job = submit(cluster, name="while-you-were-away", command="sleep 300", gpus=1)
    back_at = timezone.now()
    cluster.start_web()
    _expect_text(page, "#live", "live", timeout_s=40)
    _expect_text(page, "#job-rows", "while-you-were-away")  # caught up on opening
    browse.shots(page, "caught-up")
    wait_state(job, "running")
    job.refresh_from_db()
    job_cancel(job=job, actor=job.submitter)
    # The new socket carries events again: the row follows through htmx, with no reload.
    page.wait_for_selector(f"tr[data-job='{job.pk}'].state-cancelled", timeout=30_000)
    assert page.evaluate("window.__noReload") is True, "the page reloaded"
    assert page.errors == []
    # The agents lost the web with the page: both are back on the restarted one before the next test begins.
    wait_for("both agents heard by the restarted web", lambda: cluster.nodes_ready(heard_since=back_at))


# The page's socket opens this late: what changes between the page's render and the socket joining its groups
# reaches no one, so the page must catch up once the socket is open.
LATE_SOCKET = """
(() => {
  const Real = window.WebSocket;
  window.WebSocket = function (url, protocols) {
    const on = {};
    const proxy = { send: function () {}, close: function () {} };
    ["onopen", "onmessage", "onclose", "onerror"].forEach(function (k) {
      Object.defineProperty(proxy, k, { set: function (v) { on[k] = v; }, get: function () { return on[k]; } });
    });
    setTimeout(function () {
      const ws = new Real(url, protocols);
      ["onopen", "onmessage", "onclose", "onerror"].forEach(function (k) {
        ws[k] = function (e) { if (k === "onopen") window.__socketOpenAt = Date.now(); if (on[k]) on[k](e); };
      });
      proxy.send = function (d) { ws.send(d); };
      proxy.close = function () { ws.close(); };
    }, 3000);
    return proxy;
  };
})();
"""


def test_a_change_made_before_the_pages_socket_opened_shows_once_it_opens(browse):
    from scheduling.jobs.transitions import job_cancel

    job = submit(browse.cluster, name="changes-early", command="sleep 300", gpus=1)
    wait_state(job, "running")
    page = browse("alice")
    page.add_init_script(LATE_SOCKET)
    page.goto(f"/jobs/{job.pk}/")
    assert "Running" in page.inner_text("#job-state")
    job.refresh_from_db()
    job_cancel(job=job, actor=job.submitter)  # its event is pushed while the page's socket is not open yet
    _expect_text(page, "#live", "live")
    assert page.evaluate("window.__socketOpenAt") is not None
    _expect_text(page, "#job-state", "Cancelled", timeout_s=5)
    browse.shots(page, "caught-up")


@pytest.mark.timeout(180, func_only=True)
def test_alice_submits_a_sweep_as_an_array_from_the_form_and_sees_it_as_one_line(browse):
    """The form's Array field: one line in the list with its tasks counted by state, the tasks a click away,
    at most %2 running, and the whole array cancelled from the list."""
    page = browse("alice")
    page.goto("/jobs/new/")
    page.fill("#id_name", "seed-sweep")
    page.check("input[name=kind][value=slice]")
    page.fill("#id_gpu_memory", "2GiB")
    page.fill("#id_compute_pct", "5")
    page.fill("#id_command", "sleep 300")
    page.fill("#id_array", "0-5%2")
    _expect_text(page, "#whatif", "Starts now")
    browse.shots(page, "form")
    page.click("#job-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    array_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    _expect_text(page, "#job-live", "6 tasks \\(0-5%2\\), at most 2 at once")
    wait_for(
        "two of its tasks running",
        lambda: Job.objects.filter(array_job_id=array_id, state="running").count() == 2,
        timeout_s=40,
    )
    page.reload()
    _expect_text(page, "#job-live", "2 running")
    assert "At most 2 of its tasks run at once" in page.inner_text("#job-live")
    assert "open one from its tasks" in page.inner_text("#array-tasks")  # not an empty log of its own
    browse.shots(page, "array-page")
    page.goto("/jobs/")
    row = f"tr[data-job='{array_id}']"
    _expect_text(page, row, "4 pending")
    tasks = set(Job.objects.filter(array_job_id=array_id).exclude(pk=array_id).values_list("pk", flat=True))
    listed = set(
        map(int, page.eval_on_selector_all("#job-rows tr[data-job]", "rs => rs.map(r => r.dataset.job)"))
    )
    assert len(tasks) == 2 and not tasks & listed  # its tasks are not lines of their own
    assert "its 6 tasks" in page.inner_text(row)
    browse.shots(page, "list")
    page.click(f"{row} a:has-text('its 6 tasks')")
    _expect_text(page, "#job-rows", f"{array_id}_1")
    assert page.locator("#job-rows tr[data-job]").count() == 2
    browse.shots(page, "tasks")
    page.goto("/jobs/")
    page.once("dialog", lambda d: d.accept())
    page.check(f"input[name=job][value='{array_id}']")
    page.click("#cancel-selected")
    _expect_text(page, row, "6 cancelled", timeout_s=40)
    browse.shots(page, "cancelled")
    assert page.errors == []
