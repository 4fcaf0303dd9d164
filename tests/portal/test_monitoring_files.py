"""The shipped alert rules pass promtool's check and its unit tests (docs/monitoring/alerts_test.yml), every alert
has a case that fires and one that does not, and every metric the rules and the Grafana dashboard name is one the
portal exports (a renamed metric would silently empty a panel or never fire an alert)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from portal.metrics import metrics_body

MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring"
NAME = re.compile(r"\b((?:tessera|kueue)_[a-z_]+|DCGM_FI_[A-Z_]+)\b")
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")

pytestmark = pytest.mark.django_db


def _exported() -> set[str]:
    names = set()
    for family in text_string_to_metric_families(metrics_body().decode()):
        names.add(family.name)
        names.update(s.name for s in family.samples)
    return names


def _named(text: str) -> set[str]:
    return set(NAME.findall(text))


def _base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's `prometheus` package has it; CI installs it)")
    return promtool


def _alert_names() -> list[str]:
    groups = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule]


def test_the_alert_rules_pass_promtool():
    checked = subprocess.run(
        [_promtool(), "check", "rules", str(MONITORING / "alerts.yml")], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alert_names())} rules found" in checked.stdout


def test_the_alert_rules_pass_their_unit_tests():
    tested = subprocess.run(
        [_promtool(), "test", "rules", "alerts_test.yml"], capture_output=True, text=True, cwd=MONITORING
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_case_that_fires_and_one_that_does_not():
    cases = [
        check
        for test in yaml.safe_load((MONITORING / "alerts_test.yml").read_text())["tests"]
        for check in test.get("alert_rule_test", [])
    ]
    fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    names = set(_alert_names())
    assert {"TesseraPortalDown", "TesseraPortalNotReady", "TesseraRedisDown", "TesseraJobsLost"} <= names
    assert names - fires == set(), "alerts no test case fires"
    assert names - quiet == set(), "alerts with no test case where they stay quiet"


def test_every_metric_the_rules_and_the_dashboard_name_is_exported(node):
    exported = {_base(n) for n in _exported()}
    rules = _named((MONITORING / "alerts.yml").read_text())
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    named = rules | _named(exprs)
    assert {
        "tessera_scheduler_last_cycle_timestamp_seconds",
        "DCGM_FI_DEV_XID_ERRORS",
        "tessera_readiness_check",
        "tessera_jobs_lost_total",
        "tessera_agent_fence_after_seconds",
    } <= named
    missing = {n for n in named if _base(n) not in exported}
    assert not missing, f"named but not exported: {sorted(missing)}"
