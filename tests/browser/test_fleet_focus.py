"""The fleet page's poll keeps keyboard focus: a changed host's row is swapped alone, the focused
link in another row stays the same element, and Enter follows it (issue 16, item 1)."""

from __future__ import annotations

import pytest

from tests.factories import GiB, gpu, proc
from tests.fleet.helpers import store

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def busy(name: str, memory_gib: int) -> None:
    store(name, processes=[proc(10, gpu_memory={"GPU-sim-0000": memory_gib * GiB}, reasons=["gpu"])],
          gpus=[gpu(0, used=memory_gib * GiB)])


def test_a_focused_link_survives_a_poll_that_changes_another_row(open_page, screenshot, viewer, settings):
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 1  # the page polls every second
    settings.GPUADMIN_OFFLINE_AFTER_INTERVALS = 3600  # and the hosts stay online meanwhile
    busy("gpu01", 1)
    busy("gpu02", 1)
    page = open_page(viewer)
    page.goto("/")
    link = page.locator('a[href="/hosts/gpu01/"]')
    link.focus()
    page.evaluate("() => { document.activeElement.dataset.marked = 'yes'; }")
    with page.expect_response(lambda r: "seen=" in r.url and r.status == 200):
        busy("gpu02", 3)
    page.wait_for_function("() => document.querySelector('[data-host=\"gpu02\"]').textContent"
                           ".includes('3/80 ')")
    screenshot(page, "after-poll")
    # The same element still has focus: the swap did not touch its row.
    assert page.evaluate("() => document.activeElement.dataset.marked") == "yes"
    assert page.evaluate("() => document.activeElement.getAttribute('href')") == "/hosts/gpu01/"
    # Two more polls with nothing new (204) change nothing either.
    for _ in range(2):
        with page.expect_response(lambda r: "seen=" in r.url and r.status == 204):
            pass
    page.keyboard.press("Enter")
    page.wait_for_url("**/hosts/gpu01/")
