"""The simulated GPU backend: a JSON file re-read at every snapshot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.probe.helpers import Device, Processes, free_pid, rows_by_pid, snapshot

GiB = 1024**3
MiB = 1024**2


def write(path: Path, document: Any) -> str:
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return str(path)


def gpus_file(tmp_path: Path, processes: list[dict[str, Any]], extra_used_bytes: int = 0) -> str:
    return write(tmp_path / "gpus.json", {
        "gpus": [
            {"uuid": "GPU-sim-a", "name": "Simulated A100", "memory_total_bytes": 80 * GiB,
             "extra_used_bytes": extra_used_bytes, "utilization_percent": 97},
            {"uuid": "GPU-sim-b", "name": "Simulated A100", "memory_total_bytes": 80 * GiB,
             "extra_used_bytes": 0, "utilization_percent": None},
        ],
        "processes": processes,
    })


def test_used_memory_is_the_listed_processes_plus_extra(
    tmp_path: Path, processes: Processes, device: Device
) -> None:
    worker = processes.start("sleeper")
    ghost = free_pid()
    path = gpus_file(tmp_path, [
        {"pid": worker.pid, "gpu_uuid": "GPU-sim-a", "used_memory_bytes": 10 * GiB},
        {"pid": worker.pid, "gpu_uuid": "GPU-sim-b", "used_memory_bytes": 1 * GiB},
        {"pid": ghost, "gpu_uuid": "GPU-sim-a", "used_memory_bytes": 3 * GiB},
    ], extra_used_bytes=512 * MiB)

    document = snapshot(device.glob, gpu_backend="simulated", simulated_gpus_path=path)

    assert document["gpu_backend"] == {"name": "simulated", "available": True, "reason": None}
    a, b = document["gpus"]
    assert (a["index"], a["uuid"], b["index"], b["uuid"]) == (0, "GPU-sim-a", 1, "GPU-sim-b")
    assert a["memory_used_bytes"] == 10 * GiB + 3 * GiB + 512 * MiB  # the ghost's memory counts too
    assert b["memory_used_bytes"] == 1 * GiB
    assert (a["utilization_percent"], b["utilization_percent"]) == (97, None)
    row = rows_by_pid(document)[worker.pid]
    assert row["gpu_memory_bytes"] == {"GPU-sim-a": 10 * GiB, "GPU-sim-b": 1 * GiB}
    assert row["reasons"] == ["gpu"]
    # A PID /proc does not know is no process row: its memory shows as unattributed downstream.
    assert ghost not in rows_by_pid(document)
    assert document["unmatched_gpu_processes"] == [
        {"pid": ghost, "gpu_uuid": "GPU-sim-a", "used_memory_bytes": 3 * GiB}
    ]


def test_each_process_gets_its_own_utilisation_or_a_share_of_what_the_others_left(
    tmp_path: Path, processes: Processes, device: Device
) -> None:
    said, shared, unsampled = (processes.start("sleeper") for _ in range(3))
    path = gpus_file(tmp_path, [
        {"pid": said.pid, "gpu_uuid": "GPU-sim-a", "used_memory_bytes": GiB, "utilization_percent": 40},
        {"pid": shared.pid, "gpu_uuid": "GPU-sim-a", "used_memory_bytes": GiB},
        {"pid": free_pid(), "gpu_uuid": "GPU-sim-a", "used_memory_bytes": GiB},
        {"pid": unsampled.pid, "gpu_uuid": "GPU-sim-a", "used_memory_bytes": GiB,
         "utilization_percent": None},
        {"pid": said.pid, "gpu_uuid": "GPU-sim-b", "used_memory_bytes": GiB},  # a GPU without utilisation
    ])

    document = snapshot(device.glob, gpu_backend="simulated", simulated_gpus_path=path)

    rows = rows_by_pid(document)
    assert rows[said.pid]["gpu_utilization_percent"] == {"GPU-sim-a": 40}
    assert rows[shared.pid]["gpu_utilization_percent"] == {"GPU-sim-a": 28}  # (97 - 40) // 2, with the ghost
    assert "gpu_utilization_percent" not in rows[unsampled.pid]
    bad = gpus_file(tmp_path, [{"pid": said.pid, "gpu_uuid": "GPU-sim-a", "used_memory_bytes": GiB,
                                "utilization_percent": 101}])
    backend = snapshot(device.glob, gpu_backend="simulated", simulated_gpus_path=bad)["gpu_backend"]
    assert backend["reason"].endswith("processes[0].utilization_percent: must be 0..100, got 101")


def test_memory_not_available_is_null(tmp_path: Path, processes: Processes, device: Device) -> None:
    worker = processes.start("sleeper")
    path = gpus_file(tmp_path, [{"pid": worker.pid, "gpu_uuid": "GPU-sim-a", "used_memory_bytes": None}])

    document = snapshot(device.glob, gpu_backend="simulated", simulated_gpus_path=path)

    assert rows_by_pid(document)[worker.pid]["gpu_memory_bytes"] == {"GPU-sim-a": None}
    assert document["gpus"][0]["memory_used_bytes"] == 0


def test_the_file_is_read_again_at_every_snapshot(
    tmp_path: Path, processes: Processes, device: Device
) -> None:
    worker = processes.start("sleeper")
    path = gpus_file(tmp_path, [{"pid": worker.pid, "gpu_uuid": "GPU-sim-a", "used_memory_bytes": GiB}])
    first = snapshot(device.glob, gpu_backend="simulated", simulated_gpus_path=path)

    gpus_file(tmp_path, [], extra_used_bytes=7 * GiB)
    second = snapshot(device.glob, gpu_backend="simulated", simulated_gpus_path=path)

    assert first["gpus"][0]["memory_used_bytes"] == GiB
    assert worker.pid in rows_by_pid(first)
    assert second["gpus"][0]["memory_used_bytes"] == 7 * GiB
    assert worker.pid not in rows_by_pid(second)


BROKEN = {
    "not JSON": ("{gpus: [", "Expecting property name"),
    "not an object": ([1, 2], "expected a JSON object"),
    "no gpus": ({"processes": []}, "gpus: expected a list"),
    "pid as text": ({"gpus": [{"uuid": "G", "memory_total_bytes": 1}],
                     "processes": [{"pid": "12", "gpu_uuid": "G", "used_memory_bytes": 1}]},
                    "processes[0].pid: expected a non-negative integer"),
    "negative memory": ({"gpus": [{"uuid": "G", "memory_total_bytes": -1}]},
                        "gpus[0].memory_total_bytes: expected a non-negative integer"),
    "unknown GPU": ({"gpus": [{"uuid": "G", "memory_total_bytes": 1}],
                     "processes": [{"pid": 12, "gpu_uuid": "H", "used_memory_bytes": 1}]},
                    "no GPU with uuid 'H'"),
    "same uuid twice": ({"gpus": [{"uuid": "G", "memory_total_bytes": 1}] * 2}, "appears twice"),
    "utilization over 100": ({"gpus": [{"uuid": "G", "memory_total_bytes": 1, "utilization_percent": 150}]},
                             "must be 0..100"),
    "memory as boolean": ({"gpus": [{"uuid": "G", "memory_total_bytes": True}]}, "memory_total_bytes"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_file_makes_the_backend_unavailable_with_the_reason(
    case: str, tmp_path: Path, processes: Processes, device: Device
) -> None:
    content, expected = BROKEN[case]
    path = write(tmp_path / "gpus.json", content)
    holder = processes.start("holder", device.path)

    document = snapshot(device.glob, gpu_backend="simulated", simulated_gpus_path=path)

    backend = document["gpu_backend"]
    assert backend["name"] == "simulated"
    assert backend["available"] is False
    assert path in backend["reason"]
    assert expected in backend["reason"]
    assert document["gpus"] == []
    # The rest of the snapshot is still there.
    assert rows_by_pid(document)[holder.pid]["device_files"] == [device.path]


def test_a_missing_file_or_none_configured_is_a_reason_not_a_crash(tmp_path: Path, device: Device) -> None:
    missing = str(tmp_path / "nowhere.json")
    absent = snapshot(device.glob, gpu_backend="simulated", simulated_gpus_path=missing)["gpu_backend"]
    unset = snapshot(device.glob, gpu_backend="simulated")["gpu_backend"]

    assert absent["available"] is False
    assert absent["reason"] == f"simulated GPU file {missing}: No such file or directory"
    assert unset["available"] is False
    assert "GPUADMIN_SIMULATED_GPUS" in unset["reason"]


def test_waves_move_memory_and_utilization_over_time(tmp_path: Path) -> None:
    from gpuadmin.probe.gpus import simulated

    path = write(tmp_path / "waves.json", {
        "gpus": [{"uuid": "GPU-w", "memory_total_bytes": 80 * GiB, "extra_used_bytes": GiB,
                  "extra_wave_bytes": 2 * GiB, "utilization_percent": 10, "utilization_wave_percent": 95,
                  "period_seconds": 100}],
        "processes": [{"pid": 7, "gpu_uuid": "GPU-w", "used_memory_bytes": 4 * GiB, "wave_bytes": 8 * GiB,
                       "period_seconds": 100}],
    })

    def at(t: float) -> tuple[int | None, int | None, int | None]:
        state = simulated.read(path, clock=lambda: t)
        gpu, process = state.gpus[0], state.processes[0]
        return gpu.memory_used_bytes, gpu.utilization_percent, process.used_memory_bytes

    assert at(0) == (5 * GiB, 10, 4 * GiB)  # a wave starts at its trough
    assert at(50) == (15 * GiB, 100, 12 * GiB)  # and peaks half a period later (utilization capped at 100)
    assert at(25) == (10 * GiB, 57, 8 * GiB)  # 10 + 95 / 2, rounded
    assert at(100) == at(0)
    broken = write(tmp_path / "broken.json",
                   {"gpus": [{"uuid": "G", "extra_wave_bytes": 1, "period_seconds": 0}]})
    assert "period_seconds: must be over 0" in (simulated.read(broken).reason or "")


# --- health -----------------------------------------------------------------------


def test_a_gpu_says_the_health_its_file_gives_and_a_field_left_out_is_unknown(
    tmp_path: Path, device: Device
) -> None:
    path = write(tmp_path / "gpus.json", {"gpus": [
        {"uuid": "GPU-hot", "memory_total_bytes": GiB, "health": {
            "temperature_celsius": 92, "power_draw_milliwatts": 700_000, "power_limit_milliwatts": 700_000,
            "clock_event_reasons": ["hw_slowdown", "hw_thermal_slowdown"], "remapped_rows_pending": True,
            "ecc_volatile_uncorrected_errors": 2,
            "xid_errors": [{"xid": 94, "count": 2, "last_seen_at": "2026-12-04T10:00:00Z"}, {"xid": 79}]}},
        {"uuid": "GPU-quiet", "memory_total_bytes": GiB},
    ]})

    document = snapshot(device.glob, gpu_backend="simulated", simulated_gpus_path=path)  # schema-checked

    hot, quiet = document["gpus"]
    assert "health" not in quiet  # no health in the file: the backend says nothing of it
    health = hot["health"]
    assert health["temperature_celsius"] == 92
    assert health["clock_event_reasons"] == ["hw_slowdown", "hw_thermal_slowdown"]
    assert (health["remapped_rows_pending"], health["remapped_rows_failed"]) == (True, None)
    assert (health["ecc_volatile_uncorrected_errors"], health["ecc_volatile_corrected_errors"]) == (2, None)
    first, second = health["xid_errors"]
    assert first == {"xid": 94, "count": 2, "last_seen_at": "2026-12-04T10:00:00Z"}
    assert (second["xid"], second["count"]) == (79, 1)
    assert second["last_seen_at"].endswith("Z")  # the time of reading


@pytest.mark.parametrize(("health", "error"), [
    ({"temperature_celsius": -1}, "temperature_celsius"),
    ({"temperature_celsius": 5000}, "temperature_celsius: at most 1000"),
    ({"remapped_rows_pending": 1}, "remapped_rows_pending"),
    ({"clock_event_reasons": ["Thermal!"]}, "clock_event_reasons"),
    ({"xid_errors": [{"xid": 79, "count": 0}]}, "xid_errors[0]"),
    ({"xid_errors": [{"xid": 79, "last_seen_at": "yesterday"}]}, "xid_errors[0]"),
    ({"fan_speed": 3}, "unknown fields ['fan_speed']"),
])
def test_bad_health_in_the_file_is_named_and_loses_the_gpu_half_only(
    tmp_path: Path, device: Device, health: dict[str, Any], error: str
) -> None:
    path = write(tmp_path / "gpus.json", {"gpus": [{"uuid": "GPU-a", "memory_total_bytes": GiB,
                                                    "health": health}]})

    document = snapshot(device.glob, gpu_backend="simulated", simulated_gpus_path=path)

    backend = document["gpu_backend"]
    assert backend["available"] is False
    assert f"gpus[0].health.{error}" in backend["reason"] or f"gpus[0].health: {error}" in backend["reason"]
