"""The fleet overview: every host, online or not, with GPU bars, counts and findings."""

import re

import pytest
from django.urls import reverse

from gpuadmin.fleet.models import Host
from tests.factories import GiB, gpu, proc
from tests.fleet.helpers import make_offline, store, store_busy_host

pytestmark = pytest.mark.django_db


def host_row(page: str, name: str) -> str:
    match = re.search(rf'<tr class="[^"]*" data-host="{re.escape(name)}">.*?</tr>', page, re.S)
    assert match, f"no row for {name}"
    return match.group(0)


def test_lists_every_host_with_a_link_to_its_page(viewer_client):
    store_busy_host("gpu01")
    store("gpu02")
    page = viewer_client.get(reverse("fleet")).content.decode()
    assert f'<a href="{reverse("host_detail", kwargs={"name": "gpu01"})}">gpu01</a>' in page
    assert f'<a href="{reverse("host_detail", kwargs={"name": "gpu02"})}">gpu02</a>' in page


def test_a_host_silent_for_three_intervals_is_marked_offline_with_its_last_seen_time(viewer_client):
    store("fresh")
    stale = make_offline(store("stale"))
    page = viewer_client.get(reverse("fleet")).content.decode()
    assert 'class="host-online"' in host_row(page, "fresh")
    assert '<span class="badge badge-online">online</span>' in host_row(page, "fresh")
    row = host_row(page, "stale")
    assert 'class="host-offline"' in row
    assert '<span class="badge badge-offline">offline</span>' in row
    exact = stale.last_seen_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f'title="{exact}">2\xa0hours ago</time>' in row


def test_each_gpu_has_a_bar_with_its_unattributed_part(viewer_client):
    store_busy_host("gpu01")
    row = host_row(viewer_client.get(reverse("fleet")).content.decode(), "gpu01")
    # GPU 0: 28 of 80 GiB attributed (35 %), 2 GiB unattributed (2.5 %).
    assert '<rect class="bar-attributed" width="35.0%" height="100%"/>' in row
    assert '<rect class="bar-unattributed" x="35.0%" width="2.5%" height="100%"/>' in row
    assert "30 GiB / 80 GiB" in row
    assert "(2 GiB unattributed)" in row
    # GPU 1: 8 of 80 GiB attributed.
    assert '<rect class="bar-attributed" width="10.0%" height="100%"/>' in row
    assert "10 GiB / 80 GiB" in row


def test_shows_gpu_process_zombie_and_finding_counts(viewer_client):
    store_busy_host("gpu01")
    row = host_row(viewer_client.get(reverse("fleet")).content.decode(), "gpu01")
    cells = re.findall(r'<td class="num">(.*?)</td>', row, re.S)
    host = Host.objects.get(name="gpu01")
    # 101, 102, 201, 202 hold memory; 103 holds a device file.
    assert cells[0] == str(host.gpu_process_count) == "5"
    assert '<span class="badge badge-warning">6</span>' in cells[1]
    # One critical (orphans), two warnings (unattributed on each GPU), two infos (zombie trees).
    assert '<span class="badge badge-critical">1 critical</span>' in row
    assert '<span class="badge badge-warning">2 warning</span>' in row
    assert '<span class="badge badge-info">2 info</span>' in row


def test_a_host_without_findings_says_none(viewer_client):
    store("quiet", processes=[proc(10, gpu_memory={"GPU-sim-0000": GiB})], gpus=[gpu(0, used=GiB)])
    row = host_row(viewer_client.get(reverse("fleet")).content.decode(), "quiet")
    assert '<span class="muted">none</span>' in row


def test_a_host_whose_last_snapshot_was_rejected_is_flagged(viewer_client):
    store("gpu01")
    Host.objects.filter(name="gpu01").update(last_error="snapshot is 9 MiB, over the 8 MiB limit")
    row = host_row(viewer_client.get(reverse("fleet")).content.decode(), "gpu01")
    assert '<span class="badge badge-error" title="snapshot is 9 MiB, over the 8 MiB limit">' in row


def test_a_host_without_gpu_data_says_so(viewer_client):
    store("cpu01", gpus=[], backend="none", available=False, reason="NVML library not found")
    row = host_row(viewer_client.get(reverse("fleet")).content.decode(), "cpu01")
    assert "GPU data unavailable" in row


def test_an_empty_fleet_explains_how_hosts_appear(viewer_client):
    page = viewer_client.get(reverse("fleet")).content.decode()
    assert "No host has sent a snapshot yet" in page


def test_the_table_polls_itself_every_probe_interval(viewer_client, settings):
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 7
    page = viewer_client.get(reverse("fleet")).content.decode()
    assert (f'<section id="fleet-hosts" hx-get="{reverse("fleet")}" hx-trigger="every 7s" '
            'hx-swap="outerHTML">') in page


def test_an_htmx_request_gets_only_the_table_partial(viewer_client):
    store_busy_host("gpu01")
    full = viewer_client.get(reverse("fleet"))
    partial = viewer_client.get(reverse("fleet"), HTTP_HX_REQUEST="true")
    assert partial.status_code == 200
    body = partial.content.decode()
    assert "<html" not in body
    assert body.strip().startswith('<section id="fleet-hosts"')
    assert body.strip() in full.content.decode()
    assert "HX-Request" in partial["Vary"]


def test_fifty_hosts_take_a_fixed_number_of_queries(viewer_client, django_assert_max_num_queries):
    for n in range(50):
        store(f"node{n:02d}", processes=[proc(10, gpu_memory={"GPU-sim-0000": GiB}, state="D")],
              gpus=[gpu(0, used=2 * GiB), gpu(1)])
    viewer_client.get(reverse("fleet"))  # warm the session
    # session + user + groups (role check) + hosts with finding counts + their GPUs.
    with django_assert_max_num_queries(5):
        response = viewer_client.get(reverse("fleet"))
    page = response.content.decode()
    assert page.count('<tr class="host-online"') == 50
    assert page.count('class="bar-attributed"') == 100


def test_hosts_are_ordered_by_their_worst_open_finding(viewer_client):
    store("a-quiet")  # nothing wrong
    store("b-critical", processes=[proc(10, ppid=1, orphaned=True, pgid=9, sid=9,
                                        gpu_memory={"GPU-sim-0000": GiB})], gpus=[gpu(0, used=GiB)])
    store("c-info", processes=[proc(20, name="p"), proc(21, ppid=20, state="Z")])
    store("d-warning", gpus=[gpu(0, used=10 * GiB)])  # unattributed memory
    page = viewer_client.get(reverse("fleet")).content.decode()
    assert re.findall(r'data-host="([^"]+)"', page) == ["b-critical", "d-warning", "c-info", "a-quiet"]
