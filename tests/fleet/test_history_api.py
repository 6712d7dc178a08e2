"""The history JSON API: /api/v1/hosts/<name>/history/ and /api/v1/hosts/<name>/processes/<pid>-<start>/."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from knox.models import AuthToken

from gpuadmin.fleet.history import retention
from gpuadmin.fleet.models import Host
from gpuadmin.kills import services
from gpuadmin.probe.gpus import GpuHealth
from tests.factories import GiB, gpu, proc, snapshot
from tests.keys import deliver, enrol

pytestmark = pytest.mark.django_db

GPU0 = "GPU-sim-0000"


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def store(document: dict[str, Any]) -> None:
    taken_at = datetime.fromisoformat(document["taken_at"])
    deliver(json.dumps(document), received_at=taken_at + timedelta(seconds=1))


@pytest.fixture
def token_client(viewer: User) -> Client:
    _, key = AuthToken.objects.create(user=viewer)
    return Client(HTTP_AUTHORIZATION=f"Token {key}")


@pytest.fixture
def start() -> datetime:
    """A bucket boundary about half an hour ago: what the tests store lies in known buckets."""
    now = timezone.now()
    return retention.bucket_start(retention.bucket_of(now - timedelta(minutes=30)))


def health(i: int) -> dict[str, Any]:
    """The i-th minute's GPU health: 50 + i °C, 100 + 10 i W of a 700 W limit."""
    return GpuHealth(temperature_celsius=50 + i, power_draw_milliwatts=(100 + 10 * i) * 1000,
                     power_limit_milliwatts=700_000).as_document()


def store_minutes(start: datetime, minutes: int, *, every_seconds: int = 60) -> list[dict[str, Any]]:
    """A snapshot a minute; the GPU says nothing of its health in minutes 3, 8, 13... (an older agent)."""
    documents = []
    for i, seconds in enumerate(range(0, minutes * 60, every_seconds)):
        memory = (1 + i % 4) * GiB
        gpu0 = gpu(0, used=memory, utilization_percent=10 * (i % 5))
        if i % 5 != 3:
            gpu0["health"] = health(i)
        document = snapshot(
            "gpu01",
            processes=[
                proc(1000, gpu_memory={GPU0: memory // 2}),
                *[proc(2000 + z, state="Z") for z in range(i % 3)],
            ],
            gpus=[gpu0],
            taken_at=start + timedelta(seconds=seconds),
            pids_in_use=400 + i,
        )
        store(document)
        documents.append(document)
    return documents


def history(client: Client, name: str = "gpu01", **params: str) -> tuple[int, dict[str, Any]]:
    response = client.get(reverse("api_host_history", args=[name]), params)
    assert response["Content-Type"] == "application/json"
    return response.status_code, response.json()


def test_the_last_hour_is_every_raw_sample_oldest_first(token_client: Client, start: datetime) -> None:
    store_minutes(start, 10)
    status, body = history(token_client, range="1h")
    assert status == 200
    assert (body["range"], body["resolution_seconds"], body["aggregation"]) == ("1h", 10, None)
    [gpu0] = body["gpus"]
    assert (gpu0["uuid"], gpu0["index"], gpu0["name"]) == (GPU0, 0, "Simulated H100")
    assert [p["t"] for p in gpu0["points"]] == [iso(start + timedelta(minutes=m)) for m in range(10)]
    assert gpu0["points"][1] == {
        "t": iso(start + timedelta(minutes=1)),
        "memory_used_bytes": 2 * GiB,
        "memory_attributed_bytes": GiB,
        "utilization_percent": 10,
        "temperature_celsius": 51,
        "power_draw_milliwatts": 110_000,
        "power_limit_milliwatts": 700_000,
    }
    # Null when the GPU did not say, never zero.
    unsaid = gpu0["points"][3]
    health_keys = ("temperature_celsius", "power_draw_milliwatts", "power_limit_milliwatts")
    assert [unsaid[key] for key in health_keys] == [None, None, None]
    assert body["host"]["points"][2] == {
        "t": iso(start + timedelta(minutes=2)),
        "zombies": 2,
        "d_state": 0,
        "pids_in_use": 402,
        "pid_max": 4194304,
    }
    assert body["kill_requests"] == []


def test_a_day_is_five_minute_points_with_the_max_memory_and_mean_utilization(
    token_client: Client, start: datetime
) -> None:
    store_minutes(start, 15)
    # The first two buckets are rolled up, the third is still raw: both read the same.
    retention.roll_up(start + timedelta(minutes=11))
    status, body = history(token_client, range="24h")
    assert status == 200
    assert body["resolution_seconds"] == 300
    assert body["aggregation"] == {
        "memory": "max", "utilization": "mean", "health": "max", "host_counts": "max"}
    points = body["gpus"][0]["points"]
    assert [p["t"] for p in points] == [iso(start + timedelta(minutes=m)) for m in (0, 5, 10)]
    # Minutes 0-4: memory 1, 2, 3, 4, 1 GiB; utilization 0, 10, 20, 30, 40.
    assert points[0] == {
        "t": iso(start),
        "memory_used_bytes": 4 * GiB,
        "memory_attributed_bytes": 2 * GiB,
        "utilization_percent": 20.0,
        "temperature_celsius": 54,
        "power_draw_milliwatts": 140_000,
        "power_limit_milliwatts": 700_000,
    }
    # Minutes 5-9, from a stored rollup, and 10-14, summarised on the fly: the hottest, the most drawn.
    assert [(p["temperature_celsius"], p["power_draw_milliwatts"]) for p in points[1:]] == [
        (59, 190_000), (64, 240_000)]
    assert [p["zombies"] for p in body["host"]["points"]] == [2, 2, 2]
    assert [p["pids_in_use"] for p in body["host"]["points"]] == [404, 409, 414]


def test_thirty_days_group_the_rollups_into_two_hour_points(token_client: Client, start: datetime) -> None:
    store_minutes(start, 15)
    retention.roll_up(start + timedelta(minutes=20))
    status, body = history(token_client, range="30d")
    assert (status, body["resolution_seconds"]) == (200, 7200)
    points = body["gpus"][0]["points"]
    two_hours = 7200
    expected_start = datetime.fromtimestamp(int(start.timestamp()) // two_hours * two_hours, tz=start.tzinfo)
    if len(points) == 1:
        assert points[0]["t"] == iso(expected_start)
    # Fifteen minutes fall in one or (across a boundary) two 2-hour points; the max is 4 GiB.
    assert max(p["memory_used_bytes"] for p in points) == 4 * GiB
    assert 1 <= len(points) <= 2


@pytest.mark.parametrize("bad", ["2h", "all", "1H"])
def test_a_bad_range_answers_400_naming_the_allowed_ones(
    token_client: Client, start: datetime, bad: str
) -> None:
    store_minutes(start, 1)
    status, body = history(token_client, range=bad)
    assert status == 400
    assert body["allowed"] == ["1h", "24h", "7d", "30d"]
    assert "1h, 24h, 7d, 30d" in body["detail"]


def test_an_unknown_host_answers_404_json(token_client: Client) -> None:
    status, body = history(token_client, "nope", range="1h")
    assert status == 404
    assert "nope" in body["detail"]
    response = token_client.get(reverse("api_process_detail", args=["nope", 1, 2]))
    assert (response.status_code, response["Content-Type"]) == (404, "application/json")


def test_the_history_needs_credentials(start: datetime) -> None:
    store_minutes(start, 1)
    assert Client().get(reverse("api_host_history", args=["gpu01"])).status_code == 401


def test_a_process_has_its_points_its_end_and_the_kill_requests_against_it(
    token_client: Client, start: datetime, requester: User
) -> None:
    for minute, (memory, state) in enumerate([(GiB, "R"), (GiB, "R"), (3 * GiB, "R"), (3 * GiB, "S")]):
        store(
            snapshot(
                "gpu01",
                processes=[
                    proc(1000, state=state, gpu_memory={GPU0: memory}, cmdline=["python", "train.py"])
                ],
                gpus=[gpu(0, used=memory)],
                taken_at=timezone.now() - timedelta(minutes=4 - minute),
            )
        )
    enrol(Host.objects.get(name="gpu01"))  # requests are filed only for hosts whose key was accepted
    kill_request = services.file_request(
        requester, host="gpu01", pid=1000, start_time_ticks=100000, reason="done yesterday"
    )
    response = token_client.get(reverse("api_process_detail", args=["gpu01", 1000, 100000]))
    assert response.status_code == 200
    body = response.json()
    assert (body["pid"], body["start_time_ticks"], body["user"], body["cmdline"]) == (
        1000,
        100000,
        "alice",
        ["python", "train.py"],
    )
    assert body["gone_at"] is None
    assert body["first_seen_at"].endswith("Z")
    assert [(p["gpu_memory_bytes"], p["state"]) for p in body["points"]] == [
        (GiB, "R"),
        (3 * GiB, "R"),
        (3 * GiB, "S"),
    ]
    assert [c["state"] for c in body["state_changes"]] == ["R", "S"]
    assert [(k["id"], k["status"]) for k in body["kill_requests"]] == [(kill_request.pk, "pending")]


def test_a_steady_process_was_last_seen_by_the_host_s_newest_snapshot(token_client: Client) -> None:
    """Its stored last_seen_at is when it was last written; what the API says is when it was last seen."""
    taken = [timezone.now() - timedelta(seconds=40 - 10 * i) for i in range(4)]
    for taken_at in taken:
        store(snapshot("gpu01", processes=[proc(1000, gpu_memory={GPU0: GiB})], gpus=[gpu(0, used=GiB)],
                       taken_at=taken_at))
    body = token_client.get(reverse("api_process_detail", args=["gpu01", 1000, 100000])).json()
    newest = taken[-1].isoformat().replace("+00:00", "Z")
    assert body["last_seen_at"] == newest
    # The series ends where the process was last seen, not at its stored (older) last_seen_at.
    assert [p["t"] for p in body["points"]] == [iso(taken[0]), iso(taken[-1])]


def test_a_process_never_recorded_answers_404_json(token_client: Client, start: datetime) -> None:
    store_minutes(start, 1)
    response = token_client.get(reverse("api_process_detail", args=["gpu01", 1000, 1]))
    assert response.status_code == 404
    assert "1000" in response.json()["detail"]


def test_a_kill_marks_only_the_gpus_its_targets_held_at_the_moment_it_was_sent(
    token_client: Client, requester: User
) -> None:
    gpu1 = "GPU-sim-0001"
    store(snapshot("gpu01", processes=[proc(1000, gpu_memory={GPU0: GiB})],
                   gpus=[gpu(0, used=GiB), gpu(1, used=0)], taken_at=timezone.now() - timedelta(minutes=2)))
    enrol(Host.objects.get(name="gpu01"))
    kill_request = services.file_request(requester, host="gpu01", pid=1000, start_time_ticks=100000,
                                         reason="done")
    marker = token_client.get(reverse("api_host_history", args=["gpu01"])).json()["kill_requests"][0]
    assert (marker["gpu_uuids"], marker["ran_at"]) == ([GPU0], None)  # filed, not run
    sent = timezone.now().replace(microsecond=0) + timedelta(seconds=30)
    kill_request.__class__.objects.filter(pk=kill_request.pk).update(dispatched_at=sent)
    marker = token_client.get(reverse("api_host_history", args=["gpu01"])).json()["kill_requests"][0]
    assert marker["ran_at"] == sent.isoformat().replace("+00:00", "Z") and marker["t"] != marker["ran_at"]
    assert gpu1 not in marker["gpu_uuids"]
