// Tessera charts: a uPlot chart in each element marked data-chart="<id>", drawn from the JSON the server wrote
// in <script type="application/json" id="<id>"> (Django's json_script). Everything a chart says comes from
// that JSON, so a page needs no script of its own:
//   { "title": "…", "t": [Unix seconds…],
//     "series": [{ "label": "…", "values": [number|null…], "dash": false, "colour": "#hex" (optional) }],
//     "y": { "label": "GPU-hours per day", "unit": "GPU-h", "min": 0, "max": null },
//     "x_label": "Day (UTC)", "x_days": true (ticks are UTC days), "kind": "line" | "bars", "stacked": false }
// Charts are drawn once the page loads, again when a refreshed part brings new ones, and resized with the page.
(function () {
  "use strict";
  const COLOURS = ["#2f6fb5", "#d9822b", "#3c9a5f", "#b5452f", "#7a4fb5", "#2f9fb5", "#b5a42f", "#c2589a", "#6b7b8c", "#8c6d46"];
  const HEIGHT = 240;
  const drawn = new Map(); // element -> uPlot

  function number(v) {
    if (v == null || isNaN(v)) return "–";
    const a = Math.abs(v);
    if (a >= 100) return Math.round(v).toLocaleString();
    if (a >= 10) return (Math.round(v * 10) / 10).toLocaleString();
    return (Math.round(v * 100) / 100).toLocaleString();
  }
  function day(ts) {
    return new Date(ts * 1000).toLocaleDateString(undefined, { month: "short", day: "numeric", timeZone: "UTC" });
  }
  function when(ts, days) {
    const d = new Date(ts * 1000);
    return days ? d.toLocaleDateString(undefined, { weekday: "short", month: "short", day: "numeric", timeZone: "UTC" })
      : d.toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
  }

  // Stacked: each series is drawn to the sum of itself and those below it, the top of the stack first so the
  // lower ones paint over it; the legend still shows each series' own value.
  function shape(spec) {
    const raw = spec.series.map(function (s) { return s.values; });
    if (!spec.stacked) return { order: spec.series.map(function (_, i) { return i; }), data: raw, raw: raw };
    const sums = [];
    raw.forEach(function (values, i) {
      sums.push(values.map(function (v, k) { return (v || 0) + (i ? sums[i - 1][k] : 0); }));
    });
    // An empty day draws no sliver of a bar.
    sums.forEach(function (row) { row.forEach(function (v, k) { if (!v) row[k] = null; }); });
    const order = raw.map(function (_, i) { return raw.length - 1 - i; });
    return { order: order, data: order.map(function (i) { return sums[i]; }), raw: order.map(function (i) { return raw[i]; }) };
  }

  function options(spec, shaped, width) {
    const unit = (spec.y && spec.y.unit) || "";
    const bars = spec.kind === "bars";
    const t = spec.t;
    const step = t.length > 1 ? t[1] - t[0] : 86400;
    const series = [{
      label: spec.x_days ? "Day" : "Time",
      value: function (u, v) { return v == null ? "–" : when(v, spec.x_days); },
    }];
    shaped.order.forEach(function (i, pos) {
      const s = spec.series[i];
      const colour = s.colour || COLOURS[i % COLOURS.length];
      series.push({
        label: s.label,
        stroke: colour,
        width: bars ? 1 : 2,
        dash: s.dash ? [6, 4] : undefined,
        fill: bars ? colour + (spec.stacked ? "e6" : "b3") : undefined,
        paths: bars ? uPlot.paths.bars({ size: [0.8, 60], align: 0 }) : undefined,
        points: { show: false },
        value: function (u, v, si, idx) {
          const own = idx == null ? null : shaped.raw[pos][idx];
          return own == null ? "–" : number(own) + " " + unit;
        },
      });
    });
    const xAxis = { label: spec.x_label || "", labelSize: 20, size: 54 };
    if (spec.x_days) {
      xAxis.splits = function () {
        const every = Math.max(1, Math.ceil(t.length / Math.max(2, Math.floor(width / 70))));
        return t.filter(function (_, k) { return k % every === 0; });
      };
      xAxis.values = function (u, splits) { return splits.map(day); };
    }
    const y = spec.y || {};
    return {
      title: spec.title,
      width: width,
      height: HEIGHT,
      cursor: { points: { show: !bars } },
      scales: {
        x: { time: true, range: bars ? function (u, min, max) { return [min - step / 2, max + step / 2]; } : undefined },
        y: {
          range: function (u, min, max) {
            const top = y.max != null ? y.max : Math.max(1, max) * 1.1;
            return [y.min != null ? y.min : 0, top];
          },
        },
      },
      axes: [xAxis, {
        label: y.label || unit, labelSize: 20, size: 56,
        values: function (u, splits) { return splits.map(number); },
      }],
      series: series,
    };
  }

  function widthOf(el) {
    return Math.max(280, Math.floor(el.getBoundingClientRect().width || (el.parentElement || el).clientWidth || 600));
  }

  function draw(el) {
    const source = document.getElementById(el.dataset.chart);
    if (!source || !window.uPlot) return;
    let spec;
    try { spec = JSON.parse(source.textContent); } catch (e) { return; }
    const old = drawn.get(el);
    if (old) { old.destroy(); drawn.delete(el); }
    el.innerHTML = "";
    if (!spec.t || !spec.t.length || !spec.series || !spec.series.length) {
      el.innerHTML = '<p class="hint">' + (spec.title ? spec.title + ": " : "") + "nothing recorded yet.</p>";
      return;
    }
    const shaped = shape(spec);
    const chart = new uPlot(options(spec, shaped, widthOf(el)), [spec.t].concat(shaped.data), el);
    drawn.set(el, chart);
  }

  function drawAll(root) {
    (root || document).querySelectorAll("[data-chart]").forEach(draw);
  }

  let resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () {
      drawn.forEach(function (chart, el) { chart.setSize({ width: widthOf(el), height: HEIGHT }); });
    }, 150);
  });
  document.addEventListener("DOMContentLoaded", function () { drawAll(); });
  document.addEventListener("htmx:afterSwap", function (e) { drawAll(e.target); });
  window.TesseraCharts = { draw: draw, drawAll: drawAll };
})();
