"""The fleet overview: every host, online or not, with GPU bars, counts and findings."""

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from gpuadmin.fleet.models import Finding, Host
from gpuadmin.web.fleet_page import ATTENTION_NAMED_MAX, PAGE_ROWS
from tests.factories import GiB, gpu, proc
from tests.fleet.helpers import make_offline, store, store_busy_host, store_critical_host
from tests.keys import enrol
from tests.kills.helpers import file

pytestmark = pytest.mark.django_db


def host_row(page: str, name: str) -> str:
    row = rf'<tr id="host-row-\d+" class="[^"]*" data-host="{re.escape(name)}"[^>]*>.*?</tr>'
    match = re.search(row, page, re.S)
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
    online = '<span class="badge badge-online" title="a snapshot arrived in the last 30 s">online</span>'
    assert online in host_row(page, "fresh")
    row = host_row(page, "stale")
    assert 'class="host-offline"' in row
    assert '<span class="badge badge-offline">offline</span>' in row
    # Its data is old: the row says as of when, in the lab's zone (UTC here), and how long ago.
    exact = stale.last_seen_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert re.search(rf'<time class="moment stale-as-of" datetime="[^"]+" title="{exact}">'
                     r'as of [0-9: -]+ <span class="age">\(2 h ago\)</span></time>', row)


def test_each_gpu_has_a_bar_with_its_unattributed_part(viewer_client):
    store_busy_host("gpu01")
    row = host_row(viewer_client.get(reverse("fleet")).content.decode(), "gpu01")
    # GPU 0: 28 of 80 GiB attributed (35 %), 2 GiB unattributed (2.5 %).
    assert '<rect class="bar-attributed" width="35.0%" height="100%"/>' in row
    assert '<rect class="bar-unattributed" x="35.0%" width="2.5%" height="100%"/>' in row
    # One small cell per GPU: used/total and utilisation; the figures in full in its title.
    assert "30/80 97%" in row
    assert "2 GiB not attributed to any visible process" in row
    # GPU 1: 8 of 80 GiB attributed.
    assert '<rect class="bar-attributed" width="10.0%" height="100%"/>' in row
    assert "10/80 40%" in row


def test_shows_zombie_and_orphan_counts_the_worst_finding_and_the_biggest_holder(viewer_client):
    store_busy_host("gpu01")
    row = host_row(viewer_client.get(reverse("fleet")).content.decode(), "gpu01")
    cells = re.findall(r'<td class="num" data-label="[^"]+">(.*?)</td>', row, re.S)
    assert '<span class="badge badge-warning">6</span>' in cells[0]  # zombies
    assert '<span class="badge badge-warning">2</span>' in cells[1]  # orphans 201 and 202
    # The worst open finding (the orphans, critical), every open one counted in its title: one critical,
    # two warnings (unattributed on each GPU), two infos (zombie trees).
    worst = re.search(r'<td class="worst-finding"[^>]*>(.*?)</td>', row, re.S).group(1)
    assert '<span class="badge badge-critical">critical</span>' in worst
    assert "orphan" in worst
    assert "(1 critical, 2 warning, 2 info)" in worst
    # alice's pid 101 holds 20 GiB, the most on the host.
    assert re.search(r'<td class="top-holder"[^>]*>alice</td>', row)


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


def queries_for_the_page(client, path: str, **headers: str) -> int:
    client.get(path, **headers)  # warm the session
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path, **headers)
    assert response.status_code == 200
    return len(queries)


def store_hosts(first: int, count: int) -> None:
    for n in range(first, first + count):
        store(f"node{n:03d}", processes=[proc(10, gpu_memory={"GPU-sim-0000": GiB}, state="D")],
              gpus=[gpu(0, used=2 * GiB), gpu(1)])


def test_the_number_of_queries_does_not_grow_with_the_number_of_hosts(viewer_client):
    store_hosts(0, 10)
    with_ten = queries_for_the_page(viewer_client, reverse("fleet"))
    poll_ten = queries_for_the_page(viewer_client, reverse("fleet"), HTTP_HX_REQUEST="true")
    store_hosts(10, 50)
    with_sixty = queries_for_the_page(viewer_client, reverse("fleet"))
    poll_sixty = queries_for_the_page(viewer_client, reverse("fleet"), HTTP_HX_REQUEST="true")
    assert with_sixty == with_ten
    assert poll_sixty == poll_ten
    # session, user, groups; summary: the hosts with their summaries summed (and the GPU models to filter
    # by), kill requests; page: its hosts' keys in order (and how many match), those hosts with their
    # summaries (GPUs, finding counts, worst finding, orphans, top holder: fleet.summary). The attention
    # strip reads nothing when nothing needs attention; awaiting hosts are read only when counted.
    assert with_sixty == 7


def test_a_page_shows_fifty_hosts_and_links_to_the_next(viewer_client):
    store_hosts(0, 55)
    first = viewer_client.get(reverse("fleet")).content.decode()
    assert first.count('<tr id="host-row-') == PAGE_ROWS == 50
    assert first.count('class="bar-attributed"') == 100
    assert "Hosts 1\N{EN DASH}50 of 55" in first
    assert '<a href="?page=2" rel="next">next page</a>' in first
    second = viewer_client.get(reverse("fleet"), {"page": "2"}).content.decode()
    assert re.findall(r'data-host="([^"]+)"', second) == [f"node{n:03d}" for n in range(50, 55)]
    assert '<a href="?" rel="prev">previous page</a>' in second
    past_the_end = viewer_client.get(reverse("fleet"), {"page": "99"}).content.decode()
    assert "Hosts 51\N{EN DASH}55 of 55" in past_the_end


def listed(client, **params: str) -> list[str]:
    return re.findall(r'data-host="([^"]+)"', client.get(reverse("fleet"), params).content.decode())


def test_filters_by_name_status_and_open_finding_kind(viewer_client):
    store_busy_host("gpu-busy")  # orphans, unattributed memory, zombies
    store("gpu-quiet")
    make_offline(store("gpu-gone"))
    assert listed(viewer_client, name="QUIET") == ["gpu-quiet"]
    assert listed(viewer_client, status="offline") == ["gpu-gone"]
    assert listed(viewer_client, status="online") == ["gpu-busy", "gpu-quiet"]
    assert listed(viewer_client, kind=Finding.Kind.ORPHAN_GPU) == ["gpu-busy"]
    assert listed(viewer_client, kind=Finding.Kind.ORPHAN_GPU, status="offline") == []
    # No filter: online hosts first (an offline host's figures are old), each by worst finding, then name.
    assert listed(viewer_client, status="sideways") == ["gpu-busy", "gpu-quiet", "gpu-gone"]
    page = viewer_client.get(reverse("fleet"), {"name": "nothing-like-it"}).content.decode()
    assert "No host matches these filters." in page


def test_paging_keeps_the_filters(viewer_client):
    store_hosts(0, 52)
    page = viewer_client.get(reverse("fleet"), {"name": "node", "status": "online"}).content.decode()
    assert '<a href="?name=node&amp;status=online&amp;page=2" rel="next">next page</a>' in page


def test_the_summary_counts_the_whole_fleet(viewer_client, requester):
    busy = enrol(store_busy_host("gpu01"))
    store("gpu02", gpus=[gpu(0, used=GiB)])  # 1 GiB unattributed: a warning
    make_offline(store("gpu03", gpus=[]))
    Host.objects.create(name="newcomer", public_key="x" * 43, key_fingerprint="SHA256:new")
    file(requester, 101, host=busy.name)
    page = viewer_client.get(reverse("fleet"), {"name": "gpu01"}).content.decode()  # filters: the table only
    summary = re.search(r'<section id="fleet-summary".*?</section>', page, re.S).group(0)
    assert '<span class="summary-online">2 online</span>' in summary
    assert '<span class="summary-offline">1 offline</span>' in summary
    assert '<span class="summary-awaiting">1 awaiting acceptance</span>' in summary
    assert '<dd class="summary-gpus">3</dd>' in summary
    # gpu01: 30 + 10 GiB used of 160, 2 + 2 unattributed; gpu02: 1 of 80, all unattributed.
    assert '<span class="summary-used">41 GiB used of 240 GiB</span>' in summary
    assert '<span class="summary-unattributed">5 GiB unattributed</span>' in summary
    assert '<span class="badge badge-critical">1 critical</span>' in summary
    assert '<span class="badge badge-warning">3 warning</span>' in summary
    assert '<span class="badge badge-info">2 info</span>' in summary
    assert ">1 pending approval</a>" in summary


def test_every_gpu_cell_has_the_same_width_so_every_gpu_is_drawn_on_one_scale():
    css = (Path(settings.BASE_DIR) / "static" / "css" / "fleet.css").read_text()
    assert ".gpu-cell { display: inline-block; width: 4.4rem;" in css
    assert ".mini-bar { display: block; width: 100%;" in css


def test_hosts_are_ordered_by_their_worst_open_finding(viewer_client):
    store("a-quiet")  # nothing wrong
    store_critical_host("b-critical")
    store("c-info", processes=[proc(20, name="p"), proc(21, ppid=20, state="Z")])
    store("d-warning", gpus=[gpu(0, used=10 * GiB)])  # unattributed memory
    page = viewer_client.get(reverse("fleet")).content.decode()
    assert re.findall(r'data-host="([^"]+)"', page) == ["b-critical", "d-warning", "c-info", "a-quiet"]


# --- Issue 33: the attention strip, the order and filters in the URL, offline data marked stale. ---


def strip_of(page: str) -> str:
    match = re.search(r'<section id="fleet-attention".*?</section>', page, re.S)
    assert match, "no attention strip"
    return match.group(0)


def test_the_strip_names_offline_hosts_then_critical_findings_then_waiting_requests(viewer_client, requester):
    busy = enrol(store_busy_host("gpu01"))  # orphans holding memory: a critical finding
    make_offline(store("gpu-gone"))
    file(requester, 101, host=busy.name)
    strip = strip_of(viewer_client.get(reverse("fleet")).content.decode())
    # Something is wrong: an alert, which a screen reader reads out at once.
    assert 'role="alert"' in strip
    offline, critical, pending = (strip.index(f'class="attention-{kind}"') for kind in ("offline", "critical",
                                                                                         "pending"))
    assert offline < critical < pending
    assert "1 host offline:" in strip
    gone = reverse("host_detail", kwargs={"name": "gpu-gone"})
    assert f'<a href="{gone}" class="host-link">gpu-gone</a>' in strip
    assert '?status=offline" class="attention-action">List offline hosts</a>' in strip
    assert "1 critical finding on 1 host:" in strip
    assert '?attention=1" class="attention-action">List hosts needing attention</a>' in strip
    assert "1 kill request waiting for approval:" in strip
    assert f'<a href="{reverse("kill_requests")}" class="attention-action">Review requests</a>' in strip


def test_the_strip_names_the_first_few_and_counts_the_rest(viewer_client):
    for n in range(ATTENTION_NAMED_MAX + 1):
        store_critical_host(f"crit{n}")
    for n in range(ATTENTION_NAMED_MAX):
        make_offline(store(f"gone{n}"))
    Host.objects.create(name="never-seen")  # no key offered, no snapshot yet: offline too
    Host.objects.create(name="never-seen-either")
    # A host awaiting acceptance is not in the fleet: neither offline nor critical, whatever it holds.
    awaiting = store_critical_host("z-awaiting")
    Host.objects.filter(pk=awaiting.pk).update(public_key="x" * 43, key_accepted_at=None)
    strip = strip_of(viewer_client.get(reverse("fleet")).content.decode())
    assert f"{ATTENTION_NAMED_MAX + 2} hosts offline:" in strip
    # The most recently gone first; never seen last; the rest counted.
    assert "gone0" in strip and "never-seen" not in strip and " and 2 more" in strip
    critical = f"{ATTENTION_NAMED_MAX + 1} critical findings on {ATTENTION_NAMED_MAX + 1} hosts:"
    assert critical in strip
    assert all(f">crit{n}</a>" in strip for n in range(ATTENTION_NAMED_MAX))
    assert f">crit{ATTENTION_NAMED_MAX}</a>" not in strip and " and 1 more" in strip
    assert "z-awaiting" not in strip


def test_the_model_filter_offers_each_model_of_the_fleet_once(viewer_client):
    store("gpu01", gpus=[gpu(0, name="NVIDIA H100"), gpu(1, name="NVIDIA A100")])
    store("gpu02", gpus=[gpu(0, name="NVIDIA A100")])
    store("gpu03", gpus=[])  # no GPU: no model
    Host.objects.create(name="never-seen")  # no summary yet
    awaiting = store("gpu04", gpus=[gpu(0, name="Prototype X")])
    Host.objects.filter(pk=awaiting.pk).update(public_key="x" * 43, key_accepted_at=None)
    page = viewer_client.get(reverse("fleet")).content.decode()
    offered = re.findall(r'<option value="([^"]*)"', re.search(r'<select name="model".*?</select>', page,
                                                                re.S).group(0))
    assert offered == ["", "NVIDIA A100", "NVIDIA H100"]  # "" is "any model"


def test_a_quiet_fleet_gets_a_status_not_an_alert(viewer_client, requester):
    enrol(store("gpu01", processes=[proc(101, gpu_memory={"GPU-sim-0000": GiB})], gpus=[gpu(0, used=GiB)]))
    strip = strip_of(viewer_client.get(reverse("fleet")).content.decode())
    assert 'role="status"' in strip and 'role="alert"' not in strip
    assert "Nothing needs attention" in strip
    file(requester, 101)  # only waiting, nothing wrong: still a status
    strip = strip_of(viewer_client.get(reverse("fleet")).content.decode())
    assert 'role="status"' in strip and "1 kill request waiting for approval" in strip


def test_a_poll_sends_the_strip_again_when_a_host_goes_offline(viewer_client):
    from tests.web.test_fleet_poll import HTMX, poll_url

    hosts = [store("gpu01"), store("gpu02")]
    page = viewer_client.get(reverse("fleet")).content.decode()
    make_offline(hosts[1])
    body = viewer_client.get(poll_url(page), **HTMX).content.decode()
    assert re.search(r'<section id="fleet-attention"[^>]*role="alert"[^>]*hx-swap-oob="true">', body)
    assert "1 host offline:" in strip_of(body)
    # The nav's count follows, out of band too.
    assert re.search(r'<a id="nav-attention"[^>]*hx-swap-oob="true">'
                     r'Needs attention <span class="count">1</span>', body)


def test_offline_hosts_sort_after_online_ones_and_their_findings_are_marked_stale(viewer_client):
    make_offline(store_busy_host("a-gone"))  # critical findings, but old
    store("b-quiet")
    page = viewer_client.get(reverse("fleet")).content.decode()
    assert re.findall(r'data-host="([^"]+)"', page) == ["b-quiet", "a-gone"]
    row = host_row(page, "a-gone")
    assert '<span class="badge badge-critical">critical</span> <span class="badge badge-stale"' in row
    assert "badge-stale" not in host_row(page, "b-quiet")


def test_sorting_is_in_the_url_and_kept_by_the_filters_and_pages(viewer_client):
    store_busy_host("a-busy")  # 6 zombies, 2 orphans
    store("b-zombies", processes=[proc(20, name="p"), proc(21, ppid=20, state="Z")])
    store("c-free", gpus=[gpu(0), gpu(1), gpu(2, used=10 * GiB)])
    assert listed(viewer_client, sort="name") == ["a-busy", "b-zombies", "c-free"]
    assert listed(viewer_client, sort="zombies") == ["a-busy", "b-zombies", "c-free"]
    assert listed(viewer_client, sort="orphans")[0] == "a-busy"
    assert listed(viewer_client, sort="free")[0] == "c-free"  # two free GPUs
    assert listed(viewer_client, sort="sideways") == listed(viewer_client)  # unknown: the default
    page = viewer_client.get(reverse("fleet"), {"sort": "zombies", "name": "b"}).content.decode()
    assert '<input type="hidden" name="sort" value="zombies">' in page  # the filter form keeps the order
    assert '<a href="?name=b&amp;sort=name">Host</a>' in page  # a header link keeps the filters


def test_filters_by_needing_attention_gpu_model_and_free_gpus(viewer_client):
    store_busy_host("gpu-busy")  # critical and warning findings
    make_offline(store("gpu-gone"))
    store("gpu-free", gpus=[gpu(0, name="NVIDIA A100"), gpu(1, name="NVIDIA A100")])
    store("gpu-full", gpus=[gpu(0, name="NVIDIA A100", used=70 * GiB)],
          processes=[proc(10, gpu_memory={"GPU-sim-0000": 70 * GiB})])
    assert listed(viewer_client, attention="1") == ["gpu-busy", "gpu-gone"]
    assert listed(viewer_client, model="NVIDIA A100") == ["gpu-free", "gpu-full"]
    assert listed(viewer_client, free="2") == ["gpu-free"]
    assert listed(viewer_client, free="2", model="NVIDIA A100", attention="1") == []
    assert listed(viewer_client, free="lots") == listed(viewer_client)  # not a number: no filter
    page = viewer_client.get(reverse("fleet")).content.decode()
    assert '<option value="NVIDIA A100">NVIDIA A100</option>' in page
