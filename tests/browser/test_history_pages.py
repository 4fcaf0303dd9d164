"""The history and capacity pages in Chromium: with two days of generated history behind the live cluster (the
demo's backfill), the charts are drawn (uPlot canvases with their legends and axis labels), the heatmap has a
row per pool with its legend, and a pool opens into its nodes. Screenshots under test-artifacts/."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def with_history(cluster_for_test):
    """Two days of generated history, ending at the start of the first hour the cluster's own recorder wrote.
    The recorder adds each minute into its hour's rows, and the usage roll rewrites the last two hours from the
    jobs, from the cluster's start on; the backfill inserts. Ending at the first recorded minute collided with
    the hour rows once the recorder had run (a later test in the package, a slow start): a unique violation."""
    from demo.history import history_backfill
    from scheduling.history.models import ClusterMinute, NodeHour, UsageHour

    recorded = [
        ClusterMinute.objects.order_by("at").values_list("at", flat=True).first(),
        NodeHour.objects.order_by("hour").values_list("hour", flat=True).first(),
        UsageHour.objects.order_by("hour").values_list("hour", flat=True).first(),
    ]
    until = min([t for t in recorded if t is not None] + [datetime.now(UTC)])
    history_backfill(days=2, now=until.replace(minute=0, second=0, microsecond=0))
    return cluster_for_test


def test_history_and_capacity_draw_their_charts_and_heatmap(browse, with_history):
    page = browse("alice")
    page.goto("/history/?window=7d")
    page.wait_for_selector("[data-chart='chart-usage'] canvas")
    assert page.locator(".chart canvas").count() == 3
    legend = page.locator("[data-chart='chart-usage'] .u-legend").inner_text()
    assert "pipe-lab" in legend  # the teams' series, by name
    # uPlot draws its axes on the canvas: the labels it was given are the chart's JSON.
    assert '"label": "GPU-hours per day"' in page.locator("#chart-usage").text_content()
    assert page.get_by_role("table").filter(has_text="By team").count() == 1
    browse.shots(page, "history")

    page.goto("/capacity/?window=7d")
    page.wait_for_selector("[data-chart='chart-stranded'] canvas")
    assert page.locator(".heatmap .heat-row").count() >= 2  # the ticks and at least one pool
    assert "90–100 %" in page.locator(".heat-legend").inner_text()
    # The newest recorded cell (the window's last bucket may hold no record yet: the backfill ends where the
    # cluster's recorder began, and early in a bucket, on a cluster just started, the recorder has not written it).
    cell = page.locator(".heatmap .heat-cells i:not([title$='no record'])").last
    assert "allocated" in cell.get_attribute("title")
    browse.shots(page, "capacity")

    page.locator(".heatmap .heat-label a").first.click()
    page.wait_for_selector("text=All pools")
    assert "Nodes 1–" in page.locator("#heatmap").inner_text()
    browse.shots(page, "capacity-pool")
    assert not page.errors
