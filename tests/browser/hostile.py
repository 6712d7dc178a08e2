"""Command-line arguments that try to run script, inject markup, wake htmx, or lie on screen."""

from __future__ import annotations

HOSTILE_ARGS = [
    "<script>window.__pwned = 'script'</script>",
    '"><img src=x onerror="window.__pwned = \'img\'">',
    '<div hx-get="/pwned-hx-get" hx-trigger="load">get</div>',
    "<form hx-post=/pwned-hx-post hx-trigger=load></form>",
    "\x1b[31mRED\x1b[0m",
    "\u202eevil.py",
]
# How the panel shows the control characters: as escapes, never as themselves.
VISIBLE_CONTROLS = ["\\x1b[31mRED\\x1b[0m", "\\u202eevil.py"]
# What a live htmx attribute from a payload would request.
PWNED_PATHS = ("/pwned-hx-get", "/pwned-hx-post")

# In the browser: no element that a payload would have made.
NO_LIVE_PAYLOAD = """() => ({
  scripts: [...document.scripts].filter((s) => !s.src).length,
  images: document.querySelectorAll('img[src="x"]').length,
  htmx: document.querySelectorAll('[hx-get^="/pwned"], [hx-post^="/pwned"]').length,
  rlo: document.body.innerText.includes("\\u202e"),
  esc: document.body.innerText.includes("\\u001b"),
})"""
CLEAN_DOM = {"scripts": 0, "images": 0, "htmx": 0, "rlo": False, "esc": False}
