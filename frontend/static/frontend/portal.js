// Tessera portal: live pages. The server renders everything; this script only
//  - keeps one websocket to the page's stream (body[data-stream]) with backoff, showing live / reconnecting,
//  - re-requests the parts marked data-refresh-on="<event types>" (from data-src) when such an event arrives,
//    debounced, and every 5 s while the socket is down (then once more when it is back: catching up),
//  - writes live numbers (GPU utilisation) and feeds the job page's charts and logs,
//  - shows times in the browser's timezone, toasts for one's own jobs, and asks before cancelling.
(function () {
  "use strict";
  const DEBOUNCE_MS = 200;
  const POLL_MS = 5000;
  const BACKOFF_MAX_MS = 10000;
  const body = document.body;
  const me = body.dataset.userId ? Number(body.dataset.userId) : null;
  const status = document.getElementById("live");

  // --- times -------------------------------------------------------------------------------------------
  const rtf = window.Intl && Intl.RelativeTimeFormat ? new Intl.RelativeTimeFormat(undefined, { numeric: "auto" }) : null;
  function relative(date) {
    const s = (date.getTime() - Date.now()) / 1000;
    const a = Math.abs(s);
    if (!rtf) return date.toLocaleString();
    if (a < 60) return rtf.format(Math.round(s), "second");
    if (a < 3600) return rtf.format(Math.round(s / 60), "minute");
    if (a < 86400) return rtf.format(Math.round(s / 3600), "hour");
    return rtf.format(Math.round(s / 86400), "day");
  }
  function span(seconds) { // as the server says it (frontend/templatetags/portal.py: duration)
    const s = Math.max(0, Math.round(seconds));
    if (s < 90) return s + " s";
    if (s < 3600) return Math.round(s / 60) + " min";
    if (s < 86400) { const m = Math.round(s / 60), h = Math.floor(m / 60); return m % 60 ? h + " h " + (m % 60) + " min" : h + " h"; }
    const h = Math.round(s / 3600), d = Math.floor(h / 24);
    return h % 24 ? d + " d " + (h % 24) + " h" : d + " d";
  }
  function localiseTimes(root) {
    (root || document).querySelectorAll("time[datetime]").forEach(function (el) {
      const d = new Date(el.getAttribute("datetime"));
      if (isNaN(d)) return;
      el.textContent = el.dataset.style === "absolute" ? d.toLocaleString()
        : el.dataset.style === "elapsed" ? span((Date.now() - d.getTime()) / 1000) : relative(d);
      el.title = d.toLocaleString() + " (" + (el.dataset.utc || el.getAttribute("title") || "") + ")";
      el.dataset.utc = el.dataset.utc || el.getAttribute("title") || "";
    });
  }

  // --- partial refreshes -------------------------------------------------------------------------------
  const pending = new Map(); // element id -> timer
  function refresh(el) {
    const id = el.id;
    if (!id || !el.dataset.src || pending.has(id)) return;
    pending.set(id, setTimeout(function () {
      pending.delete(id);
      const current = document.getElementById(id);
      if (!current) return;
      const checked = Array.from(current.querySelectorAll("input[type=checkbox]:checked")).map(function (c) { return c.value; });
      fetch(current.dataset.src, { headers: { "X-Requested-With": "fetch" }, credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) {
          const doc = new DOMParser().parseFromString(html, "text/html");
          const fresh = doc.getElementById(id);
          if (!fresh) return;
          checked.forEach(function (v) {
            const box = fresh.querySelector("input[type=checkbox][value='" + v + "']");
            if (box) box.checked = true;
          });
          const live = document.getElementById(id);
          if (!live) return;
          live.replaceWith(fresh);
          localiseTimes(fresh);
          document.dispatchEvent(new CustomEvent("tessera:refreshed", { detail: { id: id } }));
        })
        .catch(function () { /* the next event or poll tries again */ });
    }, DEBOUNCE_MS));
  }
  function refreshFor(type) {
    document.querySelectorAll("[data-refresh-on]").forEach(function (el) {
      if (type === "*" || el.dataset.refreshOn.split(/\s+/).indexOf(type) >= 0) refresh(el);
    });
  }

  // --- toasts ------------------------------------------------------------------------------------------
  const TOAST_STATES = { running: "started", preempted: "was preempted", failed: "failed", succeeded: "succeeded", lost: "lost its node" };
  function toast(text, kind) {
    const box = document.getElementById("toasts");
    if (!box) return;
    const t = document.createElement("div");
    t.className = "toast " + (kind || "");
    t.textContent = text;
    box.appendChild(t);
    setTimeout(function () { t.remove(); }, 8000);
  }

  // A job's new state shows at once in its badges (the label is the server's, from data-state-labels); the
  // parts around it are re-requested as usual.
  let labels = {};
  try { labels = JSON.parse(body.dataset.stateLabels || "{}"); } catch (e) { labels = {}; }
  function showState(jobId, state) {
    if (!labels[state]) return;
    document.querySelectorAll("[data-job-state='" + jobId + "']").forEach(function (el) {
      el.textContent = labels[state];
      el.className = el.className.replace(/state-\S+/, "state-" + state);
    });
  }

  // --- the socket --------------------------------------------------------------------------------------
  let socket = null, backoff = 500, pollTimer = null, failures = 0, everOpen = false;
  function setStatus(text, state) {
    if (!status) return;
    status.hidden = false;
    status.textContent = text;
    status.dataset.state = state;
  }
  function startPolling() {
    if (pollTimer) return;
    pollTimer = setInterval(function () { refreshFor("*"); }, POLL_MS);
  }
  function stopPolling() { if (pollTimer) { clearInterval(pollTimer); pollTimer = null; } }

  function onMessage(msg) {
    document.dispatchEvent(new CustomEvent("tessera:message", { detail: msg })); // page scripts (cluster.js)
    if (msg.type === "hello") return;
    if (msg.type === "job.metrics") { onMetrics(msg); return; }
    if (msg.type === "gpu.metrics") return;
    if (msg.type === "logs.appended") { document.dispatchEvent(new CustomEvent("tessera:logs")); return; }
    if (msg.type === "job.changed") showState(msg.job_id, msg.state);
    if (msg.type === "job.changed" && me !== null && msg.submitter_id === me && TOAST_STATES[msg.state]) {
      toast("Job " + msg.job_id + " " + TOAST_STATES[msg.state] + (msg.message ? ": " + msg.message : ""), "state-" + msg.state);
    }
    refreshFor(msg.type);
  }

  function connect() {
    const path = body.dataset.stream;
    if (!path) return;
    if (!("WebSocket" in window)) { setStatus("polling", "polling"); startPolling(); return; }
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + path;
    try { socket = new WebSocket(url); } catch (e) { scheduleReconnect(); return; }
    socket.onopen = function () {
      backoff = 500; failures = 0;
      setStatus("live", "live");
      stopPolling();
      // Catch up on what happened while no socket listened: while we were away, and on the first open too,
      // between the page's render and the socket joining its groups (a job placed and started in that second
      // otherwise showed "Pending" until its next change).
      refreshFor("*");
      everOpen = true;
    };
    socket.onmessage = function (e) {
      let msg; try { msg = JSON.parse(e.data); } catch (err) { return; }
      onMessage(msg);
    };
    socket.onclose = function () { socket = null; scheduleReconnect(); };
    socket.onerror = function () { /* onclose follows */ };
  }
  function scheduleReconnect() {
    failures += 1;
    setStatus(failures > 3 && !everOpen ? "polling" : "reconnecting", failures > 3 && !everOpen ? "polling" : "reconnecting");
    startPolling();
    setTimeout(connect, backoff);
    backoff = Math.min(BACKOFF_MAX_MS, backoff * 2);
  }

  // --- live numbers and the job page's charts ----------------------------------------------------------
  const series = { t: [], util: {}, mem: {} };
  const SERIES_POINTS = 300;
  let charts = null;
  function onMetrics(msg) {
    const gpus = msg.gpus || [];
    const utils = gpus.map(function (g) { return g.util_pct; }).filter(function (u) { return typeof u === "number"; });
    if (utils.length) {
      const mean = utils.reduce(function (a, b) { return a + b; }, 0) / utils.length;
      document.querySelectorAll("[data-util-job='" + msg.job_id + "']").forEach(function (el) {
        el.textContent = Math.round(mean) + "% GPU";
      });
    }
    const panel = document.getElementById("metrics");
    if (!panel || String(msg.job_id) !== panel.dataset.job || !window.uPlot) return;
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
    drawCharts();
  }
  const COLOURS = ["#2f6fb5", "#d9822b", "#3c9a5f", "#b5452f", "#7a4fb5", "#2f9fb5", "#b5a42f", "#555"];
  function drawCharts() {
    const keys = Object.keys(series.util);
    const width = Math.max(280, Math.min(560, (document.getElementById("metrics").clientWidth - 40) / 2));
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

  // --- logs --------------------------------------------------------------------------------------------
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
    document.addEventListener("tessera:logs", load);
    document.addEventListener("tessera:refreshed", load); // a state change may come with the last lines
    load();
    setInterval(function () { if (!socket) load(); }, POLL_MS);
  }

  // --- forms -------------------------------------------------------------------------------------------
  function setupForms() {
    document.addEventListener("submit", function (e) {
      const form = e.target;
      if (form.dataset.confirm) {
        if (form.id === "cancel-form" && !form.querySelector("input[name=job]:checked")) {
          e.preventDefault(); toast("Select the jobs to cancel first."); return;
        }
        if (!window.confirm(form.dataset.confirm)) e.preventDefault();
      }
    });
    const jobForm = document.getElementById("job-form");
    const invalid = document.querySelector(".field.invalid input, .field.invalid textarea, .field.invalid select");
    if (invalid) invalid.focus(); // after a refused submit, the first field to fix
    if (jobForm) {
      const apply = function () {
        const kind = (jobForm.querySelector("input[name=kind]:checked") || {}).value || "whole";
        jobForm.querySelectorAll(".when-whole").forEach(function (el) { el.hidden = kind !== "whole"; });
        jobForm.querySelectorAll(".when-slice").forEach(function (el) { el.hidden = kind !== "slice"; });
      };
      jobForm.addEventListener("change", apply);
      apply();
    }
  }

  window.tessera = { refresh: refresh, localiseTimes: localiseTimes }; // for page scripts (cluster.js)
  document.addEventListener("DOMContentLoaded", function () {
    localiseTimes();
    setInterval(function () { localiseTimes(); }, 5000);
    setupForms();
    setupLogs();
    connect();
    if (!body.dataset.stream && document.querySelector("[data-refresh-on]")) startPolling();
  });
  document.addEventListener("htmx:afterSwap", function (e) { localiseTimes(e.target); });
})();
