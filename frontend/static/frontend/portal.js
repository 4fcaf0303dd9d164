// Tessera portal: the page's live stream. The server renders every part and htmx re-requests each one when its
// events happen (hx-trigger="tessera:<type> from:body", frontend/templatetags/portal.py: refresh_on). This script
// only keeps one websocket open to the page's stream (body[data-stream]) and turns each message into a DOM event on
// <body>, `tessera:<type>` with the message as its detail; it shows whether the page is live, and fires
// `tessera:catch-up` when the socket opens and every 5 s while it is down, so the parts re-request themselves then.
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

  let retries = 0, everOpen = false;
  function connect() {
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + body.dataset.stream;
    let socket;
    try { socket = new WebSocket(url); } catch (e) { reconnect(); return; }
    socket.onopen = function () {
      retries = 0;
      everOpen = true;
      show("live");
      poll(false);
      // What no socket heard: while it was down, and on the first open too, between the page's render and the
      // socket joining its groups (a job placed and started in that second otherwise showed "Pending").
      emit("catch-up");
    };
    socket.onmessage = function (e) {
      let msg;
      try { msg = JSON.parse(e.data); } catch (err) { return; }
      if (msg && typeof msg.type === "string") emit(msg.type, msg);
    };
    socket.onclose = reconnect;
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
