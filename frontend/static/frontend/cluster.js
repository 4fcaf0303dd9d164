// Tessera cluster map (/cluster/) and node page (/cluster/<name>/). The server renders every tile and cell;
// this script only
//  - fetches a group's tiles when it is opened (then portal.js re-requests them on node/queue events),
//  - re-requests the groups' rows on those events (debounced) and every 5 s (their mean utilisation),
//  - moves each rendered GPU cell's utilisation fill as the stream's gpu.metrics samples arrive (one frame
//    per batch, nothing fetched), and keeps the heartbeat ages counting,
//  - opens the cordon / drain / uncordon dialog for staff (the form posts; the server decides).
(function () {
  "use strict";
  const DEBOUNCE_MS = 200;
  const TICK_MS = 5000;

  function gib(mib) { // as the server says it (frontend/templatetags/portal.py: gib)
    if (mib == null) return "";
    if (mib >= 1024) { const v = mib / 1024; return (v === Math.floor(v) || v >= 100 ? v.toFixed(0) : v.toFixed(1)) + " GiB"; }
    return mib + " MiB";
  }
  function age(s) {
    s = Math.max(0, Math.floor(s));
    if (s < 90) return s + " s";
    if (s < 5400) return Math.round(s / 60) + " min";
    if (s < 172800) return Math.round(s / 3600) + " h";
    return Math.round(s / 86400) + " d";
  }

  // --- groups: open on demand, rows refreshed -----------------------------------------------------------
  function bodyOf(details) { return document.getElementById(details.id + "-body"); }
  function onToggle(details) {
    const body = bodyOf(details);
    if (!body) return;
    if (details.open) {
      if (!body.dataset.src) body.dataset.src = body.dataset.lazySrc;
      body.dataset.refreshOn = "node.changed queue.changed gpu.health";
      window.tessera.refresh(body);
    } else {
      delete body.dataset.refreshOn; // a closed group is not re-requested
    }
  }

  let summaryTimer = null, summaryBusy = false;
  function refreshSummaries() {
    const box = document.getElementById("cluster-groups");
    if (!box || summaryTimer) return;
    summaryTimer = setTimeout(function () {
      summaryTimer = null;
      if (summaryBusy) return;
      summaryBusy = true;
      fetch(box.dataset.summariesSrc, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) {
          const doc = new DOMParser().parseFromString(html, "text/html");
          doc.querySelectorAll("[data-summary-for]").forEach(function (fresh) {
            const live = document.querySelector("[data-summary-for='" + fresh.dataset.summaryFor + "']");
            if (live) live.innerHTML = fresh.innerHTML;
          });
        })
        .catch(function () { /* the next event or tick tries again */ })
        .finally(function () { summaryBusy = false; });
    }, DEBOUNCE_MS);
  }

  // The legend lists the teams of every open group's slices.
  function updateLegend() {
    const legend = document.getElementById("map-legend");
    if (!legend) return;
    const seen = {};
    document.querySelectorAll(".group[open] .group-body[data-legend]").forEach(function (b) {
      b.dataset.legend.split(";").filter(Boolean).forEach(function (pair) {
        const i = pair.lastIndexOf("=");
        seen[pair.slice(0, i)] = pair.slice(i + 1);
      });
    });
    legend.querySelectorAll(".legend-item.team:not(.anon-item)").forEach(function (el) {
      if (!el.querySelector(".swatch.anon")) el.remove();
    });
    const anon = legend.querySelector(".swatch.anon");
    Object.keys(seen).sort().forEach(function (team) {
      const item = document.createElement("span");
      item.className = "legend-item team";
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = seen[team];
      swatch.setAttribute("aria-hidden", "true");
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(team));
      legend.insertBefore(item, anon ? anon.parentNode : null);
    });
  }

  // --- live utilisation from the stream's samples ----------------------------------------------------------
  const samples = new Map(); // node -> newest gpu.metrics message, drawn at the next frame
  let frame = 0;
  function onSample(msg) {
    if (!msg.node || !document.querySelector(".node-tile[data-node='" + CSS.escape(msg.node) + "']")) return;
    samples.set(msg.node, msg);
    if (!frame) frame = requestAnimationFrame(drawSamples);
  }
  function drawSamples() {
    frame = 0;
    samples.forEach(function (msg, node) {
      document.querySelectorAll(".node-tile[data-node='" + CSS.escape(node) + "']").forEach(function (tile) {
        (msg.gpus || []).forEach(function (g) {
          const cell = tile.querySelector(".gpu-cell[data-gpu='" + g.index + "']");
          if (!cell) return;
          const util = typeof g.util_pct === "number" ? Math.max(0, Math.min(100, g.util_pct)) : null;
          cell.querySelector(".gpu-fill").style.height = (util === null ? 0 : util) + "%";
          cell.querySelector(".gpu-util").textContent = util === null ? "–" : Math.round(util) + "%";
          let words = cell.getAttribute("aria-label")
            .replace(/utilisation (\d+%|unknown \(no recent sample\))/, util === null ? "utilisation unknown (no recent sample)" : "utilisation " + Math.round(util) + "%");
          if (typeof g.memory_used_mib === "number") {
            const used = gib(g.memory_used_mib) + " of " + gib(Number(cell.dataset.mib)) + " memory in use";
            words = /memory in use/.test(words)
              ? words.replace(/[\d.]+ [MG]iB of [\d.]+ [MG]iB memory in use/, used)
              : words.replace(/(utilisation [^,]+)/, "$1, " + used);
          }
          cell.setAttribute("aria-label", words);
          if (cell.title) cell.title = words;
        });
      });
    });
    samples.clear();
  }

  // --- heartbeat ages ------------------------------------------------------------------------------------
  function tickHeartbeats() {
    document.querySelectorAll(".hb[data-heard]").forEach(function (el) {
      const s = (Date.now() - new Date(el.dataset.heard).getTime()) / 1000;
      if (isNaN(s)) return;
      const silent = s > Number(el.dataset.silentAfter || 10);
      el.textContent = silent ? "agent silent for " + age(s) : "heartbeat " + age(s) + " ago";
      el.classList.toggle("silent", silent);
    });
  }

  // --- cordon / drain / uncordon -----------------------------------------------------------------------
  function setupStateDialog() {
    const dialog = document.getElementById("state-dialog");
    if (!dialog) return;
    const form = document.getElementById("state-form");
    document.addEventListener("click", function (e) {
      const button = e.target.closest("[data-set-state]");
      if (button) {
        form.action = button.dataset.action;
        document.getElementById("state-input").value = button.dataset.setState;
        document.getElementById("state-dialog-title").textContent = button.textContent + " " + button.dataset.node;
        document.getElementById("state-dialog-what").textContent = {
          cordoned: "No new work is placed there; what runs there runs on.",
          draining: "No new work is placed there while its jobs finish.",
          ready: "The scheduler places work there again.",
        }[button.dataset.setState] || "";
        document.getElementById("state-submit").textContent = button.textContent;
        dialog.showModal();
        document.getElementById("state-reason").focus();
      }
      if (e.target.id === "state-cancel") dialog.close();
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    const map = document.getElementById("cluster-map");
    const nodePage = document.getElementById("node-page");
    if (!map && !nodePage) return;
    setupStateDialog();
    document.querySelectorAll("details.group").forEach(function (d) {
      d.addEventListener("toggle", function () { onToggle(d); updateLegend(); });
    });
    document.addEventListener("click", function (e) { // a group's pages of nodes, fetched in place
      const link = e.target.closest("a[data-group-page]");
      if (!link) return;
      const body = link.closest(".group-body");
      if (!body) return;
      e.preventDefault();
      const src = new URL(body.dataset.src, location.href);
      src.searchParams.set("page", link.dataset.groupPage);
      body.dataset.src = src.pathname + src.search;
      window.tessera.refresh(body);
    });
    document.addEventListener("tessera:refreshed", function () { updateLegend(); tickHeartbeats(); });
    document.addEventListener("mouseover", function (e) { // a cell's hover text is its aria-label
      const cell = e.target.closest && e.target.closest(".gpu-cell[aria-label]");
      if (cell && !e.target.closest(".gpu-slice")) cell.title = cell.getAttribute("aria-label");
    });
    document.addEventListener("tessera:message", function (e) {
      const msg = e.detail || {};
      if (msg.type === "gpu.metrics") onSample(msg);
      else if (msg.type === "node.changed" || msg.type === "queue.changed" || msg.type === "gpu.health") refreshSummaries();
    });
    setInterval(function () {
      tickHeartbeats();
      if (document.hidden) return;
      if (map) refreshSummaries();
      const gpus = document.getElementById("node-gpus");
      if (gpus) window.tessera.refresh(gpus); // temperature, power, clocks: the table follows the samples
    }, TICK_MS);
    tickHeartbeats();
  });
})();
