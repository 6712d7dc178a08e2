"""A request for every process of one Slurm job or container on a host: each member an exact target."""

from __future__ import annotations

import pytest
from django.urls import reverse

from gpuadmin.audit.models import AuditEvent
from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest
from tests.factories import GiB, container_owner, gpu, proc, slurm_owner, snapshot
from tests.kills.helpers import store_snapshot

pytestmark = pytest.mark.django_db

GPU0 = "GPU-sim-0000"
CID = "ab" * 32
JOB = "slurm_job:4242"
CONTAINER = f"container:{CID}"
REASON = "the job ran over its reservation"


@pytest.fixture
def job_host(db):
    job = slurm_owner("4242", step="0")
    ctr = container_owner(CID)
    return store_snapshot(snapshot("gpu01", gpus=[gpu(0, used=40 * GiB)], processes=[
        proc(500, user="alice", owner={**job, "step": "batch"}, name="bash"),
        proc(501, ppid=500, user="alice", owner=job, gpu_memory={GPU0: 8 * GiB}),
        proc(502, ppid=500, user="alice", owner=job, gpu_memory={GPU0: 8 * GiB}),
        proc(503, ppid=500, user="alice", owner=job, state="Z", cmdline=[]),
        # A child of a worker in another cgroup (a user's own systemd-run): not the job's.
        proc(504, ppid=501, user="alice", owner={"kind": "user_service", "unit": "x.scope", "uid": 1000}),
        proc(600, user="bob", owner=ctr, container_id=CID, gpu_memory={GPU0: 4 * GiB}),
        proc(601, ppid=600, user="postgres", owner=ctr, container_id=CID),
    ]))


def test_every_process_of_the_job_becomes_an_exact_target(job_host, requester):
    kill_request = services.file_request(requester, host="gpu01", workload=JOB, reason=REASON)
    targets = list(kill_request.targets.all())
    assert [(t.pid, t.start_time_ticks, t.is_descendant) for t in targets] == [
        (500, 50000, False), (501, 50100, False), (502, 50200, False),
    ]
    assert all(t.owner["job_id"] == "4242" for t in targets)
    assert [e["pid"] for e in kill_request.excluded_targets] == [503]  # the zombie
    assert kill_request.workload == JOB and kill_request.workload_label == "job 4242"
    assert kill_request.memory_expected_release_bytes == 16 * GiB


def test_refused_members_are_listed_as_excluded(job_host, requester):
    kill_request = services.file_request(requester, host="gpu01", workload=CONTAINER, reason=REASON)
    assert [t.pid for t in kill_request.targets.all()] == [600]
    assert kill_request.excluded_targets[0]["pid"] == 601
    assert "protected" in kill_request.excluded_targets[0]["why"]


def test_the_audit_event_records_the_workload_and_each_targets_owner(job_host, requester):
    services.file_request(requester, host="gpu01", workload=JOB, reason=REASON)
    details = AuditEvent.objects.get(action="requested").details
    assert details["workload"] == {"key": JOB, "label": "job 4242"}
    assert details["targets"][1] == {"pid": 501, "start_time_ticks": 50100, "owner": slurm_owner("4242")}


@pytest.mark.parametrize(("workload", "message"), [
    ("slurm_job:9999", "no process of slurm_job:9999"),
    ("session:3", "names no job, container or pod"),
])
def test_an_unknown_workload_is_refused(job_host, requester, workload, message):
    with pytest.raises(services.Refused, match=message):
        services.file_request(requester, host="gpu01", workload=workload, reason=REASON)
    assert KillRequest.objects.count() == 0


def test_a_workload_and_a_pid_together_are_refused(job_host, requester):
    with pytest.raises(services.BadInput, match="either a workload or a process"):
        services.file_request(requester, host="gpu01", workload=JOB, pid=501, start_time_ticks=50100,
                              reason=REASON)


def test_a_member_already_targeted_blocks_the_group_request(job_host, requester):
    first = services.file_request(requester, host="gpu01", pid=502, start_time_ticks=50200, reason=REASON)
    with pytest.raises(services.Conflict, match=f"request #{first.pk}"):
        services.file_request(requester, host="gpu01", workload=JOB, reason=REASON)


def test_the_page_previews_the_members_then_files_them(job_host, requester_client):
    url = reverse("kill_request_new")
    page = requester_client.get(url, {"host": "gpu01", "workload": JOB}).content.decode()
    assert "every process of <strong class=\"workload\">job 4242</strong>" in page
    assert all(f'<tr data-pid="{pid}">' in page for pid in (500, 501, 502))
    assert "Processes left out" in page
    response = requester_client.post(url, {
        "host": "gpu01", "workload": JOB, "reason": REASON,
        "signal_1": "SIGINT", "grace_1": 30, "signal_2": "SIGKILL", "grace_2": 10,
    })
    assert response.status_code == 302, response.content.decode()
    kill_request = KillRequest.objects.get()
    assert kill_request.targets.count() == 3
    detail = requester_client.get(response["Location"]).content.decode()
    assert "job 4242" in detail


def test_the_api_files_and_previews_a_workload(job_host, requester):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(requester)
    preview = client.get(reverse("api_kill_request_preview"), {"host": "gpu01", "workload": CONTAINER}).json()
    assert preview["workload"]["label"] == "docker trainer"
    assert [t["pid"] for t in preview["targets"]] == [600]
    body = {"host": "gpu01", "workload": CONTAINER, "reason": REASON}
    created = client.post(reverse("api_kill_requests"), body, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["workload"] == {"key": CONTAINER, "label": "docker trainer"}
    assert created.json()["targets"][0]["owner"]["container_id"] == CID
