"""The host page's process rows built in Python (gpuadmin/web/templatetags/gpuadmin_process_table.py):
the same markup for every kind of row, every value from the host escaped, and no template work or
``reverse()`` per row (they were two thirds of the page's CPU)."""

from __future__ import annotations

import re

import pytest
from django.template import base as template_base
from django.urls import resolvers, reverse, set_script_prefix

from gpuadmin.fleet.models import Host, LatestSnapshot
from gpuadmin.web.host_tables import PROCESS_PAGE_ROWS, HostTables, ProcessQuery, ProcessTableRow, host_tables
from gpuadmin.web.templatetags.gpuadmin_process_table import process_table_rows
from tests.factories import GiB, container_owner, gpu, proc, slurm_owner
from tests.fleet.helpers import store

pytestmark = pytest.mark.django_db

GPU0 = "GPU-sim-0000"
CTL = '<span class="ctl" title="control character">'
HOSTILE = "<b>x</b>\x1b"  # markup, and a control character that must show as \x1b
HOSTILE_SHOWN = f"&lt;b&gt;x&lt;/b&gt;{CTL}\\x1b</span>"
HOSTILE_IN_ATTRIBUTE = "&lt;b&gt;x&lt;/b&gt;\\x1b"
CID = "c0ffee" + "0" * 58


def holders(count: int) -> list[dict]:
    """``count`` GPU holders, pids 2000 on, children of the launcher, pid 1000."""
    return [proc(2000 + n, ppid=1000, gpu_memory={GPU0: GiB // 8}, reasons=["gpu"]) for n in range(count)]


def page_rendering(client, name: str, count: int, monkeypatch) -> tuple[int, int]:
    """Variables rendered by templates and URLs reversed for the page of a host with ``count`` holders."""
    store(name, processes=[proc(1000, name="launcher"), *holders(count)], gpus=[gpu(0, used=40 * GiB)])
    calls = {"variables": 0, "reversed": 0}
    render_variable = template_base.VariableNode.render
    reverse_with_prefix = resolvers.URLResolver._reverse_with_prefix

    def counted_render(node, context):
        calls["variables"] += 1
        return render_variable(node, context)

    def counted_reverse(resolver, *args, **kwargs):
        calls["reversed"] += 1
        return reverse_with_prefix(resolver, *args, **kwargs)

    monkeypatch.setattr(template_base.VariableNode, "render", counted_render)
    monkeypatch.setattr(resolvers.URLResolver, "_reverse_with_prefix", counted_reverse)
    response = client.get(reverse("host_detail", kwargs={"name": name}))
    monkeypatch.undo()
    assert response.status_code == 200
    assert response.content.decode().count('<a class="request-kill" ') == min(count, PROCESS_PAGE_ROWS)
    return calls["variables"], calls["reversed"]


def test_a_page_of_rows_costs_no_template_variable_or_reverse_per_row(requester_client, monkeypatch):
    few_variables, few_reversed = page_rendering(requester_client, "gpu01", 2, monkeypatch)
    full_variables, full_reversed = page_rendering(requester_client, "gpu02", PROCESS_PAGE_ROWS, monkeypatch)
    # 98 more rows and nothing more for them (as template markup, a row was ~40 variables and two
    # {% url %}s): the same page, the same choices in its filter form.
    assert full_variables == few_variables
    assert full_reversed == few_reversed


def tables_of(host: Host, query: ProcessQuery | None = None, **kwargs) -> HostTables:
    """The host's tables as the page builds them (gpuadmin.web.views.host_detail)."""
    listed = Host.objects.for_listing().named(host.name)
    return host_tables(LatestSnapshot.objects.document_for(listed), list(listed.present_gpus),
                       query or ProcessQuery(), **kwargs)


def rows_of(host: Host, query: ProcessQuery | None = None) -> list[ProcessTableRow]:
    return tables_of(host, query, person_of=lambda row: HOSTILE).processes


@pytest.fixture
def hostile_host(db) -> Host:
    """Every value a row shows from the host is hostile: user, names, command line, owner, container id,
    device files; and the person the directory names."""
    owner = container_owner(CID, name=HOSTILE)
    return store("gpu01", processes=[
        proc(100, user=HOSTILE, name=HOSTILE),
        proc(101, ppid=100, user=HOSTILE, name=HOSTILE, cmdline=["python", HOSTILE], owner=owner,
             container_id=CID, device_files=["/dev/nvidia0", f"/dev/{HOSTILE}"], gpu_memory={GPU0: GiB},
             reasons=["gpu"]),
        proc(102, ppid=100, user=HOSTILE, container_id=HOSTILE, orphaned=True, gpu_memory={GPU0: GiB},
             reasons=["gpu"]),
        proc(103, user=HOSTILE, cmdline=["python", HOSTILE], owner=owner, container_id=CID,
             gpu_memory={GPU0: 2 * GiB}, reasons=["gpu"]),
    ], gpus=[gpu(0, used=10 * GiB)])


@pytest.mark.parametrize("group", ["", "workload"], ids=["process rows", "a workload's row"])
@pytest.mark.parametrize("may_request", [False, True], ids=["viewer", "requester"])
def test_every_value_from_the_host_is_escaped_and_its_controls_shown(hostile_host, group, may_request):
    rows = rows_of(hostile_host, ProcessQuery(group=group))
    html = process_table_rows(rows, hostile_host, "/kills/new/" if may_request else None)
    assert "<b>" not in html and "\x1b" not in html
    assert html.count("<tr") == len(rows)
    person = f' <span class="small person">{HOSTILE_SHOWN}</span>'
    owner_details = f"container_id {CID}, container_name {HOSTILE_IN_ATTRIBUTE}, image"
    if group:
        row = re.search(r'<tr class="workload-group".*?</tr>', html, re.S).group(0)
        # Its members' users as shown (untrusted_text.visible_text, as the filter lists them), escaped.
        users = f'<td data-label="User">{HOSTILE_IN_ATTRIBUTE}{person} <span class="small owner" title="'
        assert users in row
        assert owner_details in row
        assert f">docker {HOSTILE_SHOWN}</span></td>" in row  # the container's name, its label
        assert f'<span class="arg">{HOSTILE_SHOWN}</span>' in row  # its biggest member's command line
        assert ("Request kill of all</a>" in row) == may_request
    else:
        row = re.search(r'<tr id="process-101-10100".*?</tr>', html, re.S).group(0)
        assert f'<td data-label="User">{HOSTILE_SHOWN}{person}' in row
        assert owner_details in row
        assert f'<span class="arg">{HOSTILE_SHOWN}</span>' in row
        assert f'<div class="mono">/dev/{HOSTILE_SHOWN}</div>' in row
        assert f'<span class="mono">{HOSTILE_SHOWN}</span>' in row  # the parent's name
        assert (f'title="every process of docker {HOSTILE_IN_ATTRIBUTE} on this host">all of docker '
                f"{HOSTILE_SHOWN}</a>" in row) == may_request
        assert f"ctr {HOSTILE_SHOWN}</span>" in html  # a container id no owner explains


@pytest.mark.parametrize("prefix", ["/", "/gpuadmin/"])
def test_process_links_are_the_ones_reverse_gives_under_any_script_prefix(db, prefix):
    host = store("gpu01", processes=[proc(1000, name="launcher"), *holders(3)], gpus=[gpu(0, used=GiB)])
    set_script_prefix(prefix)
    try:
        html = process_table_rows(rows_of(host), host, "/kills/new/")
        expected = [reverse("process_detail", args=["gpu01", pid, pid * 100]) for pid in (2000, 2001, 2002)]
        parent = reverse("process_detail", args=["gpu01", 1000, 100000])
    finally:
        set_script_prefix("/")
    links = re.findall(r'<a class="process-link" href="([^"]+)">', html)
    assert sorted(links) == expected
    assert html.count(f'<a href="{parent}">1000</a>') == 3
    assert all(link.startswith(f"{prefix}hosts/gpu01/processes/") for link in links)


def test_an_open_request_replaces_the_kill_link_and_is_linked_for_everyone(db):
    job = slurm_owner("4242")
    host = store("gpu01", processes=[proc(100, owner=job, gpu_memory={GPU0: GiB}, reasons=["gpu"])],
                 gpus=[gpu(0, used=GiB)])
    tables = tables_of(host, open_requests={(100, 10000): 7})
    detail = reverse("kill_request_detail", args=[7])
    for_requester = process_table_rows(tables.processes, host, "/kills/new/")
    title = "a kill request for this process is open"
    assert f'<a class="open-request" href="{detail}" title="{title}">#7 requested</a>' in for_requester
    assert "Request kill</a>" not in for_requester
    kill_all = ' <a class="request-kill small" href="/kills/new/?host=gpu01&amp;workload=slurm_job%3A4242"'
    assert kill_all in for_requester
    for_viewer = process_table_rows(tables.processes, host, None)
    assert f'<a class="open-request small" href="{detail}" title="{title}">#7</a>' in for_viewer
    assert "row-actions" not in for_viewer
