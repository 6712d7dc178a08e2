"""The holders table names each process's owner (job, container, pod, unit) next to its user."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from tests.factories import proc, snapshot
from tests.fleet.helpers import store
from tests.keys import deliver

pytestmark = pytest.mark.django_db

URL = reverse("host_detail", kwargs={"name": "gpu01"})
GPU = {"GPU-sim-0000": 1024**3}
CID = "4f1c0ab2e3d5c6b7a8f9e0d1c2b3a4f5e6d7c8b9a0f1e2d3c4b5a6f7e8d9c0b1"


def holder_row(client, pid: int) -> str:
    page = client.get(URL).content.decode()
    match = re.search(rf'<tr id="[^"]*" data-pid="{pid}">.*?</tr>', page, re.S)
    assert match, f"no row for pid {pid}"
    return match.group(0)


def user_cell(row: str) -> str:
    return re.findall(r'<td data-label="User">.*?</td>', row, re.S)[0]


@pytest.mark.parametrize(("owner", "label"), [
    ({"kind": "slurm_job", "job_id": "4242", "step": "0", "uid": 1000}, "job 4242.0"),
    ({"kind": "container", "runtime": "docker", "container_id": CID, "container_name": "trainer",
      "image": "pytorch/pytorch:2.3"}, "docker trainer"),
    ({"kind": "container", "runtime": None, "container_id": CID, "container_name": None, "image": None},
     "container 4f1c0ab2e3d5"),
    ({"kind": "kubernetes_pod", "runtime": "containerd", "pod_uid": "0c9c8b7a-6f5e-4d3c-2b1a-0f9e8d7c6b5a",
      "qos_class": "burstable", "namespace": "ml", "pod_name": "bert-0", "container_id": CID,
      "container_name": "bert", "image": None}, "pod ml/bert-0/bert"),
    ({"kind": "login_session", "session_id": "3", "uid": 1000, "unit": "session-3.scope"}, "session 3"),
    ({"kind": "user_service", "unit": "app-firefox.scope", "uid": 1000}, "user unit app-firefox.scope"),
    ({"kind": "system_service", "unit": "jupyterhub.service"}, "unit jupyterhub.service"),
])
def test_the_owner_is_shown_next_to_the_user(viewer_client, owner, label):
    store("gpu01", processes=[proc(7, user="alice", gpu_memory=GPU, owner=owner,
                                   container_id=owner.get("container_id"))])
    cell = user_cell(holder_row(viewer_client, 7))
    assert "alice" in cell
    assert f">{label}</span>" in cell


def test_the_owner_details_are_in_the_tooltip(viewer_client):
    owner = {"kind": "slurm_job", "job_id": "4242", "step": "batch", "uid": 1000}
    store("gpu01", processes=[proc(7, gpu_memory=GPU, owner=owner)])
    assert 'title="kind slurm_job, job_id 4242, step batch, uid 1000"' in holder_row(viewer_client, 7)


def test_names_from_the_host_are_escaped(viewer_client):
    owner = {"kind": "container", "runtime": "docker", "container_id": CID,
             "container_name": '<script>alert(1)</script>"\x1b[31m', "image": "<img src=x>"}
    store("gpu01", processes=[proc(7, gpu_memory=GPU, owner=owner, container_id=CID)])
    row = holder_row(viewer_client, 7)
    assert "<script>" not in row
    assert "<img" not in row
    assert "docker &lt;script&gt;alert(1)&lt;/script&gt;&quot;" in row
    assert '<span class="ctl" title="control character">' in row  # the ESC is shown, not sent


def test_a_process_without_an_owner_shows_the_user_alone(viewer_client):
    store("gpu01", processes=[proc(7, user="alice", gpu_memory=GPU)])
    cell = user_cell(holder_row(viewer_client, 7))
    assert 'class="small muted owner"' not in cell


def test_a_version_1_snapshot_is_ingested_and_shown_with_its_container_id(viewer_client):
    document = snapshot("gpu01", processes=[proc(7, user="alice", gpu_memory=GPU, container_id=CID)])
    document["schema_version"] = 1
    del document["processes"][0]["owner"]
    deliver(json.dumps(document))
    cell = user_cell(holder_row(viewer_client, 7))
    assert f"ctr {CID}" in cell
