// Tessera portal: what every page does in the browser besides re-requesting its parts (htmx, portal.js):
//  - shows times in the browser's timezone, relative where that reads best, counting on;
//  - shows a job's new state in its badges the moment the stream says so, a toast for one's own jobs, and the
//    live GPU utilisation of running jobs in the lists;
//  - asks before cancelling, and shows the submit form's whole-GPU or slice fields;
//  - leaves a part as it is when its answer is another page (a sign-in page: the session ended).
(function () {
  "use strict";
  const body = document.body;
  const me = body.dataset.userId ? Number(body.dataset.userId) : null;

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
  // One formatter for every time (toLocaleString builds one per call: a hundred open pages paid it on every swap),
  // on the 24-hour clock the charts' axes use (charts.js): a job's events read "8:52:36 PM" above ticks of 20:52:37.
  const local = window.Intl && Intl.DateTimeFormat ? new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "numeric", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
    hourCycle: "h23",
  }) : null;
  function absolute(date) { return local ? local.format(date) : date.toLocaleString(); }
  function localiseTimes(root) {
    (root || document).querySelectorAll("time[datetime]").forEach(function (el) {
      const d = new Date(el.getAttribute("datetime"));
      if (isNaN(d)) return;
      const text = el.dataset.style === "absolute" ? absolute(d)
        : el.dataset.style === "elapsed" ? span((Date.now() - d.getTime()) / 1000) : relative(d);
      el.dataset.utc = el.dataset.utc || el.getAttribute("title") || "";
      const title = absolute(d) + " (" + el.dataset.utc + ")";
      if (el.textContent !== text) el.textContent = text; // unchanged text is left alone: no mutation, no layout
      if (el.title !== title) el.title = title;
    });
  }

  // --- a job's state, at once ----------------------------------------------------------------------------
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

  // The badge's label is the server's (data-state-labels); the parts around it follow when htmx re-requests them.
  let labels = {};
  try { labels = JSON.parse(body.dataset.stateLabels || "{}"); } catch (e) { labels = {}; }
  function onJobChanged(msg) {
    if (labels[msg.state]) {
      document.querySelectorAll("[data-job-state='" + msg.job_id + "']").forEach(function (el) {
        el.textContent = labels[msg.state];
        el.className = el.className.replace(/state-\S+/, "state-" + msg.state);
      });
    }
    if (me !== null && msg.submitter_id === me && TOAST_STATES[msg.state]) {
      toast("Job " + msg.job_id + " " + TOAST_STATES[msg.state] + (msg.message ? ": " + msg.message : ""), "state-" + msg.state);
    }
  }

  function onJobMetrics(msg) { // the lists' "GPU use" column: the mean of the job's cards
    const utils = (msg.gpus || []).map(function (g) { return g.util_pct; }).filter(function (u) { return typeof u === "number"; });
    if (!utils.length) return;
    const mean = utils.reduce(function (a, b) { return a + b; }, 0) / utils.length;
    document.querySelectorAll("[data-util-job='" + msg.job_id + "']").forEach(function (el) {
      el.textContent = Math.round(mean) + "% GPU";
    });
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
      setupPriorityList(jobForm);
      setupImageHints(jobForm);
      // A session template (Jupyter, TensorBoard, a plain port) fills in its name, command, ports and kind.
      jobForm.addEventListener("click", function (e) {
        const button = e.target.closest && e.target.closest("[data-template]");
        if (!button) return;
        applyValues(jobForm, JSON.parse(button.dataset.template));
        apply();
        jobForm.dispatchEvent(new Event("change", { bubbles: true }));
      });
      // The what-if's suggestion is a button: it puts its values in the form, and the change asks again.
      document.addEventListener("click", function (e) {
        const button = e.target.closest && e.target.closest("#preview [data-apply]");
        if (!button || !button.dataset.apply) return;
        const values = JSON.parse(button.dataset.apply);
        applyValues(jobForm, values);
        apply();
        jobForm.dispatchEvent(new Event("change", { bubbles: true }));
        // The button goes with the answer it belonged to: keep the keyboard on the field it changed.
        const changed = jobForm.querySelector("[name='" + Object.keys(values)[0] + "']");
        if (changed) changed.focus();
      });
    }
  }

  // The priority list offers the chosen team's classes (the server's lists, one per team, in #priority-options);
  // a class already chosen that the new team may not use stays, marked, so the refusal beside it says why.
  function setupPriorityList(jobForm) {
    const data = document.getElementById("priority-options");
    const team = jobForm.querySelector("[name=team]");
    const select = jobForm.querySelector("[name=priority]");
    if (!data || !team || !select) return;
    const byTeam = JSON.parse(data.textContent);
    team.addEventListener("change", function () {
      const options = byTeam[team.value] || [["", "The team's default"]];
      const chosen = select.value;
      const offered = options.slice();
      if (chosen && !options.some(function (o) { return o[0] === chosen; })) {
        offered.push([chosen, chosen + " (not allowed for " + team.value + ")"]);
      }
      select.replaceChildren.apply(select, offered.map(function (o) { return new Option(o[1], o[0]); }));
      select.value = chosen;
      const named = document.getElementById("priority-team");
      if (named) named.textContent = team.value;
    });
  }

  // The hints under the image and mounts fields name the chosen team's allowed images and mounts (#image-options).
  function setupImageHints(jobForm) {
    const data = document.getElementById("image-options");
    const team = jobForm.querySelector("[name=team]");
    if (!data || !team) return;
    const byTeam = JSON.parse(data.textContent);
    team.addEventListener("change", function () {
      const of = byTeam[team.value] || { images: [], mounts: [] };
      document.getElementById("images-list").textContent = of.images.join(", ") || "any image";
      document.getElementById("mounts-list").textContent = of.mounts.join("; ") || "none";
      jobForm.querySelectorAll(".images-team").forEach(function (el) { el.textContent = team.value; });
    });
  }

  // Spec values (as the what-if writes them: {"gpus": 6, "nodes": 2}, {"gpu_models": []}) into the form's fields.
  function applyValues(jobForm, values) {
    Object.keys(values).forEach(function (name) {
      const value = values[name];
      const fields = jobForm.querySelectorAll("[name='" + name + "']");
      fields.forEach(function (field) {
        if (field.type === "checkbox" || field.type === "radio") {
          field.checked = Array.isArray(value) ? value.indexOf(field.value) >= 0 : field.value === String(value);
        } else {
          field.value = String(value);
        }
      });
    });
  }

  // A part answered with another page (the sign-in page, once the session has ended) keeps what it shows, as it does
  // after an error; the next event asks again.
  document.addEventListener("htmx:beforeSwap", function (e) {
    const path = e.detail.pathInfo;
    if (path.responsePath && path.responsePath.split("?")[0] !== path.finalRequestPath.split("?")[0]) {
      e.detail.shouldSwap = false;
    }
  });
  // A 429 says in its body why and for how long (the what-if preview's rate): shown where the answer goes.
  document.addEventListener("htmx:beforeSwap", function (e) {
    if (e.detail.xhr.status === 429) {
      e.detail.shouldSwap = true;
      e.detail.isError = false;
    }
  });
  document.addEventListener("tessera:job.changed", function (e) { onJobChanged(e.detail); });
  document.addEventListener("tessera:job.metrics", function (e) { onJobMetrics(e.detail); });
  document.addEventListener("htmx:afterSwap", function (e) { localiseTimes(e.target); });
  document.addEventListener("DOMContentLoaded", function () {
    localiseTimes();
    setInterval(function () { localiseTimes(); }, 5000);
    setupForms();
  });
})();
