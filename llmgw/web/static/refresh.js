// /admin refreshes itself: fetch the live part every few seconds and swap it in.
// The HTML comes from our own origin, rendered with autoescape (see admin_live.html).
"use strict";
(function () {
  const live = document.getElementById("live");
  const pause = document.getElementById("pause");
  if (!live) return;
  const every = Math.max(2, parseInt(live.dataset.every || "10", 10)) * 1000;
  let paused = false;
  pause.addEventListener("click", function () {
    paused = !paused;
    pause.setAttribute("aria-pressed", String(paused));
    pause.textContent = paused ? "Resume refresh" : "Pause refresh";
  });
  async function refresh() {
    // Do not pull the page out from under someone using it with the keyboard.
    if (paused || document.hidden || live.contains(document.activeElement)) return;
    try {
      const answer = await fetch(live.dataset.src, {credentials: "same-origin"});
      if (answer.redirected || !answer.ok) { window.location.reload(); return; }
      live.innerHTML = await answer.text();
      live.dataset.refreshed = String(Date.now());
    } catch (e) { /* the daemon restarting: try again at the next tick */ }
  }
  setInterval(refresh, every);
})();
