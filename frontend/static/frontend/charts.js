// Tessera charts: a uPlot chart in each element marked data-chart="<id>", drawn from the JSON the server wrote
// in <script type="application/json" id="<id>"> (Django's json_script). Everything a chart says comes from
// that JSON, so a page needs no script of its own:
//   { "title": "…", "t": [Unix seconds…],
//     "series": [{ "label": "…", "values": [number|null…], "dash": false, "colour": "#hex" (optional) }],
//     "y": { "label": "GPU-hours per day", "unit": "GPU-h", "min": 0, "max": null (a floor for the top:
//            the data still fits when it goes above) },
//     "x": { "min": Unix s, "max": Unix s | null (now, for what still runs) } (optional: else the data's span),
//     "x_label": "Day (UTC)", "x_days": true (ticks are UTC days), "kind": "line" | "bars", "stacked": false,
//     "sync": "<key>" (charts of one key hide and show their lines together), "span_gaps": false }
// Each line's legend entry is a toggle: click (or Enter) hides or shows it, Ctrl-click shows it alone.
// Charts are drawn once the page loads, again when a refreshed part brings new ones, and resized with the page;
// a page with live samples adds them with TesseraCharts.append (job.js).
(function () {
  "use strict";
  const COLOURS = ["#2f6fb5", "#d9822b", "#3c9a5f", "#b5452f", "#7a4fb5", "#2f9fb5", "#b5a42f", "#c2589a", "#6b7b8c", "#8c6d46"];
  const HEIGHT = 240;
  // The time axis' tick steps (s): uPlot's own skip from 1 to 5 minutes, which left a 10-minute run two ticks.
  // Samples are a second apart at the finest, so no tick is finer than a second (a 3-second-old job read 18:39:55.5).
  const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
    43200, 86400, 2 * 86400, 7 * 86400, 14 * 86400, 30 * 86400];
  const MAX_POINTS = 3600; // a live chart keeps its last hour of one-second samples
  const drawn = new Map(); // element -> { chart: uPlot, spec }; a chart with nothing to draw has no chart

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
  // Times as a person reads them, in the browser's timezone: 14:05:30 for seconds, 14:05 for minutes and hours.
  function clock(ts, seconds) {
    const opts = { hour: "2-digit", minute: "2-digit", hourCycle: "h23" };
    if (seconds) opts.second = "2-digit";
    return new Date(ts * 1000).toLocaleTimeString(undefined, opts);
  }
  function localDay(ts) {
    return new Date(ts * 1000).toLocaleDateString(undefined, { month: "short", day: "numeric" });
  }
  function when(ts, days, seconds) {
    const d = new Date(ts * 1000);
    if (days) return d.toLocaleDateString(undefined, { weekday: "short", month: "short", day: "numeric", timeZone: "UTC" });
    return localDay(ts) + " " + clock(ts, seconds);
  }
  // The time axis' labels: HH:MM:SS when the ticks are seconds apart, HH:MM when minutes or hours apart (with the
  // day under the first tick of each day when the span passes midnight), the day alone when days apart.
  function timeTicks(u, splits, axisIdx, space, incr) {
    const seconds = incr < 60;
    const multiDay = localDay(u.scales.x.min) !== localDay(u.scales.x.max);
    let lastDay = null;
    return splits.map(function (ts) {
      if (incr >= 86400) return localDay(ts);
      let label = clock(ts, seconds);
      const d = localDay(ts);
      if (multiDay && d !== lastDay) label += "\n" + d;
      lastDay = d;
      return label;
    });
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

  // The x range: the spec's bounds (a job's life: its start to its end, or to now while it runs), else the data's.
  // Read from the data itself: for a single point uPlot offers a range of a thousand days around it.
  function xRange(spec, min, max) {
    const t = spec.t || [];
    const x = spec.x || {};
    const first = t.length ? t[0] : min;
    const last = t.length ? t[t.length - 1] : max;
    let lo = x.min != null ? x.min : first;
    let hi = x.max != null ? x.max : (spec.x ? Math.max(last == null ? -Infinity : last, Date.now() / 1000) : last);
    if (lo == null || hi == null) return [min, max];
    if (hi <= lo) { // a life of no length still has an axis; a single sample, a minute either side
      if (spec.x) hi = lo + 1;
      else { lo -= 60; hi += 60; }
    }
    return [lo, hi];
  }

  function options(spec, shaped, width) {
    const unit = (spec.y && spec.y.unit) || "";
    const bars = spec.kind === "bars";
    const t = spec.t;
    const step = t.length > 1 ? t[1] - t[0] : 86400;
    const span = function (u) { return u.scales.x.max - u.scales.x.min; };
    const series = [{
      label: spec.x_days ? "Day" : "Time",
      value: function (u, v) { return v == null ? "–" : when(v, spec.x_days, span(u) < 3600); },
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
        points: bars ? { show: false } : {}, // lines: uPlot marks each sample where they are few
        spanGaps: !!spec.span_gaps,
        value: function (u, v, si, idx) {
          const own = idx == null ? null : shaped.raw[pos][idx];
          return own == null ? "–" : number(own) + " " + unit;
        },
      });
    });
    const xAxis = { label: spec.x_label || "", labelSize: 20, size: 54, space: 64, incrs: TIME_STEPS, values: timeTicks };
    if (spec.x_days) {
      xAxis.splits = function () {
        const every = Math.max(1, Math.ceil(t.length / Math.max(2, Math.floor(width / 70))));
        return t.filter(function (_, k) { return k % every === 0; });
      };
      xAxis.values = function (u, splits) { return splits.map(day); };
    }
    const y = spec.y || {};
    const cursor = { points: { show: !bars } };
    if (spec.sync) cursor.sync = { key: spec.sync, setSeries: true };
    return {
      title: spec.title,
      width: width,
      height: HEIGHT,
      cursor: cursor,
      legend: { isolate: false },
      scales: {
        x: {
          time: true,
          range: bars ? function (u, min, max) { return [min - step / 2, max + step / 2]; }
            : function (u, min, max) { return xRange(spec, min, max); },
        },
        y: {
          // The top holds the data: at least the spec's top (100 %, the card's memory), higher if a value is.
          range: function (u, min, max) {
            const top = y.max != null ? Math.max(y.max, max || 0) : Math.max(1, max) * 1.1;
            return [y.min != null ? y.min : 0, top];
          },
        },
      },
      axes: [xAxis, {
        label: y.label || unit, labelSize: 20, size: 56,
        values: function (u, splits) { return splits.map(number); },
      }],
      series: series,
      hooks: { setSeries: [markLegend] },
    };
  }

  // uPlot's legend rows toggle their line on a click; here they are also buttons to the keyboard and to a reader.
  function markLegend(u) {
    u.root.querySelectorAll(".u-legend .u-series").forEach(function (row, i) {
      if (i === 0) return;
      row.setAttribute("aria-pressed", String(u.series[i].show !== false));
    });
  }
  function legendButtons(u, spec) {
    if (spec.kind === "bars" && !spec.stacked && spec.series.length < 2) return;
    u.root.querySelectorAll(".u-legend .u-series").forEach(function (row, i) {
      if (i === 0) return;
      row.setAttribute("role", "button");
      row.tabIndex = 0;
      row.title = "Hide or show " + u.series[i].label + " (Ctrl-click: show it alone)";
      row.addEventListener("keydown", function (e) {
        if (e.key !== "Enter" && e.key !== " ") return;
        e.preventDefault();
        const target = row.querySelector(".u-label") || row.firstElementChild || row;
        target.dispatchEvent(new MouseEvent("click", { bubbles: true, ctrlKey: e.ctrlKey, metaKey: e.metaKey }));
      });
    });
    markLegend(u);
  }

  function widthOf(el) {
    return Math.max(280, Math.floor(el.getBoundingClientRect().width || (el.parentElement || el).clientWidth || 600));
  }

  function render(el, spec) {
    const old = drawn.get(el);
    const hidden = {};
    if (old && old.chart) {
      old.chart.series.forEach(function (s, i) { if (i && s.show === false) hidden[s.label] = true; });
      old.chart.destroy();
    }
    drawn.set(el, { chart: null, spec: spec });
    el.innerHTML = "";
    if (!spec.series || !spec.series.length || (!spec.x && (!spec.t || !spec.t.length))) {
      el.innerHTML = '<p class="hint">' + (spec.title ? spec.title + ": " : "") + "nothing recorded yet.</p>";
      return;
    }
    // Legend rows are buttons: a figure, not an image, so a reader reaches them.
    if (el.getAttribute("role") === "img") el.setAttribute("role", "figure");
    const shaped = shape(spec);
    const chart = new uPlot(options(spec, shaped, widthOf(el)), [spec.t].concat(shaped.data), el);
    chart.series.forEach(function (s, i) { if (i && hidden[s.label]) chart.setSeries(i, { show: false }); });
    legendButtons(chart, spec);
    drawn.set(el, { chart: chart, spec: spec });
  }

  function draw(el) {
    const source = document.getElementById(el.dataset.chart);
    if (!source || !window.uPlot) return;
    let spec;
    try { spec = JSON.parse(source.textContent); } catch (e) { return; }
    render(el, spec);
  }

  // One sample more, at Unix time t: label -> value (a line it does not name gets a gap). A new label adds a line.
  function append(el, t, values) {
    const entry = drawn.get(el);
    if (!entry) return;
    const spec = entry.spec;
    if (spec.x && spec.x.max != null && t > spec.x.max) spec.x.max = null; // a sample after its end: it runs again
    let added = false;
    Object.keys(values).forEach(function (label) {
      if (!spec.series.some(function (s) { return s.label === label; })) {
        spec.series.push({ label: label, values: spec.t.map(function () { return null; }) });
        added = true;
      }
    });
    let k = spec.t.length;
    while (k > 0 && spec.t[k - 1] > t) k -= 1; // samples of a job's nodes may come a little out of order
    // A gang's nodes sample a fraction of a second apart: a sample whose GPUs have nothing at the time less than a
    // second before it joins that time. Each at a time of its own, every line had a gap at every other point and
    // was drawn as dots.
    const joins = k > 0 && t - spec.t[k - 1] < 1 && Object.keys(values).every(function (label) {
      const s = spec.series.find(function (x) { return x.label === label; });
      return s.values[k - 1] == null;
    });
    if (k > 0 && (spec.t[k - 1] === t || joins)) {
      spec.series.forEach(function (s) { if (values[s.label] != null) s.values[k - 1] = values[s.label]; });
    } else {
      spec.t.splice(k, 0, t);
      spec.series.forEach(function (s) { s.values.splice(k, 0, values[s.label] != null ? values[s.label] : null); });
    }
    if (spec.t.length > MAX_POINTS) {
      spec.t.shift();
      spec.series.forEach(function (s) { s.values.shift(); });
    }
    if (added || !entry.chart) { render(el, spec); return; }
    entry.chart.setData([spec.t].concat(shape(spec).data));
  }

  // What ran has ended at Unix time t: the axis stops there.
  function end(el, t) {
    const entry = drawn.get(el);
    if (!entry || !entry.spec.x || entry.spec.x.max != null) return;
    entry.spec.x.max = t;
    if (entry.chart) entry.chart.setScale("x", { min: entry.chart.scales.x.min, max: t });
  }

  function drawAll(root) {
    (root || document).querySelectorAll("[data-chart]").forEach(draw);
  }

  let resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () {
      drawn.forEach(function (entry, el) { if (entry.chart) entry.chart.setSize({ width: widthOf(el), height: HEIGHT }); });
    }, 150);
  });
  document.addEventListener("DOMContentLoaded", function () { drawAll(); });
  document.addEventListener("htmx:afterSwap", function (e) { drawAll(e.target); });
  window.TesseraCharts = {
    draw: draw,
    drawAll: drawAll,
    append: append,
    end: end,
    chart: function (el) { const entry = drawn.get(el); return entry && entry.chart; },
  };
})();
