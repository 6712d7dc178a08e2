"""The fleet page for a whole lab (issue 33), in Chromium with 200 synthetic hosts of 8 GPUs, some offline:
at 1440 x 900 the first screen shows at least 25 host rows and an alert that names the offline hosts; at
390 px the page never scrolls sideways; axe finds no serious or critical rule at either width.

With GPUADMIN_FLEET_SCREENSHOTS=<folder> it also writes fleet-1440.png and fleet-390.png there (the first
screen of each): `GPUADMIN_FLEET_SCREENSHOTS=docs/screenshots .venv/bin/python -m pytest
tests/browser/test_fleet_attention.py` is how docs/screenshots/ gets them.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import expect

from gpuadmin.accounts.roles import Role
from gpuadmin.fleet import synthetic
from gpuadmin.fleet.models import Host
from tests.browser.helpers import axe_violations, too_wide
from tests.people import make_person

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

HOSTS = 200
# Few processes each: the page shows GPUs, counts and findings, and 200 hosts go in within seconds.
PROCESSES = 24
OFFLINE = ("sim-a100-0007", "sim-a100-0042", "sim-a100-0111", "sim-a100-0150", "sim-a100-0199")
DESKTOP = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}
SCREENSHOTS = os.environ.get("GPUADMIN_FLEET_SCREENSHOTS", "")


def a_lab_of_200_hosts() -> None:
    """200 synthetic hosts through the real signed ingest path, five of them silent for two hours."""
    hosts = synthetic.demo_hosts(settings.DATA_DIR, HOSTS, gpus=8, processes=PROCESSES, prefix="sim-a100")
    for host in hosts:
        synthetic.send(host, 0)
    Host.objects.filter(name__in=OFFLINE).update(last_seen_at=timezone.now() - timedelta(hours=2))


def serious(page: Any) -> list[str]:
    """axe's serious and critical violations (the impacts issue 33 allows none of)."""
    return [v for v in axe_violations(page) if "(serious)" in v or "(critical)" in v]


def keep_screenshot(page: Any, name: str) -> None:
    if SCREENSHOTS:
        folder = Path(SCREENSHOTS)
        folder.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(folder / name))


@pytest.fixture
def fleet_viewer(open_page: Any, settings: Any) -> Any:
    # Online for an hour after their snapshot: on a loaded machine the first of 200 hosts was sent more
    # than the usual 30 s before the page looked, and showed offline too. The five stay two hours old.
    settings.GPUADMIN_OFFLINE_AFTER_INTERVALS = 3600 // settings.GPUADMIN_PROBE_INTERVAL_SECONDS
    a_lab_of_200_hosts()
    return lambda viewport: open_page(make_person("vera", Role.VIEWER), viewport=viewport)


def test_a_desktop_screen_shows_25_hosts_and_an_alert_naming_the_offline_ones(fleet_viewer):
    page = fleet_viewer(DESKTOP)
    page.goto("/")
    page.wait_for_load_state("networkidle")
    assert not too_wide(page), too_wide(page)
    rows = page.locator("tr[id^=host-row-]")
    expect(rows.first).to_be_visible()
    bottoms = rows.evaluate_all("rows => rows.map(r => r.getBoundingClientRect().bottom)")
    assert sum(bottom <= DESKTOP["height"] for bottom in bottoms) >= 25
    # One line per host: an 8-GPU row is as tall as a line of text.
    assert max(rows.evaluate_all("rows => rows.map(r => r.getBoundingClientRect().height)")) < 30
    alert = page.get_by_role("alert").filter(has_text="offline")
    expect(alert).to_be_visible()
    assert alert.bounding_box()["y"] + alert.bounding_box()["height"] <= DESKTOP["height"]
    for name in OFFLINE:
        expect(alert).to_contain_text(name)
    # The nav's count on the page includes them.
    expect(page.locator("#nav-attention .count")).not_to_have_text("0")
    keep_screenshot(page, "fleet-1440.png")
    assert not serious(page), serious(page)
    # The offline hosts themselves (after the online ones: on the last page): grey badges, stale findings.
    page.goto("/?status=offline")
    expect(page.locator("tr.host-offline")).to_have_count(len(OFFLINE))
    assert not serious(page), serious(page)


def test_a_phone_shows_the_alert_first_and_never_scrolls_sideways(fleet_viewer):
    page = fleet_viewer(PHONE)
    page.goto("/")
    page.wait_for_load_state("networkidle")
    assert not too_wide(page), too_wide(page)
    alert = page.get_by_role("alert").filter(has_text="offline")
    expect(alert).to_be_visible()
    first_row = page.locator("tr[id^=host-row-]").first
    assert alert.bounding_box()["y"] < first_row.bounding_box()["y"]
    # Each host is a card: its name never breaks mid-name.
    name = first_row.locator("td.host-name a")
    assert name.evaluate("a => a.getClientRects().length") == 1
    keep_screenshot(page, "fleet-390.png")
    assert not serious(page), serious(page)
    page.goto("/?status=offline")
    expect(page.locator("tr.host-offline")).to_have_count(len(OFFLINE))
    assert not too_wide(page), too_wide(page)
    assert not serious(page), serious(page)
