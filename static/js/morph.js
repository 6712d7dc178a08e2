// Defaults of htmx's morphing swap (hx-swap="morph", static/vendor/idiomorph). Set here because
// "morph:{...}" options are built with Function(), which the Content-Security-Policy forbids.
// Loaded with <script src defer> after idiomorph, from base.html.
(function () {
  "use strict";
  if (!window.Idiomorph) return;
  // What the person is typing (a reason to reject) is theirs, not the poll's.
  Idiomorph.defaults.ignoreActiveValue = true;
  // A <details> the person opened or closed stays so: the server's copy knows nothing of it.
  Idiomorph.defaults.callbacks.beforeAttributeUpdated = function (name, element) {
    return !(name === "open" && element.tagName === "DETAILS");
  };
})();
