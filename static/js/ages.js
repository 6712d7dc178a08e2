// How long ago, kept current on a page left open. The server writes every time once, in the lab's
// zone (gpuadmin_format's moment filter): <time class="moment" datetime="...Z" title="...">14:05
// <span class="age">(4 min ago)</span></time>. This rewrites only the age, every 30 s and in regions
// htmx swaps in. Loaded with <script src defer> from base.html: no inline script, so a strict CSP holds.
(function () {
  "use strict";

  // The same words as gpuadmin/text.py's human_age, largest unit first.
  var UNITS = [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]];

  function age(seconds) {
    var future = seconds < 0;
    var total = Math.floor(Math.abs(seconds));
    if (total < 5) return "just now";
    for (var i = 0; i < UNITS.length; i++) {
      if (total >= UNITS[i][0]) {
        var amount = Math.floor(total / UNITS[i][0]) + " " + UNITS[i][1];
        return future ? "in " + amount : amount + " ago";
      }
    }
    return "just now";
  }

  function render(root) {
    var now = Date.now();
    root.querySelectorAll("time.moment[datetime]").forEach(function (element) {
      var moment = new Date(element.getAttribute("datetime"));
      var span = element.querySelector(".age");
      if (isNaN(moment.getTime()) || !span) return;
      span.textContent = "(" + age((now - moment.getTime()) / 1000) + ")";
    });
  }

  document.addEventListener("htmx:afterSettle", function (event) {
    render(event.target);
  });
  setInterval(function () {
    render(document);
  }, 30000);
})();
