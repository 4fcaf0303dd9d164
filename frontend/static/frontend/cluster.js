// Tessera cluster map (/cluster/) and node page (/cluster/<name>/). The server renders every tile and cell, and htmx
// fetches a group's tiles when it is opened and re-requests the open groups, the groups' rows and the node's table
// on the stream's events (their hx-trigger); this script only
//  - moves each rendered GPU cell's utilisation fill as the stream's gpu.metrics samples arrive (one frame
//    per batch, nothing fetched), and keeps the heartbeat ages counting,
//  - keeps the legend naming the teams of the open groups' slices,
//  - opens the cordon / drain / uncordon dialog for staff (the form posts; the server decides).
(function () {
  "use strict";
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

  // The legend lists the teams of every open group's slices.
  function updateLegend() {
    const legend = document.getElementById("map-legend");
    if (!legend) return;
    const seen = {};
    document.querySelectorAll(".group[open] [data-legend]").forEach(function (b) {
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
    if (map) { // the node page's legend is the server's, for its one node
      document.querySelectorAll("details.group").forEach(function (d) { d.addEventListener("toggle", updateLegend); });
      document.addEventListener("htmx:afterSwap", updateLegend);
    }
    document.addEventListener("htmx:afterSwap", tickHeartbeats);
    document.addEventListener("mouseover", function (e) { // a cell's hover text is its aria-label
      const cell = e.target.closest && e.target.closest(".gpu-cell[aria-label]");
      if (cell && !e.target.closest(".gpu-slice")) cell.title = cell.getAttribute("aria-label");
    });
    document.addEventListener("tessera:gpu.metrics", function (e) { onSample(e.detail); });
    setInterval(tickHeartbeats, TICK_MS);
    tickHeartbeats();
  });
})();
