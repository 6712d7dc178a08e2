"""The fleet page's poll sends only what changed: 204 when nothing did, else the changed rows by their ids."""

import html
import re

import pytest
from django.urls import reverse

from gpuadmin.fleet.models import Host
from tests.factories import GiB, gpu, proc
from tests.fleet.helpers import make_offline, store

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def poll_url(page: str) -> str:
    """The URL the page's poller asks (with what the page shows, ``seen``)."""
    match = re.search(r'<div id="fleet-poll" hidden hx-get="([^"]+)" hx-trigger="every \d+s" '
                      r'hx-swap="outerHTML"></div>', page)
    assert match, "no poller"
    return html.unescape(match.group(1))


def three_hosts() -> list[Host]:
    return [store(name, processes=[proc(10, gpu_memory={"GPU-sim-0000": GiB}, reasons=["gpu"])],
                  gpus=[gpu(0, used=GiB)]) for name in ("gpu01", "gpu02", "gpu03")]


def swapped_rows(body: str) -> list[str]:
    return re.findall(r'<tr id="host-row-\d+" class="[^"]*" data-host="([^"]+)" hx-swap-oob="true">', body)


def test_a_poll_of_an_unchanged_fleet_is_answered_204_with_no_body(viewer_client):
    three_hosts()
    page = viewer_client.get(reverse("fleet")).content.decode()
    response = viewer_client.get(poll_url(page), **HTMX)
    assert response.status_code == 204
    assert len(response.content) < 2048
    assert response.content == b""


def test_a_changed_host_comes_back_as_its_row_alone(viewer_client):
    hosts = three_hosts()
    page = viewer_client.get(reverse("fleet")).content.decode()
    store("gpu02", processes=[proc(10, gpu_memory={"GPU-sim-0000": 3 * GiB}, reasons=["gpu"])],
          gpus=[gpu(0, used=3 * GiB)])
    response = viewer_client.get(poll_url(page), **HTMX)
    assert response.status_code == 200
    body = response.content.decode()
    assert swapped_rows(body) == ["gpu02"]
    assert f'<tr id="host-row-{hosts[1].pk}"' in body
    assert "3/80 " in body
    assert 'id="fleet-hosts"' not in body  # never the whole table again
    # The summary's memory changed too: it comes out of band; the poller carries the new version.
    assert re.search(r'<section id="fleet-summary" [^>]*hx-swap-oob="true">', body)
    again = viewer_client.get(poll_url(body), **HTMX)
    assert again.status_code == 204


def test_a_snapshot_that_changes_nothing_shown_sends_nothing(viewer_client):
    three_hosts()
    page = viewer_client.get(reverse("fleet")).content.decode()
    store("gpu01", processes=[proc(10, gpu_memory={"GPU-sim-0000": GiB}, reasons=["gpu"])],
          gpus=[gpu(0, used=GiB)])  # a newer snapshot, the same figures: only last_seen_at moved
    assert viewer_client.get(poll_url(page), **HTMX).status_code == 204


def test_a_host_going_offline_sends_its_row_and_the_summary(viewer_client):
    hosts = three_hosts()
    page = viewer_client.get(reverse("fleet")).content.decode()
    make_offline(hosts[2])
    body = viewer_client.get(poll_url(page), **HTMX).content.decode()
    assert swapped_rows(body) == ["gpu03"]
    assert '<span class="badge badge-offline">offline</span>' in body
    assert '<span class="summary-offline">1 offline</span>' in body


def test_a_new_host_sends_the_table_region_again(viewer_client):
    three_hosts()
    page = viewer_client.get(reverse("fleet")).content.decode()
    store("gpu00")
    body = viewer_client.get(poll_url(page), **HTMX).content.decode()
    assert '<section id="fleet-hosts" hx-swap-oob="true">' in body
    assert re.findall(r'data-host="([^"]+)"', body) == ["gpu00", "gpu01", "gpu02", "gpu03"]
    assert viewer_client.get(poll_url(body), **HTMX).status_code == 204


def test_a_host_that_moves_up_sends_the_table_region_again(viewer_client):
    three_hosts()
    page = viewer_client.get(reverse("fleet")).content.decode()
    store("gpu03", processes=[proc(10, ppid=1, orphaned=True, pgid=9, sid=9, reasons=["gpu"],
                                   gpu_memory={"GPU-sim-0000": GiB})], gpus=[gpu(0, used=GiB)])
    body = viewer_client.get(poll_url(page), **HTMX).content.decode()
    assert re.findall(r'data-host="([^"]+)"', body) == ["gpu03", "gpu01", "gpu02"]


def test_a_poll_without_a_version_gets_the_whole_region_and_the_poll_keeps_the_filters(viewer_client):
    three_hosts()
    body = viewer_client.get(reverse("fleet"), {"name": "gpu02"}, **HTMX).content.decode()
    assert re.findall(r'data-host="([^"]+)"', body) == ["gpu02"]
    assert "<html" not in body
    assert poll_url(body).startswith(f'{reverse("fleet")}?name=gpu02&seen=')


def test_the_poll_varies_on_htmx_headers(viewer_client):
    three_hosts()
    response = viewer_client.get(reverse("fleet"), **HTMX)
    assert "HX-Request" in response["Vary"]
