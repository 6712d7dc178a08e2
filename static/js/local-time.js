// Times in the viewer's time zone. The server writes every time as
// <time class="local-time" datetime="...Z" title="... UTC">... UTC</time>
// (gpuadmin_format's local_time filter); this rewrites the text to local time
// and keeps UTC in the title, so hovering shows it. With data-age="1" it adds
// how long ago ("3 min ago"), refreshed every 30 s. Loaded with
// <script src defer> from base.html: no inline script, so a strict CSP holds.
(function () {
  "use strict";

  function pad(n) {
    return String(n).padStart(2, "0");
  }

  function zoneName(moment) {
    try {
      var parts = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" }).formatToParts(moment);
      for (var i = 0; i < parts.length; i++) {
        if (parts[i].type === "timeZoneName") return parts[i].value;
      }
    } catch (e) {
      // An old browser without formatToParts: the offset below still says it.
    }
    var offset = -moment.getTimezoneOffset();
    var sign = offset >= 0 ? "+" : "-";
    offset = Math.abs(offset);
    return "UTC" + sign + pad(Math.floor(offset / 60)) + ":" + pad(offset % 60);
  }

  function localText(moment) {
    return moment.getFullYear() + "-" + pad(moment.getMonth() + 1) + "-" + pad(moment.getDate()) + " " +
      pad(moment.getHours()) + ":" + pad(moment.getMinutes()) + ":" + pad(moment.getSeconds()) + " " +
      zoneName(moment);
  }

  // The same units as gpuadmin/text.py's human_duration, largest first.
  var UNITS = [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]];

  function age(seconds) {
    if (seconds < 5) return "just now";
    for (var i = 0; i < UNITS.length; i++) {
      if (seconds >= UNITS[i][0]) return Math.floor(seconds / UNITS[i][0]) + " " + UNITS[i][1] + " ago";
    }
    return "just now";
  }

  function render(root) {
    var now = Date.now();
    root.querySelectorAll("time.local-time[datetime]").forEach(function (element) {
      var moment = new Date(element.getAttribute("datetime"));
      if (isNaN(moment.getTime())) return;
      var text = localText(moment);
      if (element.dataset.age) {
        text += " (" + age(Math.max(0, (now - moment.getTime()) / 1000)) + ")";
      }
      element.textContent = text;
      element.classList.add("localized");
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    render(document);
  });
  // Regions htmx swapped in (a filter, a page, a poll) arrive with UTC text again.
  document.addEventListener("htmx:afterSettle", function (event) {
    render(event.target);
  });
  setInterval(function () {
    render(document);
  }, 30000);
})();
