"""Shared fixtures for the tests in a real browser (Playwright driving Debian's /usr/bin/chromium).

- ``chromium_browser``: Playwright (from pytest-playwright's dependencies)
  launches /usr/bin/chromium (installed by .ci/run); no browser is ever
  downloaded. Without it the tests skip (fail under
  GPUADMIN_REQUIRE_SERVICES=1, as every missing server does). It lives for one
  module, not the session: while Playwright's sync API runs, its event loop
  makes Django hand this thread other connection objects (asgiref's Local is
  per context), which do not carry the test database's serialized contents
  (for ``serialized_rollback``): they are copied over, and stopping after the
  module gives later tests their own connections back.
- ``guarded_page``: a page that records every Content-Security-Policy
  violation (the ``securitypolicyviolation`` event and the console), every
  script error, and every request it makes; ``guard.assert_clean()`` fails on any.
- ``shoot(page, name)``: a full-page screenshot kept under
  test-artifacts/browser/<test>/ (GPUADMIN_TEST_ARTIFACTS changes the folder).
- ``log_in(page, name)`` / ``log_out(page)`` through the real forms.

The pages come from pytest-django's ``live_server`` (a thread of this process,
on the test database). Playwright's sync API runs an event loop in this
thread, so Django's async-safety check is told that blocking ORM calls here
are intended (DJANGO_ALLOW_ASYNC_UNSAFE; tests only).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests import services

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("GPUADMIN_TEST_ARTIFACTS") or REPO / "test-artifacts") / "browser"
PASSWORD = "correct horse battery"

# Runs before any page script: records what the Content-Security-Policy blocked.
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(
    `${e.violatedDirective} blocked ${e.blockedURI} (${e.sourceFile}:${e.lineNumber})`);
});
"""


@pytest.fixture(scope="module")
def chromium_browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is not installed (Debian package chromium; .ci/run installs it)"
        if services.services_required():
            pytest.fail(f"{reason} (GPUADMIN_REQUIRE_SERVICES=1)", pytrace=False)
        pytest.skip(reason)
    from django.db import connections
    from playwright.sync_api import sync_playwright

    serialized = {alias: getattr(connections[alias], "_test_serialized_contents", None)
                  for alias in connections}
    with sync_playwright() as playwright:
        for alias, contents in serialized.items():
            if contents is not None:
                connections[alias]._test_serialized_contents = contents
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
            connections.close_all()  # the ones opened while Playwright's loop ran


@pytest.fixture
def _role_groups(transactional_db: None) -> None:
    from django.contrib.auth.models import Group

    from gpuadmin.accounts.roles import Role

    for role in Role:
        Group.objects.get_or_create(name=role.value)


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


@pytest.fixture
def guarded_page(chromium_browser: Any, _role_groups: None) -> Iterator[tuple[Any, Guard]]:
    context = chromium_browser.new_context()
    page = context.new_page()
    guard = Guard(page)
    page.add_init_script(RECORD_VIOLATIONS)
    page.on("console", lambda m: guard.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: guard.page_errors.append(str(e)))
    page.on("request", lambda r: guard.requests.append(r.url))
    page.set_default_timeout(30_000)
    try:
        yield page, guard
    finally:
        context.close()


@pytest.fixture
def shoot(request: pytest.FixtureRequest) -> Callable[[Any, str], Path]:
    folder = ARTIFACTS / re.sub(r"[^\w.-]+", "_", request.node.name)
    folder.mkdir(parents=True, exist_ok=True)
    counter = iter(range(1, 1000))

    def _shoot(page: Any, name: str) -> Path:
        path = folder / f"{next(counter):02d}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return _shoot


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
