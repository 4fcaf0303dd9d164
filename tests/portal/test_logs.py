"""Logs (docs/operations.md, "Logs"): timestamp, level and logger on every line; LOG_FORMAT=json writes one JSON
object per line; a request's lines carry its id, which the response returns; a job's state change is logged once,
with its id; the Celery worker and beat log the same way."""

from __future__ import annotations

import copy
import io
import json
import logging
import logging.config
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+[ :]"
)


@pytest.fixture
def portal_log(settings):
    """The portal's LOGGING with its console writing to a buffer: `portal_log("json")` -> the buffer."""
    configured = copy.deepcopy(settings.LOGGING)

    def configure(log_format: str = "text") -> io.StringIO:
        buf = io.StringIO()
        config = copy.deepcopy(configured)
        config["formatters"]["tessera"]["()"] = (
            "agent.logformat.JsonFormatter" if log_format == "json" else "agent.logformat.TextFormatter"
        )
        config["handlers"]["console"]["stream"] = buf
        logging.config.dictConfig(config)
        return buf

    yield configure
    logging.config.dictConfig(configured)


def _json_lines(buf: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_a_portal_line_has_timestamp_level_and_logger(portal_log):
    buf = portal_log()
    logging.getLogger("scheduling.cycle.runner").info("cycle %s", {"epoch": 1})
    line = buf.getvalue().splitlines()[-1]
    assert TEXT_LINE.match(line) and line.endswith("INFO scheduling.cycle.runner: cycle {'epoch': 1}"), line


@pytest.mark.django_db
def test_json_lines_carry_the_request_id_the_response_returns_and_a_4xx_is_logged_once(portal_log, client):
    buf = portal_log("json")
    response = client.get("/no-such-page/", HTTP_X_REQUEST_ID="trace-42-abc")
    assert response.status_code == 404 and response["X-Request-ID"] == "trace-42-abc"
    lines = _json_lines(buf)
    assert all({"ts", "level", "logger", "message"} <= set(line) for line in lines)
    assert all(line["ts"].endswith("Z") for line in lines)
    about = [line for line in lines if "/no-such-page/" in line["message"]]
    assert len(about) == 1, lines  # the access line, not Django's "Not Found" as well
    assert about[0]["request_id"] == "trace-42-abc"
    assert (about[0]["logger"], about[0]["level"]) == ("tessera.access", "WARNING")


@pytest.mark.django_db
@pytest.mark.parametrize("header", ["", "x" * 65, "a b", "évil", "id\nforged"])
def test_an_insane_request_id_is_replaced_by_a_new_one(portal_log, client, header):
    buf = portal_log("json")
    response = client.get("/no-such-page/", HTTP_X_REQUEST_ID=header)
    new = response["X-Request-ID"]
    assert new != header and re.fullmatch(r"[0-9a-f]{32}", new)
    assert _json_lines(buf)[-1]["request_id"] == new


@pytest.mark.django_db(transaction=True)
def test_a_request_lines_carry_its_id_and_a_job_line_its_job_id(portal_log, alice, teams, node):
    """A submit through the API, committed inside the request as in production: its state change is one line
    with both ids."""
    from rest_framework.test import APIClient

    from quotas.tokens import api_token_create

    buf = portal_log("json")
    _, token = api_token_create(user=alice, name="tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = client.post("/api/v1/jobs/", {"name": "t", "command": "python t.py", "gpus": 1}, format="json")
    assert response.status_code == 201, response.json()
    rid, job_id = response["X-Request-ID"], response.json()["id"]
    job_lines = [line for line in _json_lines(buf) if line["logger"] == "tessera.jobs"]
    assert len(job_lines) == 1, job_lines
    assert (job_lines[0]["job_id"], job_lines[0]["request_id"]) == (job_id, rid)
    assert "pending (submitted)" in job_lines[0]["message"]


@pytest.mark.django_db
def test_each_job_state_change_is_logged_once_with_its_job_id(
    caplog, alice, teams, node, django_capture_on_commit_callbacks
):
    from scheduling.choices import ActorKind, JobState
    from scheduling.jobs.fields import JobSpec
    from scheduling.jobs.submit import job_submit
    from scheduling.jobs.transitions import job_transition

    caplog.set_level(logging.INFO, logger="tessera.jobs")
    with django_capture_on_commit_callbacks(execute=True):
        job = job_submit(submitter=alice, team=teams["training"], spec=JobSpec(name="t", command="x", gpus=1))
        for state, actor in (
            (JobState.PLACED, ActorKind.SCHEDULER),
            (JobState.RUNNING, ActorKind.AGENT),
            (JobState.SUCCEEDED, ActorKind.AGENT),
        ):
            job_transition(job=job, to_state=state, actor_kind=actor, code=state)
    records = [r for r in caplog.records if r.name == "tessera.jobs"]
    assert [r.getMessage().split(": ")[1].split(" (")[0] for r in records] == [
        "pending",
        "pending -> placed",
        "placed -> running",
        "running -> succeeded",
    ]
    assert {r.job_id for r in records} == {job.pk}


def test_log_format_json_in_the_environment_makes_the_portal_and_celery_write_json(tmp_path):
    """Through settings as a process starts: Django's setup, and Celery's (worker and beat) via its signal."""
    code = (
        "import django, logging; django.setup();"
        "logging.getLogger('tessera.test').warning('from django', extra={'job_id': 7});"
        "from portal.celery import app; from celery.utils.log import get_task_logger;"
        "app.log.setup_logging_subsystem(loglevel='INFO');"
        "get_task_logger('scheduling.tasks').info('from celery')"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "LOG_FORMAT": "json",
        "TESSERA_VAR_DIR": str(tmp_path),
        "DATABASE_URL": "",
        "REDIS_URL": "",
    }
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    by_message = {line["message"]: line for line in lines}
    assert by_message["from django"]["job_id"] == 7 and by_message["from django"]["level"] == "WARNING"
    assert by_message["from celery"]["logger"] == "scheduling.tasks"


@pytest.mark.django_db
def test_a_refusal_is_one_warning_without_a_traceback_and_a_5xx_keeps_its_traceback(
    portal_log, client, alice, node
):
    """Django logs a PermissionDenied with its traceback; a refusal the portal meant is no fault, so its line stays
    and the trace goes. A server error keeps its traceback."""
    buf = portal_log("json")
    client.force_login(alice)
    response = client.post(f"/cluster/{node.name}/state/", {"state": "cordoned"})
    assert response.status_code == 403
    refused = [line for line in _json_lines(buf) if line["logger"] == "django.request"]
    assert refused and all("Forbidden" in line["message"] for line in refused), refused
    assert not any("exc_info" in line or "Traceback" in json.dumps(line) for line in refused), refused
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("django.request").error(
            "Internal Server Error", exc_info=True, extra={"status_code": 500}
        )
    assert "Traceback" in json.dumps(_json_lines(buf)[-1])
