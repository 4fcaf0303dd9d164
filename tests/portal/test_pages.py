"""The portal's pages through Django's test client: who sees what, sign-in and its protection, the submit form's
refusals, and API docs that fetch nothing from outside. The live behaviour is in tests/browser."""

from __future__ import annotations

import html
import re

import pytest
from django.test import Client

from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job
from scheduling.jobs.submit import job_submit

pytestmark = pytest.mark.django_db


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _submit(user, team, **spec):
    spec = {"name": "job", "command": "python run.py", "gpus": 1, **spec}
    return job_submit(submitter=user, team=team, spec=JobSpec(**spec))


def test_signed_out_home_shows_the_cluster_and_a_sign_in_link_and_no_jobs(alice, teams, node):
    _submit(alice, teams["training"], name="alice-private-name")
    page = Client().get("/").content.decode()
    assert "GPUs" in page and "/login/" in page
    assert "alice-private-name" not in page


def test_pages_of_jobs_ask_for_sign_in_with_next(db):
    response = Client().get("/jobs/")
    assert response.status_code == 302 and response["Location"] == "/login/?next=/jobs/"


def test_signing_in_on_the_portal_form_lands_on_my_jobs_and_honours_next(alice, teams, node):
    job = _submit(alice, teams["training"])
    client = Client()
    response = client.post(
        "/login/?next=/queue/", {"username": "alice", "password": "alice-pw", "next": "/queue/"}
    )
    assert response.status_code == 302 and response["Location"] == "/queue/"
    assert client.get("/").status_code == 302  # signed in, home is the jobs list
    assert f"/jobs/{job.pk}/" in client.get("/jobs/").content.decode()
    assert client.post("/logout/").status_code == 302
    assert client.get("/jobs/").status_code == 302


def test_a_member_signs_in_on_the_portal_though_not_staff(alice):
    response = Client().post("/login/", {"username": "alice", "password": "alice-pw"})
    assert response.status_code == 302 and response["Location"] == "/jobs/"


def test_repeated_wrong_passwords_lock_the_sign_in_form_with_429(alice, settings):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert client.post("/login/", {"username": "alice", "password": "wrong"}).status_code == 200
    assert client.post("/login/", {"username": "alice", "password": "wrong"}).status_code == 429
    locked = client.post("/login/", {"username": "alice", "password": "alice-pw"})  # even the right one
    assert locked.status_code == 429
    assert "Too many failed sign-ins" in locked.content.decode()


def test_the_api_token_login_gets_the_same_lockout_as_json(alice, settings):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post(
            "/api/v1/auth/token/", {"username": "alice", "password": "wrong"}, content_type="application/json"
        )
    locked = client.post(
        "/api/v1/auth/token/", {"username": "alice", "password": "alice-pw"}, content_type="application/json"
    )
    assert locked.status_code == 429
    assert locked.json()["error"]["code"] == "locked_out"


def test_another_teams_job_page_is_404_and_its_queue_entry_anonymous(alice, bob, teams, node):
    job = _submit(alice, teams["training"], name="alice-secret")
    as_bob = _signed_in(bob)
    assert as_bob.get(f"/jobs/{job.pk}/").status_code == 404
    assert as_bob.get(f"/jobs/new/?from={job.pk}").status_code == 404
    assert as_bob.get(f"/jobs/{job.pk}/logs/stdout/").status_code == 404
    queue = as_bob.get("/queue/").content.decode()
    assert "ai-lab/training" in queue and "another team's job" in queue
    assert "alice-secret" not in queue and f"/jobs/{job.pk}/" not in queue
    api = as_bob.get("/api/v1/queue/").json()["results"]
    assert [(e["team"], e["id"], e["name"]) for e in api] == [("ai-lab/training", None, None)]


def test_a_404_is_the_portals_own_page_with_its_navigation_never_a_debug_page(alice, bob, teams, node):
    job = _submit(alice, teams["training"], name="alice-secret")
    page = _signed_in(bob).get(f"/jobs/{job.pk}/")
    body = " ".join(page.content.decode().split())
    assert page.status_code == 404 and "<h1>Not found</h1>" in body
    assert "belongs to a team you are not in" in body and 'href="/jobs/"' in body
    assert "alice-secret" not in body and "URLconf" not in body and "Traceback" not in body


def test_a_500_is_a_plain_page_that_says_nothing_was_lost(client, settings):
    from django.template.loader import render_to_string

    body = " ".join(render_to_string("500.html").split())  # without a request, as Django's handler renders it
    assert "Nothing you submitted is lost" in body and "{%" not in body


def _running_on_a_whole_card(job, node):
    """The job placed on the node's GPU 0 by a cycle's write and reported started by its agent."""
    from scheduling.agents.reports.job_status import job_report
    from scheduling.cycle import apply, lease
    from scheduling.engine import types as eng

    placement = eng.Placement(str(job.pk), (eng.Assignment(node.name, 0, 81920, 1000),))
    apply.apply_decisions(decisions=eng.Decisions(placements=(placement,)), epoch=lease.epoch_issue())
    job.refresh_from_db()
    job_report(node_id=node.pk, payload={"job_id": job.pk, "attempt": job.attempt, "state": "started"})
    return job


def test_a_job_its_host_memory_limit_killed_shows_that_not_exit_code_0(alice, teams, node):
    from scheduling.agents.reports.job_status import job_report

    job = _running_on_a_whole_card(_submit(alice, teams["training"], name="oom"), node)
    report = {"job_id": job.pk, "attempt": job.attempt}
    # The kernel killed a child at the cgroup's limit; the job's shell itself exited 0.
    job_report(
        node_id=node.pk,
        payload={**report, "state": "killed", "reason": "host_memory_exceeded", "exit_code": 0},
    )
    page = " ".join(html.unescape(_signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()).split())
    assert "Killed: it used more host memory than it asked for (memory_mib)." in page
    assert "<dt>Exit code</dt><dd>0</dd>" not in page


def test_bob_cannot_cancel_alices_job_from_the_portal(alice, bob, teams, node):
    job = _submit(alice, teams["training"])
    response = _signed_in(bob).post("/jobs/cancel/", {"job": [job.pk]})
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.state == "pending"


def test_alice_cancels_two_of_her_jobs_at_once(alice, teams, node):
    jobs = [_submit(alice, teams["training"], name=f"j{i}") for i in range(2)]
    _signed_in(alice).post("/jobs/cancel/", {"job": [j.pk for j in jobs]})
    assert sorted(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("state", flat=True)) == [
        "cancelled",
        "cancelled",
    ]


FORM = {
    "name": "from-the-form",
    "team": "ai-lab/training",
    "kind": "slice",
    "gpu_memory": "10GiB",
    "compute_pct": "25",
    "topology": "none",
    "nodes": "1",
    "command_form": "argv",
    "command": "python train.py --lr 3e-4",
    "env": "SEED=1\nMODE=fast",
    "workdir": "/data/runs/lr",
}


def test_the_form_submits_through_the_same_parser_and_service_as_the_api(alice, teams, node):
    response = _signed_in(alice).post("/jobs/new/", FORM)
    job = Job.objects.get(name="from-the-form")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert (job.gpu_memory_mib, job.compute_pct, job.gpus) == (10240, 25, 0)
    assert job.command == "python train.py --lr 3e-4" and job.env == {"SEED": "1", "MODE": "fast"}
    assert job.workdir == "/data/runs/lr"


def test_the_form_takes_how_often_the_job_checkpoints_and_the_job_page_shows_it(alice, teams, node):
    client = _signed_in(alice)
    preview = client.post("/jobs/new/preview/", {**FORM, "checkpoint_interval": "30m"}).content.decode()
    assert "--checkpoint-every 30m" in preview
    response = client.post("/jobs/new/", {**FORM, "checkpoint_interval": "30m"})
    job = Job.objects.get(name="from-the-form")
    assert response.status_code == 302 and job.checkpoint_interval_s == 1800
    assert "every 30 min" in client.get(f"/jobs/{job.pk}/").content.decode()


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"gpu_memory": "lots"}, "gpu_memory", "Must be a size such as '10GiB'"),
        ({"gpu_memory": "900GiB"}, "gpu_memory", "largest allowed GPU has"),
        ({"kind": "whole", "gpus": "16"}, "gpus", "the most on any node is 8"),
        ({"env": "not a pair"}, "env", "NAME=value"),
        ({"command": "python 'unclosed"}, "command", "quoting does not close"),
        ({"team": "ai-lab/inference"}, "team", "not one of the available choices"),
        ({"priority": "critical"}, "priority", "may use: training, inference; default training"),
        ({"checkpoint_interval": "30s"}, "checkpoint_interval", "between 60 s (1m) and 604800 s (7d)"),
    ],
)
def test_a_refused_value_is_shown_next_to_its_field_and_nothing_is_stored(
    alice, teams, node, change, field, message
):
    response = _signed_in(alice).post("/jobs/new/", {**FORM, **change})
    page = response.content.decode()
    assert response.status_code == 400
    error = re.search(rf'id="error-{field}">([^<]*)<', page)
    assert error and message in error.group(1).replace("&#x27;", "'"), page[:2000]
    assert not Job.objects.exists()


def test_the_form_names_every_refused_field_at_once(alice, teams, node):
    change = {"kind": "whole", "gpus": "two", "max_runtime": "forever", "command": ""}
    response = _signed_in(alice).post("/jobs/new/", {**FORM, **change})
    page = html.unescape(response.content.decode())
    assert response.status_code == 400
    said = dict(re.findall(r'id="error-(\w+)">([^<]*)<', page))
    assert "required" in said.get("command", "").lower(), said
    # Beside its field, a refusal names no spec key ("max_runtime must be ..." beside "Runtime limit").
    assert said.get("gpus", "").startswith("Must be a whole number (got 'two')"), said
    assert said.get("max_runtime", "").startswith("Must be a duration"), said
    assert not Job.objects.exists()


def test_copy_and_edit_fills_the_form_from_an_earlier_job(alice, teams, node):
    job = _submit(
        alice,
        teams["training"],
        name="orig",
        gpus=2,
        topology="nvlink",
        max_runtime_s=7200,
        checkpoint_interval_s=1800,
    )
    page = _signed_in(alice).get(f"/jobs/new/?from={job.pk}").content.decode()
    assert 'value="orig (copy)"' in page and 'value="2"' in page and 'value="2h"' in page
    assert 'name="checkpoint_interval" value="30m"' in page
    assert '<option value="nvlink" selected>' in page


def test_the_preview_answers_with_the_engines_projection_and_stores_nothing(alice, teams, node):
    client = _signed_in(alice)
    now = client.post("/jobs/new/preview/", {**FORM, "kind": "whole", "gpus": "1"}).content.decode()
    assert "Starts now on a100-01" in now and "tessera submit" in now
    never = client.post("/jobs/new/preview/", {**FORM, "kind": "whole", "gpus": "9"}).content.decode()
    assert "Can never run here: 9 GPUs on one node can never be had: the most on any node is 8" in never
    assert not Job.objects.exists()


def test_the_api_docs_pages_fetch_nothing_from_outside(alice):
    client = _signed_in(alice)
    for path in ("/api/docs/", "/api/redoc/"):
        page = client.get(path).content.decode()
        assert re.findall(r'(?:src|href)="(https?:)?//', page) == [], path


def test_a_pipe_in_program_and_arguments_is_refused_with_the_way_out(alice, teams, node):
    response = _signed_in(alice).post("/jobs/new/", {**FORM, "command": "python train.py | tee out.log"})
    assert response.status_code == 400
    assert "choose" in re.search(r'id="error-command">([^<]*)<', response.content.decode()).group(1)
    assert not Job.objects.exists()


def test_signing_out_by_a_link_asks_first(alice):
    client = _signed_in(alice)
    page = client.get("/logout/")
    assert page.status_code == 200 and "Sign out?" in page.content.decode()
    assert client.get("/jobs/").status_code == 200  # still signed in
    assert client.post("/logout/").status_code == 302
    assert client.get("/jobs/").status_code == 302


def test_sizes_read_as_people_say_them_and_none_is_0_gib_beside_a_total_in_gib():
    from frontend.templatetags.portal import gib

    assert [gib(0), gib(512), gib(10240), gib(655360)] == ["0 GiB", "512 MiB", "10 GiB", "640 GiB"]


def test_a_finished_whole_card_job_shows_its_peak_memory_against_the_card_it_held(alice, teams, node):
    from scheduling.agents import live_metrics
    from scheduling.agents.reports.job_status import job_report

    job = _running_on_a_whole_card(_submit(alice, teams["training"], name="whole-card"), node)
    report = {"job_id": job.pk, "attempt": job.attempt}
    live_metrics._usage_note(job.pk, 0.0, [{"util_pct": 90.0, "memory_used_mib": 22 * 1024}], True)
    try:
        job_report(node_id=node.pk, payload={**report, "state": "exited", "exit_code": 0})
        page = " ".join(html.unescape(_signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()).split())
    finally:  # the test database's job ids start again at 1: no usage record for a later test's job
        from scheduling.coordination import redis_client

        r = redis_client()
        if r is not None:
            r.delete(live_metrics.job_usage_key(job.pk))
        live_metrics._local_usage.pop(job.pk, None)
    # Its card was given back when it ended; what it held is its placement's record.
    assert "Peak GPU memory used: 22 GiB of the 80 GiB it held: a 24 GiB slice would do." in page


def test_a_slice_shows_no_peak_memory_as_nvml_cannot_tell_whose_memory_on_its_card_is_whose():
    from types import SimpleNamespace

    from frontend.jobs import _right_size

    slice_job = SimpleNamespace(gpus=0, gpu_memory_mib=20 * 1024)
    assert _right_size(slice_job, 20 * 1024, []) is None  # was "20 GiB of the 20 GiB it held"


def test_a_log_nothing_was_written_to_downloads_empty_not_as_an_error_page(alice, teams, node):
    job = _submit(alice, teams["training"], name="waits")
    answer = _signed_in(alice).get(f"/jobs/{job.pk}/logs/stderr/")
    assert answer.status_code == 200  # was a 404 page, "This job has written nothing there yet"
    assert answer["Content-Disposition"] == f'attachment; filename="job-{job.pk}-stderr.log"'
    assert answer.content == b""


def test_team_names_in_tables_wrap_after_their_slash_and_never_at_a_hyphen(alice, teams, node):
    from scheduling.jobs.ledger import slice_allocate

    held = _submit(alice, teams["training"], name="held")
    gpu = node.gpus.order_by("index").first()
    slice_allocate(job=held, gpu=gpu, memory_mib=gpu.memory_mib, compute_pct=100)
    client = _signed_in(alice)
    whole = '<span class="nowrap">ai-lab/</span><wbr><span class="nowrap">training</span>'
    # A narrow column broke "ai-lab/training" at its hyphen: "ai-" over "lab/training".
    for url in ("/jobs/", "/queue/", "/teams/", "/fairness/", f"/cluster/{node.name}/"):
        assert whole in client.get(url).content.decode(), url
    from django.template.loader import render_to_string

    usage = render_to_string(
        "frontend/history/_usage_table.html",
        {"key": "team", "rows": [{"team": "ai-lab/training", "gpu_hours": 1.0, "share_pct": 100}]},
    )
    assert whole in usage


def test_the_email_box_is_not_shown_ticked_to_someone_with_no_email_address(alice):
    from scheduling.notifications.services import settings_of

    alice.email = ""
    alice.save()
    client = _signed_in(alice)
    page = client.get("/account/notifications/").content.decode()
    box = re.search(r'<input type="checkbox" name="email"[^>]*>', page).group(0)
    assert "checked" not in box and "disabled" in box  # it read "By email" ticked, with no address to send to
    assert "no email address" in page
    # Saving the rest keeps the stored choice, for when an admin sets an address.
    client.post("/account/notifications/", {"job_events": ["end"], "email": "on", "webhook_url": ""})
    assert settings_of(alice).job_events == ["end"] and settings_of(alice).email is True

    alice.email = "alice@example.org"
    alice.save()
    box = re.search(
        r'<input type="checkbox" name="email"[^>]*>', client.get("/account/notifications/").content.decode()
    )
    assert "checked" in box.group(0) and "disabled" not in box.group(0)


def test_the_time_bar_leaves_out_phases_over_within_their_second(alice, teams, node):
    from scheduling.choices import ActorKind, JobState
    from scheduling.jobs.transitions import job_transition

    job = _submit(alice, teams["training"], name="at-once")
    for state, actor in ((JobState.PLACED, ActorKind.SCHEDULER), (JobState.RUNNING, ActorKind.AGENT)):
        job_transition(job=job, to_state=state, actor_kind=actor, code=state)
    bar = _signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    bar = " ".join(html.unescape(bar[bar.index('class="phases"') :].split("</div></div>")[0]).split())
    # It read "waiting in the queue · 0 s", "starting · 0 s" before "running".
    assert "waiting in the queue" not in bar and "starting" not in bar and "running · " in bar
    # A job whose whole life took less than a second still has its bar (the card was left empty).
    job_transition(job=job, to_state=JobState.SUCCEEDED, actor_kind=ActorKind.AGENT, code="exited")
    bar = _signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    bar = " ".join(html.unescape(bar[bar.index('class="phases"') :].split("</div></div>")[0]).split())
    assert "running · under 1 s" in bar and "0 s" not in bar
