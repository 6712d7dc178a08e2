"""What every browser test shares, in one place: Debian's chromium driven by Playwright
(pytest-playwright's fixtures), against pytest-django's live server, logged in as a named person.

- ``browser_type_launch_args``: /usr/bin/chromium (``GPUADMIN_CHROMIUM`` names another), run as
  root without a sandbox and without reaching the network. No browser is ever downloaded: nothing
  runs ``playwright install``. Missing: the test skips, or fails under GPUADMIN_REQUIRE_SERVICES=1.
- ``open_page(user, **context_args)``: a new page whose session belongs to ``user``, with the live
  server as its base URL (``page.goto("/audit/")``). Every console error and every 4xx/5xx answer
  (a missing /favicon.ico, say) fails the test at teardown.
- ``screenshot(page, name)``: kept under ``$GPUADMIN_TEST_ARTIFACTS`` or tests/artifacts/
  (ignored by git), named after the test and the database.
- ``guarded_page``: ``(page, guard)``, a page that is not logged in (tests log in through the real
  form, ``helpers.log_in``) whose ``guard`` records every Content-Security-Policy violation, script
  error and request; ``guard.assert_clean()`` fails on any.
- ``start_worker`` and ``publish_to`` (tests/integration/helpers.py): real Celery workers over Redis.

Playwright runs for one test at a time, started after the test's database is set up and stopped
before it is flushed: its sync API leaves an event loop marked running in the test's thread, and
while one is, Django refuses ORM calls (``DJANGO_ALLOW_ASYNC_UNSAFE`` is set for exactly that
time) and hands out other connection objects than the one the test database lives on — so
pytest-playwright's session-wide fixtures are function-scoped here, and the connections opened
meanwhile are closed before the loop stops.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, connections
from django.test import Client
from playwright.sync_api import Browser, BrowserType, Page, Playwright, sync_playwright

from tests import services
from tests.browser.helpers import RECORD_VIOLATIONS, Guard
from tests.integration.helpers import publish_to, start_worker  # noqa: F401 - fixtures

CHROMIUM = Path(os.environ.get("GPUADMIN_CHROMIUM", "/usr/bin/chromium"))
# Root in a container has no user namespaces for the sandbox; the rest keeps chromium off the network.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]
ARTIFACTS = Path(
    os.environ.get("GPUADMIN_TEST_ARTIFACTS") or Path(__file__).resolve().parents[1] / "artifacts"
)


@pytest.fixture(scope="package")
def browser_type_launch_args() -> dict[str, Any]:
    if not os.access(CHROMIUM, os.X_OK):
        reason = f"no chromium at {CHROMIUM} (Debian: apt-get install chromium)"
        if services.services_required():
            pytest.fail(f"{reason} (GPUADMIN_REQUIRE_SERVICES=1)", pytrace=False)
        pytest.skip(reason)
    return {"executable_path": str(CHROMIUM), "args": CHROMIUM_ARGS, "headless": True}


@pytest.fixture
def playwright(browser_type_launch_args: dict[str, Any]) -> Iterator[Playwright]:
    # See the module docstring: the variable is set exactly while Playwright's loop runs.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as running:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield running
        connections.close_all()


@pytest.fixture
def browser_type(playwright: Playwright, browser_name: str) -> BrowserType:
    return getattr(playwright, browser_name)


@pytest.fixture
def launch_browser(
    browser_type_launch_args: dict[str, Any], browser_type: BrowserType
) -> Callable[..., Browser]:
    return lambda **kwargs: browser_type.launch(**{**browser_type_launch_args, **kwargs})


@pytest.fixture
def browser(launch_browser: Callable[..., Browser]) -> Iterator[Browser]:
    launched = launch_browser()
    yield launched
    launched.close()


@pytest.fixture
def browser_context_args() -> dict[str, Any]:
    return {}


@pytest.fixture
def open_page(live_server: Any, new_context: Callable[..., Any]) -> Iterator[Callable[..., Page]]:
    problems: list[str] = []

    def open_as(user: Any, **context_args: Any) -> Page:
        client = Client()
        client.force_login(user)
        session = client.cookies[settings.SESSION_COOKIE_NAME].value
        context = new_context(base_url=live_server.url, **context_args)
        context.add_cookies(
            [{"name": settings.SESSION_COOKIE_NAME, "value": session, "url": live_server.url}]
        )
        page = context.new_page()
        page.on("console", lambda m: m.type == "error" and problems.append(f"console error: {m.text}"))
        page.on("response", lambda r: r.status >= 400 and problems.append(f"{r.status} {r.url}"))
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        return page

    yield open_as
    assert not problems, "the browser saw errors: " + "; ".join(problems)


@pytest.fixture
def screenshot(request: pytest.FixtureRequest) -> Callable[[Page, str], Path]:
    def take(page: Page, name: str) -> Path:
        test = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)
        path = ARTIFACTS / f"{test}-{name}-{connection.vendor}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


@pytest.fixture
def guarded_page(live_server: Any, new_context: Callable[..., Any]) -> Iterator[tuple[Page, Guard]]:
    from django.contrib.auth.models import Group

    from gpuadmin.accounts.roles import Role

    for role in Role:  # a transactional test starts without the groups the migrations made
        Group.objects.get_or_create(name=role.value)
    context = new_context(base_url=live_server.url)
    page = context.new_page()
    guard = Guard(page)
    page.add_init_script(RECORD_VIOLATIONS)
    page.on("console", lambda m: guard.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda error: guard.page_errors.append(str(error)))
    page.on("request", lambda r: guard.requests.append(r.url))
    page.set_default_timeout(30_000)
    yield page, guard
