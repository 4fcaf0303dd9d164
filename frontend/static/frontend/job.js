// Tessera job page (/jobs/<id>/): its per-GPU utilisation and memory charts (charts.js, drawn from the server's
// JSON: the job's history so far, its axis bounded by the job's life) take the stream's job.metrics samples as
// they arrive; the logs are read from the API and followed on each logs.appended event. Both come as data, not
// HTML, so they are drawn here; the rest of the page is htmx's parts.
(function () {
  "use strict";
  const ENDED = ["succeeded", "failed", "cancelled", "preempted", "lost"];

  // --- charts --------------------------------------------------------------------------------------------
  function jobCharts(jobId) {
    const panel = document.getElementById("metrics");
    if (!panel || String(jobId) !== panel.dataset.job || !window.TesseraCharts) return [];
    return Array.prototype.slice.call(panel.querySelectorAll("[data-chart][data-measure]"));
  }
  function onMetrics(msg) {
    const charts = jobCharts(msg.job_id);
    if (!charts.length) return;
    const at = typeof msg.at === "number" ? msg.at : Date.now() / 1000;
    const shown = document.getElementById("metrics-charts");
    if (shown) shown.hidden = false; // a job that started after the page opened
    charts.forEach(function (el) {
      const values = {};
      (msg.gpus || []).forEach(function (g) {
        const v = el.dataset.measure === "memory_used_gib"
          ? (g.memory_used_mib != null ? g.memory_used_mib / 1024 : null) : g.util_pct;
        values[msg.node + " GPU " + g.index] = v;
      });
      window.TesseraCharts.append(el, at, values);
    });
    const waiting = document.getElementById("metrics-empty");
    if (waiting) waiting.hidden = true;
  }
  function onChanged(msg) {
    if (ENDED.indexOf(msg.state) < 0) return;
    const charts = jobCharts(msg.job_id);
    charts.forEach(function (el) { window.TesseraCharts.end(el, Date.now() / 1000); });
    const shown = document.getElementById("metrics-charts");
    const waiting = document.getElementById("metrics-empty");
    if (charts.length && shown && shown.hidden && waiting) waiting.textContent = "No sample of its GPUs came while it ran.";
    const source = document.getElementById("metrics-source");
    if (charts.length && source) source.textContent = "Drawn live while it ran, to its end; opened again, the page draws it from the portal's history.";
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
          // A job that has ended writes nothing more: its empty log is not waiting for lines ("... yet").
          const nothing = "ended" in panel.dataset ? "Nothing was written to " + stream + "." : "Nothing written to " + stream + " yet.";
          if (offset === null) pre.textContent = data.text || (data.size ? "" : nothing);
          else if (data.text) {
            if (/^Nothing (was )?written to /.test(pre.textContent) || /^No output yet/.test(pre.textContent)) pre.textContent = "";
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
    // A job that ended may have written its last lines with no logs.appended yet heard: read them once more, a
    // moment later and at a moment of each page's own: every page open on the job hears the same event, and a
    // hundred of them reading the log at once queued behind each other and behind the job's pushed part.
    document.addEventListener("tessera:job.changed", function (e) {
      if (e.detail && String(e.detail.job_id) === String(job) && ENDED.indexOf(e.detail.state) >= 0) {
        panel.dataset.ended = "";
        if (/^Nothing written to /.test(pre.textContent)) pre.textContent = "Nothing was written to " + stream + ".";
        setTimeout(load, 250 + Math.random() * 1750);
      }
    });
    load();
  }

  document.addEventListener("tessera:job.metrics", function (e) { onMetrics(e.detail); });
  document.addEventListener("tessera:job.changed", function (e) { onChanged(e.detail); });
  document.addEventListener("DOMContentLoaded", setupLogs);
})();
