"""A fleet row's HTML is rendered once per process while the row shows the same (fleet_page.row_html)."""

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

import pytest
from django.test import override_settings
from django.urls import reverse, set_script_prefix
from django.utils import timezone

from gpuadmin.web import fleet_page
from gpuadmin.web.fleet_page import FleetRow, row_html


@pytest.fixture(autouse=True)
def no_rendered_rows() -> Iterator[None]:
    fleet_page._cached_row_html.cache_clear()
    yield
    fleet_page._cached_row_html.cache_clear()


def a_row(**changes: object) -> FleetRow:
    row = FleetRow(pk=7, name="gpu07", online=True, last_seen_at=None, never_seen=False, last_error="",
                   gpu_data_available=True, bars=(), gpu_process_count=3, zombie_count=0,
                   findings_critical=0, findings_warning=1, findings_info=0)
    return replace(row, **changes)


def renders() -> int:
    """How many rows were rendered (not served from what the process kept)."""
    return fleet_page._cached_row_html.cache_info().misses


def test_an_online_row_is_rendered_once_while_it_shows_the_same():
    first = row_html(a_row())
    again = row_html(a_row())  # an equal row, another object: compared by value
    assert again == first
    assert renders() == 1
    changed = row_html(a_row(zombie_count=4))
    assert renders() == 2
    assert '<span class="badge badge-warning">4</span>' in changed
    assert '<span class="badge badge-warning">4</span>' not in first


def test_a_row_swapped_out_of_band_is_kept_apart_from_the_row_in_the_table():
    in_table, alone = row_html(a_row()), row_html(a_row(), oob=True)
    assert 'hx-swap-oob="true"' in alone
    assert 'hx-swap-oob="true"' not in in_table
    assert renders() == 2


def test_an_offline_row_is_rendered_each_time_since_it_says_how_long_ago():
    row = a_row(online=False, last_seen_at=timezone.now() - timedelta(hours=2))
    assert "(2 h ago)</span></time>" in row_html(row)
    assert "(2 h ago)</span></time>" in row_html(row)
    assert fleet_page._cached_row_html.cache_info().currsize == 0


def test_a_kept_row_follows_the_offline_window_and_the_script_prefix():
    assert "in the last 30 s" in row_html(a_row())
    with override_settings(GPUADMIN_PROBE_INTERVAL_SECONDS=20):
        assert "in the last 60 s" in row_html(a_row())
    set_script_prefix("/gpu-admin/")
    try:
        prefixed = row_html(a_row())
    finally:
        set_script_prefix("/")
    assert f'<a href="/gpu-admin{reverse("host_detail", kwargs={"name": "gpu07"})}">' in prefixed
    assert f'<a href="{reverse("host_detail", kwargs={"name": "gpu07"})}">' in row_html(a_row())
