// Defaults of htmx's morphing swap (hx-swap="morph", static/vendor/idiomorph). Set here because
// "morph:{...}" options are built with Function(), which the Content-Security-Policy forbids.
// Loaded with <script src defer> after idiomorph, from base.html.
(function () {
  "use strict";
  if (!window.Idiomorph) return;

  // What a person types or ticks in a polled region (a reason to reject, "allow SIGKILL only")
  // is theirs: the server's copy never carries it, so a refresh must not reset it — not while
  // the field has focus, and not after they moved on to the Reject button either. Hidden inputs
  // are the page's own state (the process table's page number) and follow the server.
  function typedByAPerson(element) {
    if (element.tagName === "TEXTAREA") return true;
    return element.tagName === "INPUT" && element.type !== "hidden";
  }

  Idiomorph.defaults.ignoreActiveValue = true;
  Idiomorph.defaults.callbacks.beforeAttributeUpdated = function (name, element) {
    if ((name === "value" || name === "checked") && typedByAPerson(element)) return false;
    // A <details> the person opened or closed stays so.
    if (name === "open" && element.tagName === "DETAILS") return false;
    return true;
  };
})();
