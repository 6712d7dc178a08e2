"""Hostile command lines in a real browser: nothing runs, no htmx attribute comes alive, no CSP
violation is reported, and control characters are visible as escapes."""

from __future__ import annotations

import pytest

from gpuadmin.accounts.roles import Role
from tests.browser.helpers import (
    CLEAN_DOM,
    HOSTILE_ARGS,
    NO_LIVE_PAYLOAD,
    PWNED_PATHS,
    VISIBLE_CONTROLS,
    log_in,
)
from tests.factories import GiB, gpu, proc
from tests.fleet.helpers import store
from tests.keys import enrol
from tests.people import make_person

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

GPU = {"GPU-sim-0000": 4 * GiB}


def test_hostile_command_lines_stay_text_on_every_page(live_server, guarded_page, screenshot):
    page, guard = guarded_page
    make_person("rick", Role.REQUESTER)
    enrol(store("gpu01", gpus=[gpu(0, used=4 * GiB)],
                processes=[proc(5151, name="python", cmdline=["python", *HOSTILE_ARGS], gpu_memory=GPU)]))
    log_in(page, live_server.url, "rick")
    pages = {
        "fleet": "/",
        "host": "/hosts/gpu01/",
        "new-request": "/kills/new/?host=gpu01&pid=5151&start=515100",
    }
    for name, path in pages.items():
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state("networkidle")
        screenshot(page, name)
        assert page.evaluate(NO_LIVE_PAYLOAD) == CLEAN_DOM, name
        guard.assert_clean()
    # The host page and the preview show the arguments, control characters as escapes.
    for name in ("host", "new-request"):
        page.goto(f"{live_server.url}{pages[name]}")
        text = page.inner_text("main")
        for shown in VISIBLE_CONTROLS:
            assert shown in text, name
        assert "<script>window.__pwned = 'script'</script>" in text
        assert 'hx-get="/pwned-hx-get"' in text
    assert not [url for url in guard.requests if url.endswith(PWNED_PATHS)]
    guard.assert_clean()


def test_the_guard_sees_what_the_policy_blocks(live_server, guarded_page):
    """The checks above can fail: markup that did reach the DOM live is blocked and reported."""
    page, guard = guarded_page
    make_person("vera", Role.VIEWER)
    log_in(page, live_server.url, "vera")
    page.evaluate("""document.body.insertAdjacentHTML("beforeend",
                     '<img src="x" onerror="window.__pwned = 1">')""")
    page.wait_for_function("window.__cspViolations.length > 0")
    assert page.evaluate("window.__pwned === undefined")  # blocked, not run
    assert any(v.startswith("script-src-attr blocked inline") for v in guard.violations())
    with pytest.raises(AssertionError, match="CSP violations reported"):
        guard.assert_clean()
