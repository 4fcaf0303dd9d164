"""The GPU charts as a researcher reads them: a job's axis runs over its own life (a job that failed after a second
is not drawn over years), memory up to the card's, times as HH:MM:SS or HH:MM, one line per GPU with a legend
that hides and shows lines (on a node's page too, across all its charts), a finished job keeps its charts, and a
toast does not cover them. Screenshots: a running job, the same after 10 minutes, finished, a 1 s failure, a node
of 8 GPUs."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from scheduling.history.models import GpuFiveMinute
from scheduling.history.partitions import partitions_ensure
from scheduling.inventory.models import Gpu, GpuModel, Node
from scheduling.jobs.transitions import job_cancel
from tests.browser.test_portal import _expect_text
from tests.pipeline.harness import submit, wait_state

pytestmark = pytest.mark.slow

STATE = """(sel) => {
  const el = document.querySelector(sel);
  const u = el && window.TesseraCharts && window.TesseraCharts.chart(el);
  if (!u) return null;
  const values = u.data.slice(1).flat().filter((v) => v != null);
  return { xmin: u.scales.x.min, xmax: u.scales.x.max, ymax: u.scales.y.max, points: u.data[0].length,
           labels: u.series.slice(1).map((s) => s.label), shown: u.series.slice(1).map((s) => s.show),
           ticks: u.axes[0]._values || [], top: values.length ? Math.max(...values) : null,
           now: Date.now() / 1000 };
}"""
UTIL, MEMORY = "#chart-util_pct", "#chart-memory_used_gib"
# Four seconds of samples from two nodes, 0.5 s apart, into a chart of their own: its points and each line's values.
GANG_SAMPLES = """() => {
  const data = Object.assign(document.createElement("script"), { type: "application/json", id: "gang-samples" });
  data.textContent = JSON.stringify({ title: "gang", t: [], series: [], x: { min: 1000, max: null }, y: { max: 100 } });
  const el = document.createElement("div");
  el.dataset.chart = "gang-samples";
  document.body.append(data, el);
  TesseraCharts.draw(el);
  for (let s = 0; s < 4; s++) {
    TesseraCharts.append(el, 1000.2 + s, { "n1 GPU 0": 50 });
    TesseraCharts.append(el, 1000.7 + s, { "n2 GPU 0": 60 });
  }
  const u = TesseraCharts.chart(el);
  const out = { points: u.data[0].length };
  u.series.slice(1).forEach((s, i) => { out[s.label] = u.data[i + 1].filter((v) => v != null).length; });
  el.remove();
  data.remove();
  return out;
}"""


def _chart(page, selector: str) -> dict:
    return page.evaluate(STATE, selector)


def _clock_ticks(ticks: list[str], seconds: bool = False) -> bool:
    """Every tick is a 24-hour time (HH:MM, or HH:MM:SS); the first tick of a new day adds the date on a second
    line ("00:00\nDec 4"), as it does when a test runs across midnight."""
    clock = r"\d\d:\d\d:\d\d" if seconds else r"\d\d:\d\d"
    return bool(ticks) and all(re.fullmatch(clock + r"(\n[A-Z][a-z]{2} \d{1,2})?", t) for t in ticks)


def _wait_points(page, selector: str, n: int, timeout_s: float = 30) -> dict:
    page.wait_for_function(
        "([sel, n]) => { const el = document.querySelector(sel); const u = el && window.TesseraCharts"
        " && window.TesseraCharts.chart(el); return u && u.data[0].length >= n; }",
        arg=[selector, n],
        timeout=timeout_s * 1000 * 3,
    )
    return _chart(page, selector)


def _legend(page, chart: str, label: str):
    return page.locator(f"{chart} .u-legend .u-series[role=button]", has_text=label)


def _windows(gpus, *, since, until, util, memory_mib) -> list[tuple[int, object]]:
    """The recorder's 5-minute rows of these cards over [since, until) (written or overwritten)."""
    partitions_ensure(days=[since.date(), until.date()])
    keys = []
    at = since.replace(minute=since.minute - since.minute % 5, second=0, microsecond=0)
    while at < until:
        for n, gpu in enumerate(gpus):
            GpuFiveMinute.objects.update_or_create(
                gpu_id=gpu.pk,
                at=at,
                defaults={
                    "node_id": gpu.node_id,
                    "samples": 5,
                    "util_pct_sum": 5 * util(n, at),
                    "memory_used_mib_max": memory_mib(n, at),
                    "temperature_c_max": 40 + 4 * n,
                    "power_w_sum": 5 * (100 + 30 * n),
                    "sm_clock_mhz_sum": 5 * 1410,
                },
            )
            keys.append((gpu.pk, at))
        at += timedelta(minutes=5)
    return keys


def _forget(keys) -> None:
    for gpu_id, at in keys:
        GpuFiveMinute.objects.filter(gpu_id=gpu_id, at=at).delete()


def _covered(page, a: str, b: str) -> list[str]:
    """What of `b` the element `a` covers, each with both boxes (none: nothing)."""
    return page.evaluate(
        """([a, b]) => { const r = document.querySelector(a).getBoundingClientRect();
             const box = (x) => [x.left, x.top, x.right, x.bottom].map(Math.round).join(",");
             return [...document.querySelectorAll(b)].filter((el) => { const s = el.getBoundingClientRect();
               return !(r.right <= s.left || s.right <= r.left || r.bottom <= s.top || s.bottom <= r.top); })
               .map((el) => (el.id || el.className) + " at " + box(el.getBoundingClientRect()) + " under " + box(r)); }""",
        [a, b],
    )


@pytest.mark.timeout(240, func_only=True)  # about 40 s
def test_a_running_jobs_charts_span_its_life_with_a_line_per_gpu_a_legend_and_no_toast_over_them(browse):
    job = wait_state(submit(browse.cluster, name="two-cards", command="sleep 300", gpus=2), "running")
    node = job.slices.first().gpu.node
    page = browse("alice")
    page.goto(f"/jobs/{job.pk}/")
    util = _wait_points(page, UTIL, 1)
    # From its first sample, the axis is the job's life so far: from its start to now, not years.
    started = job.started_at.timestamp()
    assert abs(util["xmin"] - started) < 1.5, util
    assert abs(util["xmax"] - util["now"]) < 5, util
    assert util["labels"] == [f"{node.name} GPU 0", f"{node.name} GPU 1"]
    util = _wait_points(page, UTIL, 3)
    assert _clock_ticks(util["ticks"], seconds=True), util["ticks"]
    # The events' times are on the same 24-hour clock as the axes (they read "8:52:36 PM" above 20:52:37).
    events = page.locator("time[data-style='absolute']").all_inner_texts()
    assert events and all(re.search(r"\b\d\d:\d\d:\d\d$", t) for t in events), events
    memory = _chart(page, MEMORY)
    assert memory["ymax"] == 80 and memory["ymax"] >= memory["top"], (
        memory
    )  # the card's 80 GiB holds the line

    # The legend hides a GPU's line in both charts, and shows it again from the keyboard.
    gpu1 = _legend(page, UTIL, "GPU 1")
    gpu1.click()
    assert gpu1.get_attribute("aria-pressed") == "false"
    assert _chart(page, UTIL)["shown"] == [True, False] and _chart(page, MEMORY)["shown"] == [True, False]
    browse.shots(page, "running-gpu-1-hidden")
    gpu1.focus()
    page.keyboard.press("Enter")
    assert _chart(page, UTIL)["shown"] == [True, True] and _chart(page, MEMORY)["shown"] == [True, True]

    # A gang's nodes send their samples a fraction of a second apart: each node's line is drawn whole, not as dots
    # between the other node's points (a sample joins the time just before it where its GPUs have nothing).
    assert page.evaluate(GANG_SAMPLES) == {"points": 4, "n1 GPU 0": 4, "n2 GPU 0": 4}

    # A toast (one's own job changed) sits in the top bar: over neither chart, whether at the page's top or with the
    # charts scrolled into view.
    page.evaluate(
        "(id) => htmx.trigger(document.body, 'tessera:job.changed', {job_id: id, state: 'failed',"
        " submitter_id: Number(document.body.dataset.userId), message: 'exit code 1 (a toast that says a lot'"
        " + ' more than fits on one line, cut short)'})",
        job.pk + 1000,
    )
    page.wait_for_selector("#toasts .toast")
    page.evaluate("window.scrollTo(0, 0)")  # the legend's focus scrolled the page
    assert _covered(page, "#toasts .toast", "#main .card, #main .chart") == []
    assert page.evaluate(
        "document.querySelector('#toasts .toast').getBoundingClientRect().bottom"
        " <= document.querySelector('header.top').getBoundingClientRect().bottom"
    ), "the toast sits in the top bar's band"
    page.evaluate("document.getElementById('metrics').scrollIntoView({block: 'end'})")
    assert _covered(page, "#toasts .toast", ".chart") == []
    page.evaluate("document.getElementById('metrics').scrollIntoView({block: 'start'})")
    assert _covered(page, "#toasts .toast", ".chart") == []
    page.evaluate("document.querySelector('.chart').scrollIntoView({block: 'start'})")
    assert _covered(page, "#toasts .toast", ".chart") == []
    page.evaluate("window.scrollTo(0, 0)")
    browse.shots(page, "running-with-toast")

    # Ten minutes into its run, as the history has it (the cards' 5-minute rows) and then live: minutes read HH:MM.
    now = timezone.now()
    job.started_at = now - timedelta(minutes=10)
    job.save(update_fields=["started_at"])
    cards = [s.gpu for s in job.slices.order_by("gpu__index")]
    keys = _windows(
        cards,
        since=job.started_at,
        until=now,
        util=lambda n, at: 60.0 + 20 * n + 3 * (at.minute % 5),
        memory_mib=lambda n, at: (30 + 12 * n) * 1024,
    )
    try:
        page.reload()
        util = _wait_points(page, UTIL, 4)
        assert abs(util["xmin"] - job.started_at.timestamp()) < 1.5, util
        assert abs(util["xmax"] - util["now"]) < 5, util
        assert _clock_ticks(util["ticks"]), util["ticks"]
        assert _chart(page, MEMORY)["ymax"] == 80
        browse.shots(page, "running-10-min")

        # It ends: the axis stops at its end, and the page opened afresh keeps its charts, from the history.
        job_cancel(job=job, actor=browse.cluster.people["alice"])
        _expect_text(page, "#job-state", "Cancelled", timeout_s=40)
        ended = wait_state(job, "cancelled")
        page.wait_for_function(
            "(sel) => { const u = TesseraCharts.chart(document.querySelector(sel));"
            " return u && Date.now() / 1000 - u.scales.x.max > 2; }",
            arg=UTIL,
        )
        page.reload()
        util = _wait_points(page, UTIL, 2)
        assert util["xmin"] == pytest.approx(ended.started_at.timestamp(), abs=0.01)
        assert util["xmax"] == pytest.approx(ended.finished_at.timestamp(), abs=0.01)
        assert util["labels"] == [f"{node.name} GPU 0", f"{node.name} GPU 1"]
        assert "From the portal's history" in page.inner_text("#metrics")
        browse.shots(page, "finished")
    finally:
        _forget(keys)
    assert page.errors == []


@pytest.mark.timeout(150, func_only=True)  # about 15 s
def test_a_job_that_fails_after_a_second_is_charted_over_that_second_not_over_years(browse):
    page = browse("alice")
    job = submit(browse.cluster, name="fails-fast", command="sleep 1; exit 3", gpus=1)
    page.goto(f"/jobs/{job.pk}/")
    _expect_text(page, "#job-state", "Failed", timeout_s=40)
    failed = wait_state(job, "failed")
    util = _chart(page, UTIL)
    if util is not None and util["points"]:  # a sample came while it ran: its axis is its life
        assert util["xmax"] - util["xmin"] < 15, util
    browse.shots(page, "failed-live")
    page.reload()
    text = page.inner_text("#metrics")
    if failed.finished_at - failed.started_at < timedelta(seconds=60):
        assert "no sample of its GPUs was kept" in text or _chart(page, UTIL) is not None
    util = _chart(page, UTIL)
    if util is not None:
        assert util["xmin"] == pytest.approx(failed.started_at.timestamp(), abs=0.01)
        assert util["xmax"] == pytest.approx(failed.finished_at.timestamp(), abs=0.01)
    # It wrote nothing and never will: its log does not say "yet".
    _expect_text(page, "#log-text", "Nothing was written to stdout.")
    browse.shots(page, "failed")
    assert page.errors == []


@pytest.mark.timeout(120, func_only=True)  # about 10 s
def test_a_node_of_eight_gpus_names_each_in_a_legend_that_hides_it_in_every_chart(browse):
    model = GpuModel.objects.get(name="A100-80GB")
    node = Node.objects.create(name="a100-eight", cpu_milli=64_000, memory_mib=512 * 1024, state="cordoned")
    keys = []
    try:
        gpus = [
            Gpu.objects.create(node=node, index=i, uuid=f"GPU-eight-{i}", model=model, memory_mib=81920)
            for i in range(8)
        ]
        now = timezone.now()
        keys = _windows(
            gpus,
            since=now - timedelta(minutes=55),
            until=now,
            util=lambda n, at: float(min(100, 10 * n + (at.minute * 7 + n * 13) % 30)),
            memory_mib=lambda n, at: int(Decimal(81920) * Decimal(n + 1) / 9),
        )
        page = browse("alice")
        page.goto(f"/cluster/{node.name}/?window=1h")
        charts = page.locator("#node-history [data-chart]")
        page.wait_for_function("document.querySelectorAll('#node-history .u-legend').length === 5")
        assert charts.count() == 5
        names = [f"GPU {i}" for i in range(8)]
        for i in range(5):
            legend = charts.nth(i).locator(".u-legend .u-series[role=button]")
            assert [re.match(r"GPU \d+", t.strip()).group(0) for t in legend.all_inner_texts()] == names
        memory = _chart(page, "[data-chart='chart-node-memory_used_gib']")
        assert memory["ymax"] == 80 and memory["top"] <= 80, memory
        assert _clock_ticks(memory["ticks"]), memory["ticks"]

        _legend(page, "[data-chart='chart-node-util_pct']", "GPU 3").click()
        hidden = [
            page.evaluate(STATE, f"[data-chart='{c}']")["shown"][3]
            for c in ("chart-node-util_pct", "chart-node-memory_used_gib", "chart-node-power_w")
        ]
        assert hidden == [False, False, False], "a GPU hidden in one chart is hidden in all of them"
        assert (
            _legend(page, "[data-chart='chart-node-power_w']", "GPU 3").get_attribute("aria-pressed")
            == "false"
        )
        browse.shots(page, "node-gpu-3-hidden")
        _legend(page, "[data-chart='chart-node-memory_used_gib']", "GPU 5").click(modifiers=["Control"])
        assert page.evaluate(STATE, "[data-chart='chart-node-temperature_c']")["shown"] == [
            n == 5 for n in range(8)
        ]
        browse.shots(page, "node-gpu-5-alone")
        assert page.errors == []
    finally:
        _forget(keys)
        node.delete()
