"""The host page: GPU cards, the holders table, zombie trees, orphans, findings, HTMX partials."""

import re

import pytest
from django.urls import reverse

from gpuadmin.fleet.intake.validation import SnapshotRejected
from gpuadmin.fleet.models import Host
from gpuadmin.text import utc_text
from gpuadmin.web.host_tables import PROCESS_PAGE_ROWS
from tests.factories import GiB, gpu, proc, snapshot_json
from tests.fleet.helpers import make_offline, store, store_busy_host

pytestmark = pytest.mark.django_db

URL = reverse("host_detail", kwargs={"name": "gpu01"})
DASH = "\u2013"  # the en dash between the first and last row numbers shown


@pytest.fixture
def busy(db) -> Host:
    return store_busy_host("gpu01")


def section(page: str, element_id: str) -> str:
    match = re.search(rf'<section id="{element_id}".*?</section>', page, re.S)
    assert match, f"no section {element_id}"
    return match.group(0)


def process_pids(html: str) -> list[int]:
    return [int(pid) for pid in re.findall(r'<tr id="[^"]*" data-pid="(\d+)">', html)]


def row_of(html: str, pid: int) -> str:
    match = re.search(rf'<tr id="[^"]*" data-pid="{pid}">.*?</tr>', html, re.S)
    assert match, f"no row for pid {pid}"
    return match.group(0)


def page_of(client, url: str = URL, **params) -> str:
    response = client.get(url, params)
    assert response.status_code == 200
    return response.content.decode()


def test_unknown_host_is_a_404_page(viewer_client):
    assert viewer_client.get(reverse("host_detail", kwargs={"name": "nope"})).status_code == 404


def test_gpu_cards_show_used_attributed_unattributed_utilization_and_total(viewer_client, busy):
    summary = section(page_of(viewer_client), "host-gpus")
    card = re.search(r'data-gpu-index="0">.*?</table>', summary, re.S).group(0)
    assert "<tr><th>Used</th><td class=\"mono\">30 GiB</td></tr>" in card
    assert "<tr><th>Attributed</th><td class=\"mono\">28 GiB</td></tr>" in card
    assert "<tr><th>Unattributed</th><td class=\"mono unattributed\">2 GiB</td></tr>" in card
    assert "<tr><th>Utilization</th><td class=\"mono\">97%</td></tr>" in card
    assert "<tr><th>Total</th><td class=\"mono\">80 GiB</td></tr>" in card


def test_holders_table_lists_gpu_memory_and_device_file_holders_biggest_first(viewer_client, busy):
    table = section(page_of(viewer_client), "host-processes")
    assert process_pids(table) == [101, 102, 201, 202, 103]
    row = row_of(table, 101)
    assert "alice" in row
    assert '<span class="per-gpu">GPU 0: 20 GiB</span>' in row
    assert '<td data-label="State" class="mono" title="sleeping">S</td>' in row
    assert ">3 h 12 min</td>" in row
    assert '>100</a> <span class="mono">launch</span>' in row  # parent pid (a link to its page) + name
    # One argument a span, a break opportunity only between them (never inside "--lr").
    assert ('<span class="cmdline"><span class="arg">python</span> <wbr><span class="arg">train.py</span> '
            '<wbr><span class="arg">--lr</span> <wbr><span class="arg">3e-4</span></span>') in row
    # Device files on demand: behind <details>, so the row stays one line.
    device_row = row_of(table, 103)
    assert ('<details class="device-files small"><summary>2 device files</summary>'
            '<div class="mono">/dev/nvidia0</div><div class="mono">/dev/nvidiactl</div>'
            '</details>') in device_row


def test_a_truncated_command_line_is_flagged(viewer_client):
    from tests.factories import proc

    store("gpu01", processes=[proc(7, cmdline=["python", "x" * 50], cmdline_truncated=True,
                                   gpu_memory={"GPU-sim-0000": 1})])
    row = row_of(section(page_of(viewer_client), "host-processes"), 7)
    assert '<span class="truncated"' in row


@pytest.mark.parametrize(("sort", "pids"), [
    ("memory", [101, 102, 201, 202, 103]),
    ("-memory", [103, 201, 202, 102, 101]),
    ("pid", [101, 102, 103, 201, 202]),
    ("-pid", [202, 201, 103, 102, 101]),
    ("user", [101, 102, 103, 201, 202]),  # alice, bob, carol, erin, erin
    ("age", [101, 201, 202, 103, 102]),  # oldest first: 11520 s, 7200 s, 7200 s, 600 s, 50 s
    ("-age", [102, 103, 201, 202, 101]),
])
def test_sorting(viewer_client, busy, sort, pids):
    assert process_pids(section(page_of(viewer_client, sort=sort), "host-processes")) == pids


def test_an_unknown_sort_falls_back_to_memory(viewer_client, busy):
    table = section(page_of(viewer_client, sort="rm -rf"), "host-processes")
    assert process_pids(table) == [101, 102, 201, 202, 103]


@pytest.mark.parametrize(("params", "pids"), [
    ({"user": "erin"}, [201, 202]),
    ({"gpu": "1"}, [102]),
    ({"gpu": "0"}, [101, 201, 202]),
    ({"q": "TRAIN.PY"}, [101]),
    ({"q": "nvidiactl"}, [103]),
    ({"q": "202"}, [202]),
    ({"user": "erin", "q": "rank 1"}, [202]),
    ({"user": "nobody"}, []),
])
def test_filtering(viewer_client, busy, params, pids):
    table = section(page_of(viewer_client, **params), "host-processes")
    assert process_pids(table) == pids
    if pids:
        counted = "1 process that matches" if len(pids) == 1 else f"{len(pids)} processes that match"
        assert f"Showing 1{DASH}{len(pids)} of {counted} the filter (5 in all)." in table
    else:
        assert "None of the 5 processes holding a GPU match the filter." in table


def test_sort_links_keep_the_filter_and_toggle_the_order(viewer_client, busy):
    table = section(page_of(viewer_client, user="erin", sort="pid"), "host-processes")
    assert '<a href="?user=erin&amp;sort=-pid" class="sorted">PID ▲</a>' in table
    assert '<a href="?user=erin">GPU memory</a>' in table


def test_zombie_trees_group_zombies_under_their_parent(viewer_client, busy):
    zombies = section(page_of(viewer_client), "host-zombies")
    tree = re.search(r'data-parent-pid="300">.*?</details>', zombies, re.S).group(0)
    assert re.search(r'Parent <a class="process-link" href="/hosts/gpu01/processes/300-\d+/">300</a> '
                     r'<span class="mono">leaky-parent</span>', tree)
    assert re.search(r"\(\s*dave\s*\)", tree)
    assert '<span class="zombie-count">5 zombies</span>' in tree
    assert ('<div class="parent-command"><span class="cmdline"><span class="arg">leaky-parent</span> '
            '<wbr><span class="arg">--forks</span> <wbr><span class="arg">5</span></span></div>') in tree
    assert re.findall(r'<li data-pid="(\d+)">', tree) == ["301", "302", "303", "304", "305"]
    lost = re.search(r'data-parent-pid="999">.*?</details>', zombies, re.S).group(0)
    assert "Parent 999 <span class=\"muted\">(not in the snapshot)</span>" in lost
    assert '<span class="zombie-count">1 zombie</span>' in lost
    assert re.findall(r'<li data-pid="(\d+)">', lost) == ["310"]
    # The biggest tree comes first.
    assert zombies.index('data-parent-pid="300"') < zombies.index('data-parent-pid="999"')


def test_orphans_are_a_filter_of_the_process_table_not_a_second_table(viewer_client, busy):
    orphans = section(page_of(viewer_client), "host-orphans")
    assert process_pids(orphans) == []  # no rows repeated
    assert "(pid 201, 202)" in orphans and 'href="?show=orphans#processes-heading"' in orphans
    table = section(page_of(viewer_client, show="orphans"), "host-processes")
    assert process_pids(table) == [201, 202]
    assert "group 200, session 200" in row_of(table, 201) and ">orphan</span>" in row_of(table, 201)


def test_the_zombie_filter_shows_the_holders_with_defunct_children(viewer_client):
    from tests.factories import proc

    store("gpu01", processes=[
        proc(300, name="leaky", gpu_memory={"GPU-sim-0000": GiB}),
        proc(301, ppid=300, state="Z", name="child"),
        proc(302, gpu_memory={"GPU-sim-0000": GiB}),
    ])
    table = section(page_of(viewer_client, show="zombies"), "host-processes")
    assert process_pids(table) == [300]
    assert ">1 defunct</span>" in row_of(table, 300)


def test_findings_show_severity_title_remedy_and_since_when_most_severe_first(viewer_client, busy):
    summary = section(page_of(viewer_client), "host-summary")
    kinds = re.findall(r'data-kind="([a-z_]+)"', summary)
    assert kinds == ["orphan_gpu", "unattributed_memory", "unattributed_memory", "zombies", "zombies"]
    finding = busy.findings.get(kind="orphan_gpu")
    assert f"<strong>{finding.title}</strong>" in summary
    assert f'<div class="remedy">Remedy: {finding.remedy}</div>' in summary
    assert f'since <time class="moment" datetime="{utc_text(finding.first_seen_at)}"' in summary


def test_a_gpu_whose_processes_hold_more_than_it_uses_is_flagged(viewer_client):
    gpu0 = "GPU-sim-0000"
    holders = [proc(10, gpu_memory={gpu0: 70 * GiB}), proc(11, gpu_memory={gpu0: 52 * GiB})]
    store("gpu01", processes=holders, gpus=[gpu(0, total=80 * GiB, used=80 * GiB)])
    summary = section(page_of(viewer_client), "host-summary")
    assert re.findall(r'data-kind="([a-z_]+)"', summary) == ["over_attributed_memory"]
    assert "processes hold 122 GiB, more than the 80 GiB the GPU reports used" in summary


def test_a_rejected_snapshot_and_an_unavailable_backend_are_explained(viewer_client):
    store("gpu01", gpus=[], backend="none", available=False, reason="NVML library not found")
    with pytest.raises(SnapshotRejected):
        from tests.keys import deliver

        deliver(snapshot_json("gpu01").replace('"schema_version": 2', '"schema_version": 99'))
    summary = section(page_of(viewer_client), "host-summary")
    error = Host.objects.get(name="gpu01").last_error
    assert error
    assert "The last snapshot from this host was rejected" in summary
    assert error.replace("'", "&#x27;").replace('"', "&quot;") in summary
    assert "GPU data unavailable (none): NVML library not found" in summary


def test_offline_host_is_marked(viewer_client, busy):
    make_offline(busy)
    summary = section(page_of(viewer_client), "host-summary")
    assert '<span class="badge badge-offline">offline</span>' in summary


def test_request_kill_links_only_for_requesters(viewer_client, requester_client, busy):
    new_url = reverse("kill_request_new")
    assert "Request kill" not in page_of(viewer_client)
    row = row_of(section(page_of(requester_client), "host-processes"), 101)
    assert f'<a class="request-kill" href="{new_url}?host=gpu01&amp;pid=101&amp;start=10100">' in row


def test_the_tables_poll_with_the_filter_form_included(viewer_client, busy, settings):
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 5
    page = page_of(viewer_client)
    assert (f'<div id="host-tables" hx-get="{URL}" hx-trigger="every 5s" '
            'hx-include="#process-filters, #process-page" hx-target="this" hx-swap="morph" '
            'hx-disinherit="*">') in page
    assert 'hx-target="#host-processes"' in page and 'hx-push-url="true"' in page


def test_the_poll_returns_tables_and_summary_without_the_page(viewer_client, busy):
    full = page_of(viewer_client, user="erin")
    response = viewer_client.get(URL, {"user": "erin"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="host-tables")
    assert response.status_code == 200
    body = response.content.decode()
    assert "<html" not in body and "<nav" not in body
    assert body.lstrip().startswith('<div id="host-tables"')
    for region in ("host-processes", "host-zombies", "host-orphans"):
        assert section(body, region) == section(full, region)
    assert '<section id="host-summary" hx-swap-oob="morph">' in body
    assert process_pids(section(body, "host-processes")) == [201, 202]
    assert {"HX-Request", "HX-Target"} <= {v.strip() for v in response["Vary"].split(",")}


def test_the_filter_form_gets_only_the_processes_partial(viewer_client, busy):
    full = page_of(viewer_client, gpu="1")
    response = viewer_client.get(URL, {"gpu": "1"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="host-processes")
    body = response.content.decode().strip()
    assert body.startswith('<section id="host-processes">') and body.endswith("</section>")
    assert body == section(full, "host-processes")
    assert process_pids(body) == [102]


def test_going_back_to_a_filtered_page_gets_the_whole_page(viewer_client, busy):
    # The filter form pushes its URL (hx-push-url). Going back to it when htmx has no copy of the
    # page in its history cache, htmx asks for that URL with HX-Request *and*
    # HX-History-Restore-Request, and puts the answer in place of the whole body: it must be the
    # page, not the poll's fragment.
    response = viewer_client.get(
        URL, {"user": "erin"}, HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true"
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert "<html" in body and '<form id="process-filters"' in body
    assert section(body, "host-processes") == section(page_of(viewer_client, user="erin"), "host-processes")
    assert "HX-History-Restore-Request" in {v.strip() for v in response["Vary"].split(",")}


def test_polling_a_host_that_is_gone_stops_the_polling(viewer_client):
    # Same path as a host deleted while its page is open: the name no longer resolves.
    response = viewer_client.get(URL, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="host-tables")
    assert response.status_code == 286
    assert "is no longer known" in response.content.decode()


def test_a_host_without_a_stored_snapshot_still_has_a_page(viewer_client):
    Host.objects.create(name="gpu01")
    page = page_of(viewer_client)
    assert "No snapshot stored for this host yet." in page


def test_the_host_page_takes_a_fixed_number_of_queries(viewer_client, busy, django_assert_max_num_queries):
    page_of(viewer_client)  # warm the session
    # session, user, groups; host with finding counts, its GPUs, its snapshot, its open findings,
    # the accounts that say who its users are, its processes that outlived their launcher.
    with django_assert_max_num_queries(10):
        page_of(viewer_client)


# --- Paging: a host with many holders shows PROCESS_PAGE_ROWS of them at a time. ---

MANY_HOLDERS = 250
BIGGEST_PID = 1100  # the one holder with 10 GiB; listed last in the snapshot, on page 2 by pid


@pytest.fixture
def crowded(db) -> Host:
    """250 holders of GPU 0, pids 1000-1249: even pids alice, odd pids bob; 1 MiB each but pid 1100."""
    assert PROCESS_PAGE_ROWS == 100  # the figures below are written for pages of 100
    holders = [
        proc(pid, user="alice" if pid % 2 == 0 else "bob", gpu_memory={"GPU-sim-0000": 1024**2},
             reasons=["gpu"])
        for pid in range(1000, 1000 + MANY_HOLDERS) if pid != BIGGEST_PID
    ]
    holders.append(proc(BIGGEST_PID, user="alice", gpu_memory={"GPU-sim-0000": 10 * GiB}, reasons=["gpu"]))
    return store("gpu01", processes=holders, gpus=[gpu(0, used=11 * GiB)])


def shown_page(html: str) -> str:
    match = re.search(r'<input type="hidden" id="process-page" name="page" value="(\d+)">', html)
    assert match, "no page input"
    return match.group(1)


def test_the_first_page_shows_100_holders_and_where_they_sit(viewer_client, crowded):
    table = section(page_of(viewer_client, sort="pid"), "host-processes")
    assert process_pids(table) == list(range(1000, 1100))
    assert f"Showing 1{DASH}100 of 250 processes." in table
    assert "Page 1 of 3" in table
    assert 'rel="prev"' not in table
    assert ('<a href="?sort=pid&amp;page=2" rel="next" hx-get="?sort=pid&amp;page=2" '
            'hx-target="#host-processes" hx-swap="outerHTML" hx-push-url="true">Next →</a>') in table
    assert shown_page(table) == "1"


def test_the_last_page_shows_the_rest(viewer_client, crowded):
    table = section(page_of(viewer_client, sort="pid", page="3"), "host-processes")
    assert process_pids(table) == list(range(1200, 1250))
    assert f"Showing 201{DASH}250 of 250 processes." in table
    assert '<a href="?sort=pid&amp;page=2" rel="prev"' in table
    assert 'rel="next"' not in table
    assert shown_page(table) == "3"


def test_a_filter_and_a_page_combine(viewer_client, crowded):
    table = section(page_of(viewer_client, user="bob", sort="pid", page="2"), "host-processes")
    bobs = list(range(1001, 1250, 2))
    assert len(bobs) == 125
    assert process_pids(table) == bobs[100:]
    assert f"Showing 101{DASH}125 of 125 processes that match the filter (250 in all)." in table
    # Back to page 1 needs no page parameter; the filter and sort stay.
    assert '<a href="?user=bob&amp;sort=pid" rel="prev"' in table
    # A new order starts on the first page, with the same filter.
    assert '<a href="?user=bob&amp;sort=-pid" class="sorted">PID ▲</a>' in table


@pytest.mark.parametrize("asked", ["4", "99", "9" * 40])
def test_a_page_past_the_end_shows_the_last_page(viewer_client, crowded, asked):
    response = viewer_client.get(URL, {"sort": "pid", "page": asked})
    assert response.status_code == 200
    table = section(response.content.decode(), "host-processes")
    assert process_pids(table) == list(range(1200, 1250))
    assert shown_page(table) == "3"


@pytest.mark.parametrize("asked", ["0", "-2", "two", "²", ""])
def test_a_page_that_is_not_a_page_number_shows_the_first(viewer_client, crowded, asked):
    table = section(page_of(viewer_client, sort="pid", page=asked), "host-processes")
    assert process_pids(table)[:1] == [1000]
    assert shown_page(table) == "1"


def test_a_filter_that_shrinks_the_table_clamps_the_page(viewer_client, crowded):
    table = section(page_of(viewer_client, q="job1249", page="3"), "host-processes")
    assert process_pids(table) == [1249]
    assert f"Showing 1{DASH}1 of 1 process that matches the filter (250 in all)." in table
    assert "Page 1 of" not in table  # one page: no page links at all
    assert shown_page(table) == "1"


def test_htmx_gets_the_processes_partial_of_the_asked_page(viewer_client, crowded):
    full = page_of(viewer_client, user="alice", page="2")
    response = viewer_client.get(URL, {"user": "alice", "page": "2"},
                                 HTTP_HX_REQUEST="true", HTTP_HX_TARGET="host-processes")
    body = response.content.decode().strip()
    assert body.startswith('<section id="host-processes">') and body.endswith("</section>")
    assert body == section(full, "host-processes")
    alices = [BIGGEST_PID] + [pid for pid in range(1000, 1250, 2) if pid != BIGGEST_PID]
    # Same memory for all but the biggest: pid breaks the tie.
    assert process_pids(body) == alices[100:]
    assert shown_page(body) == "2"


def test_the_poll_refreshes_the_page_being_looked_at(viewer_client, crowded):
    # What the poll sends: the filter form's fields and #process-page.
    response = viewer_client.get(URL, {"user": "", "gpu": "", "q": "", "sort": "pid", "page": "2"},
                                 HTTP_HX_REQUEST="true", HTTP_HX_TARGET="host-tables")
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="host-tables"')
    table = section(body, "host-processes")
    assert process_pids(table) == list(range(1100, 1200))
    assert shown_page(table) == "2"
    # The zombie and orphan sections are not paged.
    assert section(body, "host-zombies") == section(page_of(viewer_client, sort="pid"), "host-zombies")


def test_sorting_comes_before_paging(viewer_client, crowded):
    by_memory = section(page_of(viewer_client), "host-processes")
    assert process_pids(by_memory)[0] == BIGGEST_PID
    assert len(process_pids(by_memory)) == 100
    assert BIGGEST_PID not in process_pids(section(page_of(viewer_client, sort="pid"), "host-processes"))
    by_pid_page_2 = section(page_of(viewer_client, sort="pid", page="2"), "host-processes")
    assert process_pids(by_pid_page_2)[0] == BIGGEST_PID
    smallest_first_page_3 = section(page_of(viewer_client, sort="-memory", page="3"), "host-processes")
    assert process_pids(smallest_first_page_3)[-1] == BIGGEST_PID


def test_a_gpu_in_mig_mode_shows_its_instances_with_their_processes(viewer_client, db):
    parent = gpu(0, used=12 * GiB)
    parent["mig_instances"] = [
        {"uuid": "MIG-a", "name": "A100 MIG 1g.10gb", "gpu_instance_id": 1, "compute_instance_id": 0,
         "memory_total_bytes": 10 * GiB, "memory_used_bytes": 3 * GiB},
        {"uuid": "MIG-b", "name": "A100 MIG 3g.40gb", "gpu_instance_id": 2, "compute_instance_id": 0,
         "memory_total_bytes": 40 * GiB, "memory_used_bytes": None},
    ]
    on = [{"gpu_uuid": "GPU-sim-0000", "gpu_instance_id": 2, "compute_instance_id": 0,
           "used_memory_bytes": None}]
    store(
        "gpu01", gpus=[parent, gpu(1)],
        processes=[proc(500, gpu_memory={"GPU-sim-0000": None}, reasons=["gpu"], mig_instances=on)],
        unmatched=[{"pid": 9, "gpu_uuid": "GPU-sim-0000", "used_memory_bytes": None, "gpu_instance_id": 2,
                    "compute_instance_id": 0}],
    )

    summary = section(page_of(viewer_client), "host-gpus")

    card, other = summary.split('data-gpu-index="1"')
    rows = re.findall(r'<tr data-mig-uuid="(MIG-\w)"><td class="mono">(\d) / (\d)</td><td>([^<]*)</td>'
                      r'<td class="mono">([^<]*)</td><td class="mono">(\d+)</td></tr>', card)
    assert rows == [("MIG-a", "1", "0", "A100 MIG 1g.10gb", "3 GiB / 10 GiB", "0"),
                    ("MIG-b", "2", "0", "A100 MIG 3g.40gb", "— / 40 GiB", "2")]
    assert "mig-instances" not in other


def test_orphans_section_names_the_launcher_that_exited_and_when(viewer_client):
    from datetime import timedelta

    from django.utils import timezone

    from gpuadmin.text import utc_text

    before, after = timezone.now() - timedelta(seconds=20), timezone.now() - timedelta(seconds=10)
    launcher = proc(1234, user="alice", name="python", cmdline=["python", "train.py", "<b>"])

    def workers(alive: bool) -> list[dict]:
        return [proc(pid, ppid=1234 if alive else 1, pgid=1234, sid=1234, orphaned=not alive, reasons=["gpu"],
                     gpu_memory={"GPU-sim-0000": GiB}) for pid in (1300, 1301)]

    deliver_at = {"gpus": [gpu(0, used=2 * GiB)]}
    store(processes=[launcher, *workers(True)], taken_at=before, **deliver_at)
    orphans = section(page_of(viewer_client), "host-orphans")
    assert "exited-launchers" not in orphans
    store(processes=workers(False), taken_at=after, **deliver_at)

    orphans = section(page_of(viewer_client), "host-orphans")
    line = re.search(r'<li data-launcher-pid="1234">.*?</li>', orphans, re.S).group(0)
    text = re.sub(r"<[^>]+>", "", line)
    assert text.startswith("Launcher python train.py &lt;b&gt; (pid 1234, alice) exited between ")
    # Times as everywhere: 24-hour in the lab's zone, the age beside, the full time on hover.
    for moment in (before, after):
        local = timezone.localtime(moment)
        assert f'datetime="{utc_text(moment)}" title="{local:%Y-%m-%d %H:%M:%S} {local.tzname()}"' in line
    assert f"{timezone.localtime(before):%H:%M} (" in text.split("exited between ")[1]
    assert text.endswith("leaving 2 processes behind: pid 1300, 1301.")
