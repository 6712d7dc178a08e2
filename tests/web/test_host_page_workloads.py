"""The holders table filtered and grouped by job / container, and a workload's workers collapsed."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from gpuadmin.web.host_tables import ProcessQuery
from tests.factories import GiB, container_owner, gpu, proc, slurm_owner
from tests.fleet.helpers import store

pytestmark = pytest.mark.django_db

URL = reverse("host_detail", kwargs={"name": "gpu01"})
GPU0, GPU1 = "GPU-sim-0000", "GPU-sim-0001"
CID = "c0ffee" + "0" * 58
JOB = "slurm_job:4242"
CONTAINER = f"container:{CID}"


@pytest.fixture
def lab_host(db):
    """Job 4242: a launcher and three workers (2+2+3 GiB over two GPUs); a container with two
    processes (5 + 1 GiB); and one process of no workload."""
    job = slurm_owner("4242", step="0")
    ctr = container_owner(CID, name="trainer")
    processes = [
        proc(100, user="alice", owner=job, gpu_memory={GPU0: 2 * GiB}),
        proc(101, ppid=100, user="alice", owner=job, gpu_memory={GPU0: 2 * GiB}),
        proc(102, ppid=100, user="alice", owner={**job, "step": "1"}, gpu_memory={GPU1: 3 * GiB}),
        proc(200, user="bob", owner=ctr, container_id=CID, gpu_memory={GPU0: 5 * GiB}),
        proc(201, user="bob", owner=ctr, container_id=CID, device_files=["/dev/nvidia0"],
             gpu_memory={GPU0: 1 * GiB}),
        proc(300, user="carol", gpu_memory={GPU1: 4 * GiB}),
    ]
    return store("gpu01", processes=processes, gpus=[gpu(0, used=30 * GiB), gpu(1, used=30 * GiB)])


def page(client, **params) -> str:
    response = client.get(URL, params)
    assert response.status_code == 200
    return response.content.decode()


def pids(html: str) -> list[int]:
    return [int(p) for p in re.findall(r'<tr id="[^"]*" data-pid="(\d+)">', html)]


def groups(html: str) -> dict[str, str]:
    rows = r'<tr class="workload-group" id="[^"]*" data-workload="([^"]+)">(.*?)</tr>'
    return dict(re.findall(rows, html, re.S))


def test_the_filter_offers_each_job_and_container_once(viewer_client, lab_host):
    html = page(viewer_client)
    assert f'<option value="{JOB}">job 4242</option>' in html  # both steps are one job
    assert f'<option value="{CONTAINER}">docker trainer</option>' in html


@pytest.mark.parametrize(("owner", "expected"), [
    (JOB, [102, 100, 101]),
    (CONTAINER, [200, 201]),
    ("slurm_job:9999", []),
    ("junk", []),
])
def test_filtering_by_job_or_container(viewer_client, lab_host, owner, expected):
    assert pids(page(viewer_client, owner=owner)) == expected


def test_the_text_filter_finds_the_owner_label(viewer_client, lab_host):
    assert pids(page(viewer_client, q="trainer")) == [200, 201]


def test_grouping_collapses_each_workload_into_one_row_with_its_total_memory(viewer_client, lab_host):
    html = page(viewer_client, group="workload")
    rows = groups(html)
    assert set(rows) == {JOB, CONTAINER}
    assert "3 processes" in rows[JOB]
    assert "GPU 0: 4 GiB" in rows[JOB] and "GPU 1: 3 GiB" in rows[JOB]
    assert "total 7 GiB" in rows[JOB]
    assert "total 6 GiB" in rows[CONTAINER]
    # The members' states, each once ("S", never "SSS" for three sleeping members).
    assert re.search(r'data-label="State" class="mono" title="the members\' states">S</td>', rows[JOB])
    assert pids(html) == [300]  # no workload: still its own row
    # Largest first: the job's 7 GiB, the container's 6 GiB, then carol's 4 GiB.
    order = re.findall(r'data-(?:workload|pid)="([^"]+)"', html)
    assert order == [JOB, CONTAINER, "300"]


def test_a_group_row_links_to_its_members_and_offers_a_kill_of_all(requester_client, lab_host):
    rows = groups(page(requester_client, group="workload"))
    assert f'href="?owner={JOB.replace(":", "%3A")}"' in rows[JOB]
    assert f"workload={JOB.replace(':', '%3A')}" in rows[JOB]
    assert "Request kill of all" in rows[JOB]


def test_grouping_after_filtering_counts_only_the_matching_members(viewer_client, lab_host):
    rows = groups(page(viewer_client, group="workload", gpu="1"))
    assert rows == {}  # on GPU 1 the job has one process (102): nothing to collapse
    assert pids(page(viewer_client, group="workload", gpu="1")) == [300, 102]


def test_the_poll_keeps_the_grouping(viewer_client, lab_host):
    headers = {"HX-Request": "true", "HX-Target": "host-tables"}
    html = viewer_client.get(URL, {"group": "workload"}, headers=headers).content.decode()
    assert set(groups(html)) == {JOB, CONTAINER}


@pytest.mark.parametrize(("params", "expected"), [
    ({"owner": JOB, "group": "workload"}, ProcessQuery(owner=JOB, group="workload")),
    ({"group": "yes"}, ProcessQuery()),
    ({"owner": "x" * 101}, ProcessQuery()),
    ({"owner": "a\x00b"}, ProcessQuery()),
])
def test_owner_and_group_parameters(params, expected):
    assert ProcessQuery.from_params(params) == expected
