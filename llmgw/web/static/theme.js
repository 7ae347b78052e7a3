// The colour scheme: "light", "dark" or "system" (the default: prefers-color-scheme).
// Loaded without defer in <head>, so the remembered choice is on <html> before the
// first paint (no flash of the other scheme); the switch in the header is wired once
// the page is parsed. The choice is kept in localStorage, per browser, never sent.
"use strict";
(function () {
  const KEY = "llmgw-theme";
  const root = document.documentElement;

  function stored() {
    try { return localStorage.getItem(KEY) || "system"; } catch (e) { return "system"; }
  }
  function apply(choice) {
    if (choice === "light" || choice === "dark") root.dataset.theme = choice;
    else delete root.dataset.theme;
  }
  apply(stored());

  document.addEventListener("DOMContentLoaded", function () {
    const select = document.getElementById("theme-switch");
    if (!select) return;
    select.value = stored();
    select.closest(".theme").hidden = false;  // shown only where this script runs
    select.addEventListener("change", function () {
      const choice = select.value;
      try {
        if (choice === "system") localStorage.removeItem(KEY);
        else localStorage.setItem(KEY, choice);
      } catch (e) { /* storage off: the choice lasts for this page only */ }
      apply(choice);
    });
  });
  // Another tab changed it: follow.
  window.addEventListener("storage", function (event) {
    if (event.key !== KEY) return;
    apply(stored());
    const select = document.getElementById("theme-switch");
    if (select) select.value = stored();
  });
})();
