"""Reports: the static curves plot from `--json` output, and scenario runs write JSON, CSV and PNG files."""

from __future__ import annotations

import csv
import json

import pytest

from scheduling.sim.cli_dynamic import run_scenario
from scheduling.sim.report import load_static_results, plot_alloc_vs_arrival, write_run_report


def test_it_plots_allocation_against_arrival_from_static_json(tmp_path):
    for policy, offset in (("fgd", 0.0), ("bestfit", 2.5)):
        curve = {str(x): min(x, 100 - offset) for x in range(0, 131)}
        (tmp_path / f"{policy}.json").write_text(
            json.dumps({"policy": policy, "alloc_curve": curve, "unallocated_pct_at_100": offset})
        )
    results = load_static_results(sorted(tmp_path.glob("*.json")))
    assert set(results) == {"fgd", "bestfit"}
    png = plot_alloc_vs_arrival(results, tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_three_teams_example_survives_its_node_failure_and_reports_fairness(tmp_path):
    _, results, summary = run_scenario("three-teams", policies=["tessera"])
    figures = summary["policies"]["tessera"]
    assert figures["node_failures"] == 1
    assert set(figures["quota_satisfaction"]) == {"vision", "speech", "nlp"}
    assert all(0 <= v <= 1 for v in figures["quota_satisfaction"].values())
    assert figures["wait_by_kind"]["training"]["never_started"] == 0
    files = write_run_report(tmp_path, "three-teams", results, summary)
    names = {f.name for f in files}
    assert {"summary.json", "tessera-jobs.csv", "tessera-series.csv", "utilization.png"} <= names
    with (tmp_path / "three-teams" / "tessera-jobs.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) >= figures["jobs_arrived"]  # one row per job of the workload, arrived or not
    assert {"wait_s", "preemptions", "lost_work_s", "team"} <= set(rows[0])


def test_the_plotted_bins_average_to_the_reported_utilization():
    from scheduling.sim.metrics import summarize
    from scheduling.sim.report import _binned

    _, results, _ = run_scenario("seed-case", policies=["tessera"])
    result = results["tessera"]
    _, used, _ = _binned(result, lambda p: p.used_milli / result.capacity_milli)
    assert sum(used) / len(used) == pytest.approx(summarize(result)["utilization"], abs=1e-3)
