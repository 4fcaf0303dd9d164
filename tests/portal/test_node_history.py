"""A node's page charts its GPUs over the chosen window: from the portal's rollups, or from a real Prometheus
(its TSDB filled by promtool from OpenMetrics samples) where PROMETHEUS_URL is set, falling back to the rollups
when Prometheus does not answer."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest
import requests
from asgiref.sync import async_to_sync
from django.test import Client

from scheduling.agents.live_metrics import live_metrics_store
from scheduling.history import recorder
from tests.support import refusing_address, start_on_free_port

pytestmark = pytest.mark.django_db


def _chart(page: str, key: str) -> dict:
    found = re.search(rf'<script id="chart-node-{key}" type="application/json">(.*?)</script>', page, re.S)
    assert found, f"no {key} chart"
    return json.loads(found.group(1))


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_node_page_charts_its_gpus_from_the_rollups_with_a_time_picker(alice, node):
    now = datetime.now(UTC)
    for minutes_ago, util in ((7, 40.0), (1, 80.0)):
        gpus = [
            {
                "index": 0,
                "uuid": "GPU-test-0",
                "util_pct": util,
                "temperature_c": 55,
                "power_w": 250.0,
                "sm_clock_mhz": 1410,
                "memory_used_mib": 2048,
            }
        ]
        async_to_sync(live_metrics_store)(node_name=node.name, sampled_at=now.timestamp(), gpus=gpus)
        recorder.history_record(now=now - timedelta(minutes=minutes_ago))
    recorder.gpu_events_record(node_id=node.pk, gpus=[{"uuid": "GPU-test-0", "xid_events": [79]}])
    page = _signed_in(alice).get(f"/cluster/{node.name}/?window=1h").content.decode()
    assert "each GPU&#x27;s mean over 5-minute windows" in page
    util = _chart(page, "util_pct")
    assert util["series"][0]["label"] == "GPU 0"
    assert sorted(v for v in util["series"][0]["values"] if v is not None) == [40.0, 80.0]
    assert _chart(page, "temperature_c")["y"]["unit"] == "°C"
    assert ">79<" in page  # the XID event, in the window's table
    assert 'aria-current="page">1h<' in page
    assert _signed_in(alice).get(f"/cluster/{node.name}/?window=forever").status_code == 200


@pytest.fixture
def prometheus_with_samples(tmp_path, node):
    """A real Prometheus over a TSDB holding 50 min of utilisation samples of the node's GPU 1, a minute apart."""
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        pytest.skip("Prometheus is not installed (Debian's prometheus package)")
    now = int(time.time())
    lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    lines += [
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-test-1",Hostname="{node.name}"}} 73 {t}'
        for t in range(now - 3000, now - 60, 60)
    ]
    (tmp_path / "samples.om").write_text("\n".join([*lines, "# EOF"]) + "\n")
    tsdb = tmp_path / "tsdb"
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "samples.om"), str(tsdb)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    (tmp_path / "prometheus.yml").write_text("global: {scrape_interval: 1m}\nscrape_configs: []\n")
    log_path = tmp_path / "prometheus.log"

    def start(port: int) -> tuple[subprocess.Popen, str]:
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tsdb}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        return proc, f"http://127.0.0.1:{port}"

    def ready(started) -> bool:
        try:
            return requests.get(f"{started[1]}/-/ready", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def exited_saying(started) -> str | None:
        return None if started[0].poll() is None else log_path.read_text(errors="replace")

    # Prometheus takes only an address: started again on another port if one was taken meanwhile.
    (proc, url), _ = start_on_free_port(
        "Prometheus", start, ready, exited_saying, timeout_s=10, stop=lambda started: started[0].kill()
    )
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_with_prometheus_the_node_page_reads_its_history_from_it(
    alice, node, settings, prometheus_with_samples
):
    settings.PROMETHEUS_URL = prometheus_with_samples
    page = _signed_in(alice).get(f"/cluster/{node.name}/?window=1h").content.decode()
    assert "From Prometheus" in page
    util = _chart(page, "util_pct")
    values = [v for v in util["series"][0]["values"] if v is not None]
    assert util["series"][0]["label"] == "GPU 1" and values and set(values) == {73.0}


def test_when_prometheus_does_not_answer_the_page_says_so_and_shows_the_rollups(alice, node, settings):
    refusing, address = refusing_address()  # held for the test: nothing can start listening there meanwhile
    with refusing:
        settings.PROMETHEUS_URL = f"http://{address}"
        page = _signed_in(alice).get(f"/cluster/{node.name}/").content.decode()
    assert "did not answer" in page and "showing the portal&#x27;s own 5-minute history instead" in page
