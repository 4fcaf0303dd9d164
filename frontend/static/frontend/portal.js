// Tessera portal: the page's live stream. The server renders every part and htmx re-requests each one when its
// events happen (hx-trigger="tessera:<type> from:body", frontend/templatetags/portal.py: refresh_on). This script
// only keeps one websocket open to the page's stream (body[data-stream]) and turns each message into a DOM event on
// <body>, `tessera:<type>` with the message as its detail; it shows whether the page is live, and fires
// `tessera:catch-up` when the socket opens and every 5 s while it is down, so the parts re-request themselves then.
//
// Parts the server pushes (data-push-on, frontend/templatetags/portal.py: push_on): the page tells its socket which
// it shows ("watch"); each changed one then comes over the socket, rendered once for everyone who sees the same
// (scheduling/realtime/parts.py), and is swapped in as htmx would have. A part the socket does not push to this
// user is re-requested on its events (`tessera:pull`), as the other parts are.
(function () {
  "use strict";
  const POLL_MS = 5000;
  const BACKOFF_FIRST_MS = 500;
  const BACKOFF_MAX_MS = 10000;
  const body = document.body;
  const status = document.getElementById("live");

  function emit(type, detail) {
    htmx.trigger(body, "tessera:" + type, detail || {});
  }

  function show(state) { // live, reconnecting or polling
    if (!status) return;
    status.hidden = false;
    status.textContent = state;
    status.dataset.state = state;
  }

  let pollTimer = null;
  function poll(on) {
    if (on && !pollTimer) pollTimer = setInterval(function () { emit("catch-up"); }, POLL_MS);
    if (!on && pollTimer) { clearInterval(pollTimer); pollTimer = null; }
  }

  // Retry n waits about 0.5 s x 2^n, at most 10 s, drawn between half and all of that: pages dropped together (the
  // portal restarting) do not all come back in the same instant.
  function backoffMs(retry) {
    const ceiling = Math.min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * Math.pow(2, retry));
    return ceiling / 2 + Math.random() * (ceiling / 2);
  }

  // --- pushed parts ---------------------------------------------------------------------------------------
  function pushedParts() {
    return Array.from(document.querySelectorAll("[data-push-on][id][hx-get]")).map(function (el) {
      return { id: el.id, url: el.getAttribute("hx-get"), on: el.dataset.pushOn.split(/\s+/).filter(Boolean) };
    });
  }
  let open = null, pushed = new Set(), watched = "";
  function watch() {
    const parts = pushedParts();
    watched = JSON.stringify(parts);
    pushed = new Set();
    if (open && parts.length) open.send(JSON.stringify({ type: "watch", parts: parts }));
  }
  function swapPart(msg) {
    const el = document.getElementById(msg.id);
    if (!el || !el.dataset.pushOn || typeof msg.html !== "string") return;
    htmx.swap(el, msg.html, { swapStyle: el.getAttribute("hx-swap") || "innerHTML" },
      { select: el.getAttribute("hx-select") || undefined, contextElement: el });
    htmx.trigger(el, "htmx:afterSwap", { elt: el, target: el, pushed: true });
  }
  function pullUnpushed(type) {
    document.querySelectorAll("[data-push-on][id]").forEach(function (el) {
      if (!pushed.has(el.id) && el.dataset.pushOn.split(/\s+/).indexOf(type) >= 0) htmx.trigger(el, "tessera:pull");
    });
  }
  // A part swapped in may show other pushed parts (or other URLs): the socket is told again when they change.
  document.addEventListener("htmx:afterSettle", function () {
    if (open && JSON.stringify(pushedParts()) !== watched) watch();
  });
  // A pushed part's form carries a token of its render, not the page's: the page's goes in before it is sent.
  document.addEventListener("submit", function (e) {
    let token = "";
    try { token = JSON.parse(body.getAttribute("hx-headers") || "{}")["X-CSRFToken"] || ""; } catch (err) { token = ""; }
    if (!token) return;
    e.target.querySelectorAll("input[name='csrfmiddlewaretoken']").forEach(function (input) { input.value = token; });
  }, true);

  let retries = 0, everOpen = false;
  function connect() {
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + body.dataset.stream;
    let socket;
    try { socket = new WebSocket(url); } catch (e) { reconnect(); return; }
    socket.onopen = function () {
      retries = 0;
      everOpen = true;
      open = socket;
      show("live");
      poll(false);
      watch();
      // What no socket heard: while it was down, and on the first open too, between the page's render and the
      // socket joining its groups (a job placed and started in that second otherwise showed "Pending").
      emit("catch-up");
    };
    socket.onmessage = function (e) {
      let msg;
      try { msg = JSON.parse(e.data); } catch (err) { return; }
      if (!msg || typeof msg.type !== "string") return;
      if (msg.type === "watching") {
        pushed = new Set(msg.parts || []);
        document.querySelectorAll("[data-push-on][id]").forEach(function (el) { el.toggleAttribute("data-pushed", pushed.has(el.id)); });
        return;
      }
      if (msg.type === "part") { swapPart(msg); return; }
      emit(msg.type, msg);
      pullUnpushed(msg.type);
    };
    socket.onclose = function () {
      open = null;
      pushed = new Set();
      document.querySelectorAll("[data-pushed]").forEach(function (el) { el.removeAttribute("data-pushed"); });
      reconnect();
    };
  }
  function reconnect() {
    // A socket that has never opened after a few tries (a proxy without websockets) reads "polling".
    show(!everOpen && retries >= 3 ? "polling" : "reconnecting");
    poll(true);
    setTimeout(connect, backoffMs(retries));
    retries += 1;
  }

  // After htmx's own DOMContentLoaded handler, which wires the parts' triggers: no event is fired before they listen.
  document.addEventListener("DOMContentLoaded", function () {
    if (!body.dataset.stream) poll(true); // signed out: no stream, the parts are re-requested every 5 s
    else if (!("WebSocket" in window)) { show("polling"); poll(true); }
    else connect();
  });
})();
