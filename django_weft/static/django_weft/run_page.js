/* django_weft admin: a live run's page refreshes itself.
   While the run is live (#weft-run data-live="1"), the page's content is read again every
   data-refresh-seconds and swapped in place, keeping what the reader unfolded and where
   they scrolled; it stops once the run has finished. The "refresh" checkbox turns it off
   (remembered in this browser). No build step, no other script. */
(function () {
  "use strict";
  var KEY = "django_weft.run_page.refresh";
  var timer = null;

  function enabled() {
    try { return window.localStorage.getItem(KEY) !== "off"; } catch (e) { return true; }
  }

  function remember(on) {
    try { window.localStorage.setItem(KEY, on ? "on" : "off"); } catch (e) { /* private mode */ }
  }

  function openKeys(root) {
    var keys = {};
    root.querySelectorAll("details[data-key]").forEach(function (el) { keys[el.dataset.key] = el.open; });
    return keys;
  }

  function schedule() {
    var run = document.getElementById("weft-run");
    window.clearTimeout(timer);
    if (!run || run.dataset.live !== "1") return;
    var box = document.getElementById("weft-refresh");
    if (box) box.checked = enabled();
    if (!enabled()) return;
    var seconds = parseFloat(run.dataset.refreshSeconds) || 5;
    timer = window.setTimeout(refresh, seconds * 1000);
  }

  function refresh() {
    var current = document.getElementById("content-main");
    if (!current) return;
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("content-main");
        if (!fresh) throw new Error("no page content");
        var keys = openKeys(current);
        fresh.querySelectorAll("details[data-key]").forEach(function (el) {
          if (el.dataset.key in keys) el.open = keys[el.dataset.key];
        });
        var x = window.scrollX, y = window.scrollY;
        current.replaceWith(fresh);
        window.scrollTo(x, y);
        schedule();
      })
      .catch(function () {
        // Signed out, the run removed, the server away: try again later, more slowly.
        timer = window.setTimeout(refresh, 30000);
      });
  }

  document.addEventListener("change", function (event) {
    if (event.target && event.target.id === "weft-refresh") {
      remember(event.target.checked);
      schedule();
    }
  });
  document.addEventListener("DOMContentLoaded", schedule);
})();
