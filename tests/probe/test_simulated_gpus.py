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
