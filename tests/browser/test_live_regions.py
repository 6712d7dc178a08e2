"""Polled regions in a real browser, by keyboard, at a phone's and a desktop's width: a refresh
keeps the focused link focused (and pointing at the same process), a half-typed reason stays, and
the kill list shows each request under its status after a decision and as requests come and go.

The poll interval is one second here (GPUADMIN_PROBE_INTERVAL_SECONDS); the tests wait for the
polls' answers, never for a time."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from playwright.sync_api import expect

from gpuadmin.accounts.roles import Role
from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest
from tests.browser.helpers import VIEWPORTS, sideways_scroll
from tests.factories import proc
from tests.kills.helpers import file, lab_snapshot, store_snapshot
from tests.people import make_person

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

VIEWPORT_NAMES = list(VIEWPORTS)
# An htmx request in flight, or a swap not yet settled.
BUSY = ".htmx-request, .htmx-swapping, .htmx-settling"
SWAPS_DONE = f"() => !document.querySelector('{BUSY}')"


# The lists' poll has fired since the listener went in, and no request or swap of the lists is under way.
POLL_FIRED_AND_IDLE = (
    f"() => window.listsPollFired && !document.querySelector('#kill-request-lists').matches('{BUSY}')"
)
LISTEN_FOR_THE_POLL = """() => { window.listsPollFired = false;
    document.body.addEventListener('htmx:confirm', (event) => {
        if (event.detail.elt.id === 'kill-request-lists') window.listsPollFired = true; }); }"""


@pytest.fixture
def one_second_polls(settings: Any) -> None:
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 1


def wait_for_polls(page: Any, path: str, count: int = 2) -> None:
    """Wait until htmx has asked ``path`` again ``count`` times and swapped each answer in."""
    for _ in range(count):
        with page.expect_response(lambda r: r.url.split("?")[0].endswith(path)
                                  and r.request.headers.get("hx-request") == "true"):
            pass
        page.wait_for_function(SWAPS_DONE)


@pytest.mark.parametrize("viewport", VIEWPORT_NAMES)
def test_a_focused_request_kill_link_survives_two_polls(open_page, one_second_polls, screenshot, viewport):
    store_snapshot(lab_snapshot())
    page = open_page(make_person("rita", Role.REQUESTER), viewport=VIEWPORTS[viewport])
    page.goto("/hosts/gpu01/")
    link = page.locator("#process-4300-430000 a.request-kill")
    link.focus()
    # The next snapshot: a process above it appears and memory changes, so the rows really move.
    store_snapshot(lab_snapshot(replace={4600: proc(4600, user="carol", uid=1002, name="python",
                                                    cmdline=["python", "eval.py"],
                                                    gpu_memory={"GPU-sim-0001": 9 * 1024**3})}))
    wait_for_polls(page, "/hosts/gpu01/")
    expect(page.locator("#process-4600-460000")).to_contain_text("9 GiB")  # the poll did change the table
    assert page.evaluate("document.activeElement.closest('tr') && document.activeElement.closest('tr').id") \
        == "process-4300-430000"
    screenshot(page, f"focus-kept-{viewport}")
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert "/kills/new/?host=gpu01&pid=4300&start=430000" in page.url
    expect(page.locator("h1")).to_contain_text("New kill request")


def test_a_focused_sort_header_survives_a_poll_and_sorts(open_page, one_second_polls):
    store_snapshot(lab_snapshot())
    page = open_page(make_person("vic", Role.VIEWER))
    page.goto("/hosts/gpu01/")
    page.get_by_role("link", name="PID").focus()
    wait_for_polls(page, "/hosts/gpu01/")
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert "sort=pid" in page.url


def test_the_skip_link_is_the_first_tab_and_goes_to_the_content(open_page):
    store_snapshot(lab_snapshot())
    page = open_page(make_person("vic", Role.VIEWER))
    page.goto("/hosts/gpu01/")
    page.keyboard.press("Tab")
    expect(page.locator(":focus")).to_have_text("Skip to the content")
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    page.keyboard.press("Tab")  # the first control of the page's content, not the top bar's
    assert page.evaluate("document.getElementById('main').contains(document.activeElement)")
    expect(page.locator(":focus")).to_have_text("Probe now")


@pytest.mark.parametrize("viewport", VIEWPORT_NAMES)
def test_approving_from_the_list_moves_the_row_and_the_list_stays_current(
    open_page, one_second_polls, screenshot, viewport
):
    store_snapshot(lab_snapshot())
    requester = make_person("rita", Role.REQUESTER)
    first = file(requester, 4300)
    second = file(requester, 4600, reason="evaluation hung since Friday")
    page = open_page(make_person("abe", Role.APPROVER), viewport=VIEWPORTS[viewport])
    page.goto("/kills/")
    pending = page.locator("#kill-requests-pending")
    active = page.locator("#kill-requests-active")
    approve = pending.locator(f"#kill-request-{first.pk}").get_by_role("button", name="Approve")
    # Reachable without scrolling sideways, at either width.
    box = approve.bounding_box()
    assert box is not None and box["x"] + box["width"] <= VIEWPORTS[viewport]["width"]
    assert sideways_scroll(page) == 0
    screenshot(page, f"before-approval-{viewport}")

    # Typing a reason to reject the second one, then approving the first by keyboard.
    reason = page.get_by_label(f"reason to reject #{second.pk}")
    reason.fill("not y")
    approve.focus()
    page.keyboard.press("Enter")
    expect(active.locator(f"#kill-request-{first.pk}")).to_contain_text("Approved")
    expect(pending.locator(f"#kill-request-{first.pk}")).to_have_count(0)
    expect(page.locator("#kill-request-decision")).to_have_text(f"Request #{first.pk} approved.")
    expect(page.locator("#kill-request-lists")).to_have_count(1)  # morphed, not nested in itself
    expect(reason).to_have_value("not y")
    screenshot(page, f"after-approval-{viewport}")

    # A request filed elsewhere appears with the next poll; the half-typed reason is still there.
    reason.focus()
    third = file(requester, 4120, reason="a third one")
    wait_for_polls(page, "/kills/")
    expect(pending.locator(f"#kill-request-{third.pk}")).to_be_visible()
    expect(reason).to_have_value("not y")
    # The polls did not wipe the announcement (they know of no decision).
    expect(page.locator("#kill-request-decision")).to_have_text(f"Request #{first.pk} approved.")
    assert page.evaluate("document.activeElement.name") == "reason"


@dataclass
class HeldApproval:
    """The kill list as an approver sees it: two pending requests, a reason typed to reject the second.
    The server commits an approval at once but holds its answer until ``answer_may_go`` is set."""

    page: Any
    first: KillRequest
    reason: Any
    answer_may_go: threading.Event


@pytest.fixture
def held_approval(open_page, monkeypatch) -> Callable[[], HeldApproval]:
    """Opens the list when called (after the test's own settings, such as the poll interval, apply)."""
    store_snapshot(lab_snapshot())
    requester = make_person("rita", Role.REQUESTER)
    first = file(requester, 4300)
    second = file(requester, 4600, reason="evaluation hung since Friday")
    answer_may_go = threading.Event()
    approve = services.approve

    def approve_and_hold_the_answer(*args: Any, **kwargs: Any) -> Any:
        approved = approve(*args, **kwargs)
        answer_may_go.wait(timeout=30)
        return approved

    monkeypatch.setattr(services, "approve", approve_and_hold_the_answer)

    def open_list() -> HeldApproval:
        page = open_page(make_person("abe", Role.APPROVER))
        page.goto("/kills/")
        reason = page.get_by_label(f"reason to reject #{second.pk}")
        reason.fill("not y")
        return HeldApproval(page, first, reason, answer_may_go)

    return open_list


def expect_the_approval_morphed_in(held: HeldApproval) -> None:
    """Announced, the request under its new status, the lists not nested, the typed reason kept."""
    page, first = held.page, held.first
    expect(page.locator("#kill-request-decision")).to_have_text(f"Request #{first.pk} approved.")
    expect(page.locator(f"#kill-requests-active #kill-request-{first.pk}")).to_contain_text("Approved")
    expect(page.locator("#kill-request-lists")).to_have_count(1)
    expect(held.reason).to_have_value("not y")


def test_a_poll_while_a_decision_is_on_its_way_waits_for_it(one_second_polls, held_approval):
    """The server holds the approval's answer (the approval itself is committed) until the lists' poll
    has fired. Answered first, that poll would remove the Approve form; the approval's answer would
    then be swapped without the morph extension (htmx finds it from the requesting element), nesting
    the lists in themselves and emptying the typed reason. Queued behind the decision, it waits."""
    held = held_approval()
    page = held.page
    page.locator(f"#kill-request-{held.first.pk}").get_by_role("button", name="Approve").click()
    page.evaluate(LISTEN_FOR_THE_POLL)
    page.wait_for_function(POLL_FIRED_AND_IDLE)
    held.answer_may_go.set()

    expect_the_approval_morphed_in(held)
    wait_for_polls(page, "/kills/")  # and the polls after it agree
    expect(page.locator("#kill-request-lists")).to_have_count(1)
    expect(held.reason).to_have_value("not y")


def test_a_decision_whose_form_left_the_page_on_the_way_is_still_morphed(held_approval):
    """Whatever takes the deciding form off the page while its request is on the way (here a script;
    a refresh that replaced the row would do it), the answer is still morphed into the lists: htmx
    looks the morph extension up from the requesting element and its ancestors, so the form names
    it itself. Swapped without it (innerHTML), the lists would nest in themselves and every typed
    reason would be gone."""
    held = held_approval()
    row = held.page.locator(f"#kill-request-{held.first.pk}")
    deciding_form = row.locator("form").first
    row.get_by_role("button", name="Approve").click()
    expect(deciding_form).to_have_class(re.compile(r"\bhtmx-request\b"))  # on its way, held
    deciding_form.evaluate("form => form.remove()")
    held.answer_may_go.set()

    expect_the_approval_morphed_in(held)
