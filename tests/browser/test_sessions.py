"""Interactive sessions on the real stack (daphne, worker, agents running real processes): alice's notebook (a
stand-in that speaks HTTP and WebSocket and, like Jupyter, wants its token) opened from its job's page through the
portal's proxy; bob and the signed-out get nothing of it; another job on the node is refused by the notebook; the
notebook's page says so when its job ends."""

from __future__ import annotations

import re
import shlex
import sys

import pytest

from scheduling.jobs.fields import JobSpec
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_cancel
from tests.pipeline.harness import REPO, submit, wait_for, wait_state

STAND_IN = f"{sys.executable} {REPO}/demo/notebook_stand_in.py jupyter"

ECHO = """
async (url) => new Promise((resolve) => {
  const ws = new WebSocket(url);
  ws.onopen = () => ws.send("ping");
  ws.onmessage = (e) => { resolve(e.data); ws.close(); };
  ws.onclose = (e) => resolve("closed " + e.code);
})
"""

CLOSED_WHEN_THE_JOB_ENDS = """
() => new Promise((resolve) => {
  const ws = new WebSocket(location.href.replace(/^http/, "ws") + "echo");
  window.sessionSocket = { opened: false, closed: null };
  ws.onopen = () => { window.sessionSocket.opened = true; resolve(true); };
  ws.onclose = (e) => { window.sessionSocket.closed = e.code; resolve(false); };
})
"""


def _ready(job) -> bool:
    job.refresh_from_db()
    return "jupyter" in (job.ports_bound or {}).get("ready", [])


@pytest.mark.timeout(180, func_only=True)
def test_alice_opens_her_notebook_through_the_portal_and_nobody_else_reaches_it(browse):
    pipe = browse.cluster
    job = submit(
        pipe, name="notebook", command=STAND_IN, gpus=1, kind="interactive", ports=(("jupyter", 8888),)
    )
    page = browse("alice")
    page.goto(f"/jobs/{job.pk}/")
    wait_state(job, "running", timeout_s=60)
    wait_for("the notebook to answer on its node", lambda: _ready(job), timeout_s=60)
    # The page was open before the server answered: its live part brings the button.
    page.locator("a[data-session=jupyter]").wait_for(timeout=60_000)
    assert page.locator("a[data-session=jupyter]").inner_text() == "Open jupyter"
    assert "Interactive session" in page.locator("#job-live").inner_text()
    browse.shots(page, "job-page")

    with page.context.expect_page() as opened:
        page.click("a[data-session=jupyter]")
    notebook = opened.value
    notebook.wait_for_load_state()
    url = f"{pipe.url}/jobs/{job.pk}/open/jupyter/"
    assert notebook.url == url
    assert notebook.locator("h1").inner_text() == f"Stand-in jupyter of job {job.pk}"
    assert notebook.locator("#who").inner_text() == "for alice"
    browse.shots(notebook, "notebook")

    # A WebSocket round trip through the proxy (Jupyter's kernels).
    assert notebook.evaluate(ECHO, url.replace("http", "ws") + "echo") == "echo: ping"
    # What the job got: its own token, none of the portal's cookies, and who opened it.
    seen = {k.lower(): v for k, v in notebook.evaluate("fetch('headers').then((r) => r.json())").items()}
    assert seen["authorization"] == f"token {job.session_token}"
    assert "cookie" not in seen and seen["x-tessera-user"] == "alice"
    # The job's Set-Cookie never reached the portal's site.
    assert "stand-in-notebook" not in {c["name"] for c in notebook.context.cookies()}
    assert page.errors == []

    bob = browse("bob")
    assert bob.goto(url).status == 404
    assert bob.evaluate(ECHO, url.replace("http", "ws") + "echo") == "closed 4004"
    nobody = browse(None)
    nobody.goto(url)
    assert nobody.url.startswith(f"{pipe.url}/login/?next=/jobs/{job.pk}/open/jupyter/")

    # Another job on the same node, straight to the notebook's port without the proxy: the notebook refuses it.
    port = job.ports_bound["ports"]["jupyter"]
    probe = (
        "import sys, urllib.request, urllib.error\n"
        "try:\n"
        f"    urllib.request.urlopen('http://127.0.0.1:{port}/jobs/{job.pk}/open/jupyter/', timeout=5)\n"
        "except urllib.error.HTTPError as e:\n"
        "    print('refused', e.code); sys.exit(0 if e.code == 403 else 1)\n"
        "print('it answered'); sys.exit(1)\n"
    )
    other = job_submit(
        submitter=pipe.people["bob"],
        team=pipe.people["other"],
        spec=JobSpec(
            name="neighbour",
            command=f"{sys.executable} -c {shlex.quote(probe)}",
            gpus=1,
            gpu_models=("A100-80GB",),
        ),
    )
    wait_state(other, "succeeded", "failed", timeout_s=60)
    assert other.state == "succeeded", list(other.events.values_list("message", flat=True))

    # The job ends while its notebook is open: the open socket closes, and the page says the session ended.
    assert notebook.evaluate(CLOSED_WHEN_THE_JOB_ENDS) is True
    job_cancel(job=job, actor=pipe.people["alice"])
    wait_state(job, "cancelled", timeout_s=60)
    notebook.wait_for_function("window.sessionSocket.closed !== null", timeout=60_000)
    answer = notebook.reload()
    assert answer.status == 410
    assert f"Job {job.pk} has ended (cancelled)" in notebook.locator("main").inner_text()
    browse.shots(notebook, "ended")
    page.locator("[data-session=jupyter]", has_text="ended with the job").wait_for(timeout=60_000)


@pytest.mark.timeout(150, func_only=True)  # about 25 s
def test_alice_starts_a_notebook_from_the_template_is_warned_it_sits_idle_and_says_she_still_uses_it(browse):
    from quotas.models import PriorityClass
    from scheduling.cycle.idle import idle_check
    from scheduling.jobs.models import Job

    page = browse("alice")
    page.goto("/jobs/new/")
    page.click("#session-templates [data-template]:text('Jupyter')")
    assert page.input_value("#id_name") == "notebook" and page.input_value("#id_ports") == "jupyter:8888"
    assert page.is_checked("#id_interactive") and "jupyter lab" in page.input_value("#id_command")
    assert page.is_checked("input[name=command_form][value=shell]")
    browse.shots(page, "template")
    # No Jupyter on this machine: the stand-in, on a card its agent reports idle.
    page.fill("#id_command", STAND_IN)
    page.fill("#id_env", "TESSERA_SIM_UTIL_PCT=0")
    PriorityClass.objects.filter(name="pipe-low").update(
        interactive_idle_timeout_s=10
    )  # the least a class may set
    try:
        page.click("#job-form button[type=submit]")
        page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
        job = Job.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1]))
        assert (job.kind, job.ports) == ("interactive", [["jupyter", 8888]])
        wait_state(job, "running", timeout_s=60)
        wait_for("the idle warning (half its 10 s)", lambda: job.pk in idle_check()["warned"], timeout_s=60)
        page.reload()  # the check ran here, in the test's process: its event went to this process's channel layer
        page.locator("#idle button", has_text="Still using it").wait_for(timeout=60_000)
        assert "every GPU under 5% since" in page.inner_text("#idle") and "It is stopped" in page.inner_text(
            "#idle"
        )
        browse.shots(page, "idle-warning")
        page.click("#idle button")
        page.wait_for_url(re.compile(rf".*/jobs/{job.pk}/$"))
        assert "idle clock starts again" in page.inner_text("body")
        job.refresh_from_db()
        assert job.idle_reset_at is not None and job.idle_reclaim_at is None
        assert page.locator("#idle button").count() == 0  # no warning now: nothing to answer
        browse.shots(page, "still-in-use")
    finally:
        PriorityClass.objects.filter(name="pipe-low").update(interactive_idle_timeout_s=None)
