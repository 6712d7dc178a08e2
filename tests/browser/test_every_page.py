"""Every page, at a phone's width (390 x 844) and a laptop's (1440 x 900): axe-core finds no
violation of any impact, and the page never scrolls sideways (the scrolling element's scrollWidth
never exceeds its clientWidth); one host has memory no process accounts for, whose finding's
"no kill" badge and action buttons must wrap on a phone. A screenshot of each is kept
(tests/browser/conftest.py, ``screenshot``); a failed login is announced and marks its fields."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from gpuadmin.accounts.roles import Role
from gpuadmin.kills import services
from tests.browser.helpers import VIEWPORTS, axe_violations, too_wide
from tests.factories import GiB, gpu
from tests.fleet.helpers import store, store_busy_host
from tests.kills.helpers import file, lab_snapshot, store_snapshot
from tests.people import make_person

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def a_lab_with_requests() -> dict[str, str]:
    """The lab host, one pending and one approved request; the pages to visit, by name."""
    store_snapshot(lab_snapshot())
    requester = make_person("rita", Role.REQUESTER)
    approver = make_person("abe", Role.APPROVER, Role.REQUESTER)
    pending = file(requester, 4300)
    approved = file(requester, 4600, reason="evaluation hung since Friday; frees GPU 1")
    services.approve(approved.pk, approver)
    finished = finished_request(requester, approver)
    # Memory held with no process to show for it: an unattributed-memory finding with no kill to offer.
    store("gpu02-with-a-rather-long-host-name", processes=[], gpus=[gpu(0, used=37 * GiB)])
    # A busy host: two GPUs, holders, orphans, zombies and their findings (the README's screenshot).
    store_busy_host("gpu03")
    return {
        "host-busy": "/hosts/gpu03/",
        "host-unattributed": "/hosts/gpu02-with-a-rather-long-host-name/",
        "api-docs": "/api/v1/docs/",
        "fleet": "/",
        "host": "/hosts/gpu01/",
        "process": "/hosts/gpu01/processes/4120-412000/",
        "kill-list": "/kills/",
        "new-request": "/kills/new/?host=gpu01&pid=4120&start=412000",
        "new-request-workload": "/kills/new/?host=gpu01&pid=4120&start=412000&include_descendants=on",
        "new-request-zombie": "/kills/new/?host=gpu01&pid=4200&start=420000",
        "kill-request": f"/kills/{pending.pk}/",
        "kill-request-approved": f"/kills/{approved.pk}/",
        "kill-request-finished": f"/kills/{finished.pk}/",
        "audit": "/audit/",
        "audit-requests": "/audit/?view=requests",
        "notifications": "/notifications/",
    }


def finished_request(requester: Any, approver: Any) -> Any:
    """A kill that ran and succeeded: PID 4121 exited after SIGTERM, its 6 GiB confirmed released."""
    from datetime import UTC, datetime, timedelta

    kill_request = file(requester, 4121, reason="data worker of a finished job, holds 6 GiB")
    services.approve(kill_request.pk, approver)
    at = datetime.now(UTC) - timedelta(seconds=20)
    for seq, kind, extra in [
        (1, "started", {}),
        (2, "signal_sent", {"pid": 4121, "start_time_ticks": 412100, "signal": "SIGTERM", "method": "pidfd",
                            "detail": "sent SIGTERM"}),
        (3, "target_exited", {"pid": 4121, "start_time_ticks": 412100, "signal": "SIGTERM",
                              "detail": "exited (after SIGTERM, 0.21 s after it was sent)"}),
        (4, "finished", {"result": "succeeded", "detail": "every target not refused is gone"}),
    ]:
        services.record_progress({"request_id": kill_request.order_request_id, "seq": seq, "event": kind,
                                  "at": (at + timedelta(seconds=seq)).isoformat(), **extra})
    kill_request.refresh_from_db()
    type(kill_request).objects.filter(pk=kill_request.pk).update(
        memory_released_bytes=kill_request.memory_expected_release_bytes,
        memory_confirmed_at=datetime.now(UTC),
    )
    return kill_request


# With GPUADMIN_PAGE_SCREENSHOTS=<folder> (docs/screenshots/ for the README), the beginning of the
# host page and of the finished kill (two screens each) are written there at both widths (host-1440.png,
# kill-390.png...); docs/screenshots/take_pages.py runs this and shrinks them.
SCREENSHOTS = os.environ.get("GPUADMIN_PAGE_SCREENSHOTS", "")
SCREENSHOT_PAGES = {"host-busy": "host", "kill-request-finished": "kill"}


def keep_screenshots(page: Any, pages: dict[str, str], viewport: str) -> None:
    folder = Path(SCREENSHOTS)
    folder.mkdir(parents=True, exist_ok=True)
    for name, file_name in SCREENSHOT_PAGES.items():
        page.goto(pages[name])
        page.wait_for_load_state("networkidle")
        size = VIEWPORTS[viewport]
        # Two screens: the host page's findings and then its process table, the kill's outcome and steps.
        page.screenshot(path=str(folder / f"{file_name}-{size['width']}.png"), full_page=True,
                        clip={"x": 0, "y": 0, "width": size["width"], "height": 2 * size["height"]})


def problems_of(page: Any) -> list[str]:
    """axe's violations on the page as it is, and whether it scrolls sideways."""
    found = axe_violations(page)
    if wide := too_wide(page):
        found.append(wide)
    return found


def survey(page: Any, screenshot: Any, viewport: str, pages: dict[str, str]) -> dict[str, list[str]]:
    """Each page's problems, by name; a screenshot of each."""
    problems: dict[str, list[str]] = {}
    for name, path in pages.items():
        page.goto(path)
        page.wait_for_load_state("networkidle")
        screenshot(page, f"{name}-{viewport}")
        if found := problems_of(page):
            problems[name] = found
    return problems


def report(problems: dict[str, list[str]]) -> str:
    lines = "\n".join(f"{name}:\n  " + "\n  ".join(found) for name, found in problems.items())
    return f"{sum(map(len, problems.values()))} problems:\n{lines}"


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
def test_every_page_passes_axe_and_fits(open_page, new_context, live_server, screenshot, viewport):
    pages = a_lab_with_requests()
    page = open_page(make_person("anna", Role.APPROVER, Role.REQUESTER), viewport=VIEWPORTS[viewport])
    problems = survey(page, screenshot, viewport, pages)
    if SCREENSHOTS:
        keep_screenshots(page, pages, viewport)

    # The login page, as nobody; then a wrong password: announced, and the fields marked invalid.
    anonymous = new_context(base_url=live_server.url, viewport=VIEWPORTS[viewport]).new_page()
    problems.update(survey(anonymous, screenshot, viewport, {"login": "/login/"}))
    anonymous.fill("#id_username", "anna")
    anonymous.fill("#id_password", "not the password")
    with anonymous.expect_navigation():
        anonymous.keyboard.press("Enter")
    expect(anonymous.get_by_role("alert")).to_contain_text("did not match")
    for field in ("#id_username", "#id_password"):
        expect(anonymous.locator(field)).to_have_attribute("aria-invalid", "true")
        expect(anonymous.locator(field)).to_have_attribute("aria-describedby", "login-error")
    screenshot(anonymous, f"login-failed-{viewport}")
    if found := problems_of(anonymous):
        problems["login-failed"] = found

    assert not problems, report(problems)


def test_filing_a_request_is_announced(open_page):
    store_snapshot(lab_snapshot())
    page = open_page(make_person("rita", Role.REQUESTER))
    page.goto("/kills/new/?host=gpu01&pid=4300&start=430000")
    page.get_by_label("Reason").fill("holds GPU 1 since Friday, nobody answers")
    with page.expect_navigation():
        page.get_by_role("button", name="File the request").click()
    expect(page.get_by_role("status")).to_contain_text("filed; it waits for an approver")
