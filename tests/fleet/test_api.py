"""The read-side hosts API, field by field."""

from datetime import timedelta

import pytest
from django.urls import reverse

from gpuadmin.fleet.models import Host
from tests.factories import GiB, gpu, proc
from tests.fleet.helpers import busy_host_gpus, busy_host_processes, make_offline, store, store_busy_host

pytestmark = pytest.mark.django_db


def iso(moment) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def get_json(client, url_name, **kwargs):
    response = client.get(reverse(url_name, kwargs=kwargs or None))
    assert response["Content-Type"] == "application/json"
    return response.status_code, response.json()


def expected_summary(host: Host) -> dict:
    host.refresh_from_db()
    return {
        "name": host.name,
        "online": host.is_online,
        "first_seen_at": iso(host.first_seen_at),
        "last_seen_at": iso(host.last_seen_at),
        "last_snapshot_taken_at": iso(host.last_snapshot_taken_at),
        "boot_id": host.boot_id,
        "kernel": "6.18.0-test",
        "driver_version": None,
        "pid_max": 4194304,
        "pids_in_use": host.pids_in_use,
    }


def test_hosts_list_shape(viewer_client):
    busy = store_busy_host("gpu01")
    status, body = get_json(viewer_client, "api_hosts")
    assert status == 200
    assert [h["name"] for h in body] == ["gpu01"]
    host = body[0]
    assert set(host) == {
        "name", "online", "first_seen_at", "last_seen_at", "last_snapshot_taken_at", "boot_id", "kernel",
        "driver_version", "pid_max", "pids_in_use", "gpus", "counts", "open_findings_count",
        "open_findings_by_severity", "gpu_backend", "last_error", "last_error_at",
    }
    for field, value in expected_summary(busy).items():
        assert host[field] == value, field
    assert host["online"] is True
    assert host["gpus"] == [
        {"index": 0, "uuid": "GPU-sim-0000", "name": "Simulated H100", "memory_total_bytes": 80 * GiB,
         "memory_used_bytes": 30 * GiB, "memory_attributed_bytes": 28 * GiB,
         "memory_unattributed_bytes": 2 * GiB, "utilization_percent": 97},
        {"index": 1, "uuid": "GPU-sim-0001", "name": "Simulated H100", "memory_total_bytes": 80 * GiB,
         "memory_used_bytes": 10 * GiB, "memory_attributed_bytes": 8 * GiB,
         "memory_unattributed_bytes": 2 * GiB, "utilization_percent": 40},
    ]
    assert host["counts"] == {"processes": 113, "zombies": 6, "gpu_processes": 5}
    assert host["open_findings_count"] == 5
    assert host["open_findings_by_severity"] == {"info": 2, "warning": 2, "critical": 1}
    assert host["gpu_backend"] == {"name": "simulated", "available": True, "reason": None}
    assert host["last_error"] is None
    assert host["last_error_at"] is None


def test_hosts_list_marks_offline_hosts_and_errors(viewer_client):
    make_offline(store("old", backend="none", available=False, reason="driver not loaded", gpus=[]))
    Host.objects.filter(name="old").update(last_error="schema_version 99 is not supported")
    _, body = get_json(viewer_client, "api_hosts")
    (host,) = body
    assert host["online"] is False
    assert host["gpus"] == []
    assert host["gpu_backend"] == {"name": "none", "available": False, "reason": "driver not loaded"}
    assert host["last_error"] == "schema_version 99 is not supported"


def test_host_detail_carries_processes_as_the_probe_sent_them(viewer_client):
    store_busy_host("gpu01")
    sent = {p["pid"]: p for p in busy_host_processes()}
    status, body = get_json(viewer_client, "api_host_detail", name="gpu01")
    assert status == 200
    assert [p["pid"] for p in body["processes"]] == [101, 102, 201, 202, 103]
    for process in body["processes"]:
        assert process == sent[process["pid"]]  # every field, cmdline list and digest included
    first = body["processes"][0]
    assert first["cmdline"] == ["python", "train.py", "--lr", "3e-4"]
    assert len(first["cmdline_sha256"]) == 64
    assert first["start_time_ticks"] == 10100
    assert first["gpu_memory_bytes"] == {"GPU-sim-0000": 20 * GiB}


def test_host_detail_zombie_trees_and_orphans(viewer_client):
    store_busy_host("gpu01")
    sent = {p["pid"]: p for p in busy_host_processes()}
    _, body = get_json(viewer_client, "api_host_detail", name="gpu01")
    assert body["zombie_trees"] == [
        {"parent_pid": 300, "parent": sent[300], "zombie_count": 5,
         "zombies": [sent[pid] for pid in range(301, 306)]},
        {"parent_pid": 999, "parent": None, "zombie_count": 1, "zombies": [sent[310]]},
    ]
    assert body["orphans"] == [sent[201], sent[202]]


def test_host_detail_findings_most_severe_first(viewer_client):
    busy = store_busy_host("gpu01")
    _, body = get_json(viewer_client, "api_host_detail", name="gpu01")
    assert [f["kind"] for f in body["findings"]] == [
        "orphan_gpu", "unattributed_memory", "unattributed_memory", "zombies", "zombies",
    ]
    orphan = busy.findings.get(kind="orphan_gpu")
    assert body["findings"][0] == {
        "kind": "orphan_gpu",
        "severity": "critical",
        "title": orphan.title,
        "remedy": orphan.remedy,
        "first_seen_at": iso(orphan.first_seen_at),
        "last_seen_at": iso(orphan.last_seen_at),
        "details": orphan.details,
    }


def test_host_detail_includes_the_summary_and_snapshot_time(viewer_client):
    busy = store_busy_host("gpu01")
    _, summary = get_json(viewer_client, "api_hosts")
    _, body = get_json(viewer_client, "api_host_detail", name="gpu01")
    for field, value in summary[0].items():
        assert body[field] == value, field
    assert body["snapshot_taken_at"] == busy.latest_snapshot.document["taken_at"]


def test_resolved_findings_leave_the_api(viewer_client):
    store_busy_host("gpu01")
    ten_seconds_later = Host.objects.get(name="gpu01").last_snapshot_taken_at + timedelta(seconds=10)
    store("gpu01", processes=[proc(101, gpu_memory={"GPU-sim-0000": GiB})], gpus=[gpu(0, used=GiB)],
          taken_at=ten_seconds_later)
    _, body = get_json(viewer_client, "api_host_detail", name="gpu01")
    assert body["findings"] == []
    assert body["zombie_trees"] == []
    assert body["orphans"] == []
    assert body["open_findings_count"] == 0


def test_unknown_host_is_a_json_404(viewer_client):
    status, body = get_json(viewer_client, "api_host_detail", name="nope")
    assert status == 404
    assert body == {"detail": "No host named 'nope' has sent a snapshot."}


def test_a_host_without_a_stored_snapshot_has_empty_tables(viewer_client):
    Host.objects.create(name="new")
    _, body = get_json(viewer_client, "api_host_detail", name="new")
    assert body["processes"] == body["zombie_trees"] == body["orphans"] == body["findings"] == []
    assert body["snapshot_taken_at"] is None
    assert body["last_seen_at"] is None


def test_listing_many_hosts_takes_a_fixed_number_of_queries(viewer_client, django_assert_max_num_queries):
    for n in range(30):
        store(f"node{n:02d}", processes=busy_host_processes()[:3], gpus=busy_host_gpus())
    viewer_client.get(reverse("api_hosts"))
    with django_assert_max_num_queries(5):
        _, body = get_json(viewer_client, "api_hosts")
    assert len(body) == 30
