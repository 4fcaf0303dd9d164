// Tessera job page (/jobs/<id>/): the per-GPU utilisation and memory charts (uPlot) fed by the stream's job.metrics
// samples as they arrive, and the logs, read from the API and followed on each logs.appended event. Both come as
// data, not HTML, so they are drawn here; the rest of the page is htmx's parts.
(function () {
  "use strict";
  const SERIES_POINTS = 300;
  const COLOURS = ["#2f6fb5", "#d9822b", "#3c9a5f", "#b5452f", "#7a4fb5", "#2f9fb5", "#b5a42f", "#555"];

  // --- charts --------------------------------------------------------------------------------------------
  const series = { t: [], util: {}, mem: {} };
  let charts = null;
  function onMetrics(msg) {
    const panel = document.getElementById("metrics");
    if (!panel || String(msg.job_id) !== panel.dataset.job || !window.uPlot) return;
    const gpus = msg.gpus || [];
    const empty = document.getElementById("metrics-empty");
    if (empty) empty.hidden = true;
    series.t.push(msg.at || Date.now() / 1000);
    gpus.forEach(function (g) {
      const key = msg.node + " GPU " + g.index;
      (series.util[key] = series.util[key] || []);
      (series.mem[key] = series.mem[key] || []);
    });
    Object.keys(series.util).forEach(function (key) {
      const g = gpus.find(function (x) { return msg.node + " GPU " + x.index === key; });
      series.util[key].push(g ? g.util_pct : null);
      series.mem[key].push(g && g.memory_used_mib != null ? g.memory_used_mib / 1024 : null);
    });
    if (series.t.length > SERIES_POINTS) {
      series.t.shift();
      Object.keys(series.util).forEach(function (k) { series.util[k].shift(); series.mem[k].shift(); });
    }
    draw(panel);
  }
  function draw(panel) {
    const keys = Object.keys(series.util);
    const width = Math.max(280, Math.min(560, (panel.clientWidth - 40) / 2));
    function opts(title, unit, max) {
      return {
        title: title, width: width, height: 180,
        scales: { y: { range: [0, max] } },
        axes: [{}, { size: 64, values: function (u, v) { return v.map(function (x) { return (Math.round(x * 10) / 10) + unit; }); } }],
        series: [{}].concat(keys.map(function (k, i) { return { label: k, stroke: COLOURS[i % COLOURS.length], width: 2 }; })),
      };
    }
    const util = [series.t].concat(keys.map(function (k) { return series.util[k]; }));
    const mem = [series.t].concat(keys.map(function (k) { return series.mem[k]; }));
    const memMax = Math.max(1, ...mem.slice(1).flat().filter(function (x) { return x != null; })) * 1.2;
    if (!charts || charts.keys !== keys.join("|")) {
      document.getElementById("chart-util").innerHTML = "";
      document.getElementById("chart-mem").innerHTML = "";
      charts = {
        keys: keys.join("|"),
        util: new uPlot(opts("Utilisation", "%", 100), util, document.getElementById("chart-util")),
        mem: new uPlot(opts("Memory in use on the card", " GiB", memMax), mem, document.getElementById("chart-mem")),
      };
    } else {
      charts.util.setData(util);
      charts.mem.setData(mem);
    }
  }

  // --- logs ----------------------------------------------------------------------------------------------
  function setupLogs() {
    const panel = document.getElementById("logs");
    if (!panel) return;
    const job = panel.dataset.job;
    const pre = document.getElementById("log-text");
    const follow = document.getElementById("log-follow");
    let stream = "stdout", offset = null, busy = false, again = false, generation = 0;
    function url() {
      const base = "/api/v1/jobs/" + job + "/logs/?stream=" + stream;
      return offset === null ? base + "&tail=1000" : base + "&offset=" + offset;
    }
    function load() {
      if (busy) { again = true; return; }
      busy = true;
      const asked = generation; // a tab switch while this is in flight makes its answer stale
      fetch(url(), { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
        .then(function (data) {
          if (asked !== generation) { again = true; return; }
          if (offset === null) pre.textContent = data.text || (data.size ? "" : "Nothing written to " + stream + " yet.");
          else if (data.text) {
            if (/^Nothing written to /.test(pre.textContent) || /^No output yet/.test(pre.textContent)) pre.textContent = "";
            pre.textContent += data.text;
          }
          offset = data.next_offset;
          if (follow && follow.checked) pre.scrollTop = pre.scrollHeight;
        })
        .catch(function () {})
        .finally(function () { busy = false; if (again) { again = false; load(); } });
    }
    panel.querySelectorAll("[role=tab]").forEach(function (tab) {
      tab.addEventListener("click", function () {
        panel.querySelectorAll("[role=tab]").forEach(function (t) { t.setAttribute("aria-selected", String(t === tab)); });
        pre.setAttribute("aria-labelledby", tab.id);
        stream = tab.dataset.streamName; offset = null; generation += 1; load();
      });
    });
    document.addEventListener("tessera:logs.appended", load);
    document.addEventListener("tessera:catch-up", load); // the socket (re)opened, or every 5 s while it is down
    document.addEventListener("htmx:afterSwap", load); // a state change may come with the last lines
    load();
  }

  document.addEventListener("tessera:job.metrics", function (e) { onMetrics(e.detail); });
  document.addEventListener("DOMContentLoaded", setupLogs);
})();
