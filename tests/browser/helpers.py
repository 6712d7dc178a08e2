"""Plain helpers of the browser tests: hostile command lines, the page guard, logging in and out,
axe-core and the page's width.

The fixtures that use them are in conftest.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.people import PASSWORD

# --- command-line arguments that try to run script, inject markup, wake htmx, or lie on screen

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


# --- the page guard ---------------------------------------------------------------------

# Runs before any page script: records what the Content-Security-Policy blocked.
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(
    `${e.violatedDirective} blocked ${e.blockedURI} (${e.sourceFile}:${e.lineNumber})`);
});
"""


@dataclass
class Guard:
    """What a page did that it should not have."""

    page: Any
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def violations(self) -> list[str]:
        return list(self.page.evaluate("window.__cspViolations || []"))

    def assert_clean(self) -> None:
        csp_console = [m for m in self.console_errors if "Content Security Policy" in m]
        assert self.violations() == [], "CSP violations reported"
        assert csp_console == [], "CSP violations in the console"
        assert self.page_errors == [], "script errors"
        assert self.page.evaluate("window.__pwned === undefined"), "a payload ran"


# --- logging in and out through the real forms -------------------------------------------


def log_in(page: Any, base_url: str, username: str, password: str = PASSWORD) -> None:
    page.goto(f"{base_url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    with page.expect_navigation():
        page.click("button[type=submit]")
    assert "/login/" not in page.url, page.content()


def log_out(page: Any) -> None:
    with page.expect_navigation():
        page.click("text=Log out")
    assert page.url.endswith("/login/")


# --- accessibility and layout --------------------------------------------------------------

# axe-core 4.14.1, vendored for the tests only (tests/browser/vendor/axe-core/README.md).
AXE_SCRIPT = Path(__file__).resolve().parent / "vendor" / "axe-core" / "axe.min.js"
# An expression, not a function: Playwright evaluates it as it is ("void" makes sure of that).
AXE_SOURCE = "void " + AXE_SCRIPT.read_text(encoding="utf-8")

# Every rule axe runs by default (WCAG 2.0-2.2 A/AA and best practices), violations of any impact.
RUN_AXE = """async () => {
  const results = await axe.run(document, {resultTypes: ["violations"]});
  return results.violations.map((v) => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 5).map(
      (n) => n.target.join(" ") + ": " + n.failureSummary.split("\\n").slice(1).join(" ")),
  }));
}"""


def axe_violations(page: Any) -> list[str]:
    """axe-core's violations on the page as it is now, one line per rule (with up to five nodes).

    The page's Content-Security-Policy forbids inline scripts (``add_script_tag`` makes one); what
    Playwright evaluates through the DevTools protocol is not subject to it."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.evaluate(AXE_SOURCE)
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at {' | '.join(v['nodes'])}"
        for v in page.evaluate(RUN_AXE)
    ]


# Wider than the window: the page scrolls sideways.
# The scrolling element's width against its visible width: wider means the page scrolls sideways.
PAGE_WIDTH = """() => ({scroll: document.scrollingElement.scrollWidth,
                      window: document.scrollingElement.clientWidth})"""


# The elements that reach past the window's right edge (to say what made a page too wide).
PAST_THE_EDGE = """() => [...document.querySelectorAll("body *")]
  .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1).slice(0, 8)
  .map((e) => `${e.tagName.toLowerCase()}.${e.className} ends at ${
    Math.round(e.getBoundingClientRect().right)}`)"""


def sideways_scroll(page: Any) -> int:
    """How many CSS pixels the page is wider than its window (0: no sideways scrolling)."""
    width = page.evaluate(PAGE_WIDTH)
    return max(0, width["scroll"] - width["window"])


def too_wide(page: Any) -> str:
    """"" when the page fits its window; else by how much, and which elements reach past it."""
    if wider := sideways_scroll(page):
        return f"scrolls sideways by {wider} px: " + "; ".join(page.evaluate(PAST_THE_EDGE))
    return ""


PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1440, "height": 900}
VIEWPORTS = {"phone": PHONE, "desktop": DESKTOP}
