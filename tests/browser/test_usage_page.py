"""The usage page in a real browser: its stacked chart is drawn from the API under the pages' CSP, axe
finds nothing at a phone's and a laptop's width, the page never scrolls sideways, and a row's link leads
to the processes behind it."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from gpuadmin.accounts.roles import Role
from tests.browser.helpers import VIEWPORTS, axe_violations, too_wide
from tests.browser.test_history_charts import drawn
from tests.people import make_person
from tests.usage.test_ledger import timeline

# The live server reads in its own thread what the test wrote: committed data.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
def test_the_usage_page_draws_its_chart_and_passes_axe(open_page, screenshot, settings, viewport) -> None:
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 10
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 0
    timeline()
    page = open_page(make_person("vera", Role.VIEWER), viewport=VIEWPORTS[viewport])
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto("/usage/?from=2026-12-01&to=2026-12-03&by=user")
    drawn(page, "figure[data-chart='usage']")
    screenshot(page, f"usage-{viewport}")
    assert axe_violations(page) == []
    assert not too_wide(page)
    assert errors == []
    page.get_by_role("row", name="bob").get_by_role("link", name="which").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("bob")
    expect(page.get_by_role("link", name="200")).to_have_count(2)  # GPU0 and GPU1
