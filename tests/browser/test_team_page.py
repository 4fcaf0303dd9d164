"""A team's page in the browser: the chargeback CSV a member downloads is, row for row, what the usage API
answers for the same range."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import pytest

from tests.browser.test_portal import _expect_text
from tests.pipeline.harness import submit, wait_state

pytestmark = pytest.mark.slow


def test_the_downloaded_chargeback_csv_equals_the_usage_api(browse):
    done = wait_state(
        submit(browse.cluster, name="charged", command="sleep 2", gpus=1), "succeeded", timeout_s=60
    )
    page = browse("alice")
    page.goto("/teams/pipe-lab/")
    _expect_text(page, "#chargeback", "charged|A100-80GB|GPU-hours")
    browse.shots(page, "team")
    with page.expect_download() as downloading:
        page.click("#chargeback a[download]")
    ours = list(csv.DictReader(io.StringIO(open(downloading.value.path(), encoding="utf-8").read())))
    since = page.input_value("#chargeback input[name=since]")
    start = datetime.fromisoformat(since).replace(tzinfo=UTC).isoformat().replace("+00:00", "Z")
    api = page.request.get(f"/api/v1/usage/?team=pipe-lab&group_by=team,user,model&since={start}&format=csv")
    theirs = list(csv.DictReader(io.StringIO(api.text())))
    assert any(r["user"] == "alice" and r["model"] == "A100-80GB" and float(r["gpu_hours"]) > 0 for r in ours)
    assert ours == theirs, (ours, theirs, done.pk)
