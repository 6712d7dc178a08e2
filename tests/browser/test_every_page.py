"""Every page, at a phone's width (390 × 844) and a desktop's (1920 × 1080): axe-core finds no
violation of any impact, and the page never scrolls sideways. A screenshot of each is kept
(tests/browser/conftest.py, ``screenshot``)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuadmin.accounts.roles import Role
from gpuadmin.kills import services
from tests.browser.helpers import VIEWPORTS, axe_violations, sideways_scroll
from tests.kills.helpers import file, lab_snapshot, store_snapshot
from tests.people import make_person

WIDE = """() => [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
  .slice(0, 8).map(e => e.tagName + '.' + e.className + '#' + e.id + ' ' + Math.round(e.getBoundingClientRect().right) + ' ' + (e.textContent||'').slice(0,40))"""

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def a_lab_with_requests() -> dict[str, str]:
    """The lab host, one pending and one approved request; the pages to visit, by name."""
    store_snapshot(lab_snapshot())
    requester = make_person("rita", Role.REQUESTER)
    approver = make_person("abe", Role.APPROVER, Role.REQUESTER)
    pending = file(requester, 4300)
    approved = file(requester, 4600, reason="evaluation hung since Friday; frees GPU 1")
    services.approve(approved.pk, approver)
    return {
        "fleet": "/",
        "host": "/hosts/gpu01/",
        "process": "/hosts/gpu01/processes/4120-412000/",
        "kill-list": "/kills/",
        "new-request": "/kills/new/?host=gpu01&pid=4120&start=412000",
        "kill-request": f"/kills/{pending.pk}/",
        "kill-request-approved": f"/kills/{approved.pk}/",
        "audit": "/audit/",
        "audit-requests": "/audit/?view=requests",
        "notifications": "/notifications/",
    }


def survey(page: Any, screenshot: Any, viewport: str, pages: dict[str, str]) -> dict[str, list[str]]:
    """Each page's problems (axe's violations, sideways scrolling), by name; a screenshot of each."""
    problems: dict[str, list[str]] = {}
    for name, path in pages.items():
        page.goto(path)
        page.wait_for_load_state("networkidle")
        screenshot(page, f"{name}-{viewport}")
        found = axe_violations(page)
        if wider := sideways_scroll(page):
            found.append(f"scrolls sideways by {wider} px: {page.evaluate(WIDE)}")
        if found:
            problems[name] = found
    return problems


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
def test_every_page_passes_axe_and_fits(open_page, new_context, live_server, screenshot, viewport):
    pages = a_lab_with_requests()
    page = open_page(make_person("anna", Role.APPROVER, Role.REQUESTER), viewport=VIEWPORTS[viewport])
    problems = survey(page, screenshot, viewport, pages)
    # The login page, as nobody.
    anonymous = new_context(base_url=live_server.url, viewport=VIEWPORTS[viewport]).new_page()
    problems.update(survey(anonymous, screenshot, viewport, {"login": "/login/"}))
    anonymous.fill("#id_username", "anna")
    anonymous.fill("#id_password", "not the password")
    with anonymous.expect_navigation():
        anonymous.click("button[type=submit]")
    problems.update(survey(anonymous, screenshot, viewport, {}) or {})
    found = axe_violations(anonymous)
    if found:
        problems["login-failed"] = found
    report = "\n".join(f"{name}:\n  " + "\n  ".join(lines) for name, lines in problems.items())
    assert not problems, f"{sum(map(len, problems.values()))} problems:\n{report}"
