// /admin/logs/<model>/<replica> follows the engine's log: server-sent events from our
// own origin, each a JSON array of lines, appended as text (never parsed as HTML).
"use strict";
(function () {
  const log = document.getElementById("log");
  const pause = document.getElementById("log-pause");
  const state = document.getElementById("log-state");
  if (!log || !log.dataset.events) return;
  const MAX_LINES = 5000;  // the page keeps the newest; the log itself is on the node
  let paused = false;
  let source = null;
  function say(text) { if (state) state.textContent = text; }
  function append(lines) {
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.appendChild(document.createTextNode(lines.map(function (l) { return l + "\n"; }).join("")));
    const text = log.textContent.split("\n");
    if (text.length > MAX_LINES + 1) log.textContent = text.slice(-MAX_LINES - 1).join("\n");
    if (atBottom) log.scrollTop = log.scrollHeight;
    log.dataset.lines = String(log.textContent.split("\n").length - 1);
  }
  function open() {
    source = new EventSource(log.dataset.events);
    source.addEventListener("reset", function () { log.textContent = ""; say("Following new lines."); });
    source.addEventListener("message", function (e) { append(JSON.parse(e.data)); });
    source.addEventListener("end", function () { source.close(); say("The unit is gone: nothing more to follow."); });
    source.addEventListener("failed", function (e) { source.close(); say(JSON.parse(e.data)); });
    source.addEventListener("error", function () { say("Reconnecting…"); });
  }
  pause.addEventListener("click", function () {
    paused = !paused;
    pause.setAttribute("aria-pressed", String(paused));
    pause.textContent = paused ? "Resume following" : "Pause following";
    if (paused) { source.close(); say("Paused."); } else { open(); }
  });
  open();
})();
