"""Simulated GPUs from a JSON file, re-read at every snapshot (tests, the demo,
machines without a GPU):

    {"gpus": [{"uuid", "name", "memory_total_bytes", "extra_used_bytes", "utilization_percent"}],
     "processes": [{"pid", "gpu_uuid", "used_memory_bytes"}]}

A GPU's index is its place in the list. Its used memory is the sum of every
listed process on it, PIDs unknown to /proc included, plus extra_used_bytes
(memory no process accounts for, as a stuck driver would show).

Values can move over time, so that charts have something to show (the demo of
``make run``): a process's ``wave_bytes``, a GPU's ``extra_wave_bytes`` and
``utilization_wave_percent`` add a smooth rise and fall of that amplitude,
``(1 - cos(2 pi t / period_seconds)) / 2`` of it at Unix time t, the item's
``period_seconds`` defaulting to 600.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

from gpuadmin.probe.gpus import Gpu, GpuProcess, GpuState, unavailable

BACKEND = "simulated"
DEFAULT_PERIOD_SECONDS = 600


class SimulatedFileError(ValueError):
    pass


def read(path: str | None, *, clock: Callable[[], float] = time.time) -> GpuState:
    if not path:
        return unavailable(
            BACKEND, "no simulated GPU file configured (set GPUADMIN_SIMULATED_GPUS or --simulated-gpus)"
        )
    try:
        with open(path, "rb") as f:
            document = json.loads(f.read())
        gpus, processes = _parse(document, clock())
    except OSError as exc:
        return unavailable(BACKEND, f"simulated GPU file {path}: {exc.strerror or exc}")
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError and SimulatedFileError are ValueErrors
        return unavailable(BACKEND, f"simulated GPU file {path}: {exc}"[:1024])
    return GpuState(backend=BACKEND, available=True, gpus=gpus, processes=processes)


def _wave(item: dict[str, Any], key: str, where: str, now: float) -> int:
    """The item's wave of amplitude ``key`` at time ``now`` (0 without one)."""
    amplitude: int = _int(item, key, where, default=0)
    if not amplitude:
        return 0
    period: int = _int(item, "period_seconds", where, default=DEFAULT_PERIOD_SECONDS)
    if period == 0:
        raise SimulatedFileError(f"{where}.period_seconds: must be over 0")
    return round(amplitude * (1 - math.cos(2 * math.pi * now / period)) / 2)


def _parse(document: Any, now: float = 0.0) -> tuple[tuple[Gpu, ...], tuple[GpuProcess, ...]]:
    if not isinstance(document, dict):
        raise SimulatedFileError("expected a JSON object with 'gpus' and 'processes'")
    raw_gpus = _list(document, "gpus", "")
    raw_processes = _list(document, "processes", "") if "processes" in document else []

    processes: list[GpuProcess] = []
    for i, item in enumerate(raw_processes):
        where = f"processes[{i}]"
        _object(item, where)
        used = _int(item, "used_memory_bytes", where, nullable=True)
        processes.append(GpuProcess(
            pid=_int(item, "pid", where),
            gpu_uuid=_str(item, "gpu_uuid", where),
            used_memory_bytes=None if used is None else used + _wave(item, "wave_bytes", where, now),
        ))

    gpus: list[Gpu] = []
    seen: set[str] = set()
    for index, item in enumerate(raw_gpus):
        where = f"gpus[{index}]"
        _object(item, where)
        uuid = _str(item, "uuid", where)
        if uuid in seen:
            raise SimulatedFileError(f"{where}.uuid: {uuid!r} appears twice")
        seen.add(uuid)
        extra = _int(item, "extra_used_bytes", where, default=0) + _wave(item, "extra_wave_bytes", where, now)
        utilization = _int(item, "utilization_percent", where, nullable=True, default=None)
        if utilization is not None and utilization > 100:
            raise SimulatedFileError(f"{where}.utilization_percent: must be 0..100, got {utilization}")
        if utilization is not None:
            utilization = min(100, utilization + _wave(item, "utilization_wave_percent", where, now))
        held = sum(p.used_memory_bytes or 0 for p in processes if p.gpu_uuid == uuid)
        gpus.append(Gpu(
            index=index,
            uuid=uuid,
            name=_str(item, "name", where, default="Simulated GPU"),
            memory_total_bytes=_int(item, "memory_total_bytes", where, nullable=True),
            memory_used_bytes=held + (extra or 0),
            utilization_percent=utilization,
        ))
    for i, p in enumerate(processes):
        if p.gpu_uuid not in seen:
            raise SimulatedFileError(f"processes[{i}].gpu_uuid: no GPU with uuid {p.gpu_uuid!r}")
    return tuple(gpus), tuple(processes)


GiB = 1024**3


def demo_document(holder_pid: int) -> dict[str, Any]:
    """Two GPUs whose memory and utilization rise and fall (``make run`` with the simulated backend):
    ``holder_pid`` holds a breathing share of GPU 0; GPU 1 has memory no process accounts for."""
    return {
        "gpus": [
            {"uuid": "GPU-demo-0", "name": "Simulated H100", "memory_total_bytes": 80 * GiB,
             "extra_used_bytes": 0, "utilization_percent": 20, "utilization_wave_percent": 70,
             "period_seconds": 900},
            {"uuid": "GPU-demo-1", "name": "Simulated H100", "memory_total_bytes": 80 * GiB,
             "extra_used_bytes": 2 * GiB, "extra_wave_bytes": 6 * GiB, "utilization_percent": 0,
             "utilization_wave_percent": 40, "period_seconds": 1800},
        ],
        "processes": [
            {"pid": holder_pid, "gpu_uuid": "GPU-demo-0", "used_memory_bytes": 8 * GiB,
             "wave_bytes": 24 * GiB, "period_seconds": 600},
        ],
    }


_MISSING = object()


def _object(item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise SimulatedFileError(f"{where}: expected an object")


def _list(item: dict[str, Any], key: str, where: str) -> list[Any]:
    value = item.get(key, _MISSING)
    if not isinstance(value, list):
        raise SimulatedFileError(f"{where}{key}: expected a list")
    return value


def _int(item: dict[str, Any], key: str, where: str, *, nullable: bool = False,
         default: Any = _MISSING) -> Any:
    value = item.get(key, default)
    if value is _MISSING:
        raise SimulatedFileError(f"{where}.{key}: missing")
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SimulatedFileError(f"{where}.{key}: expected a non-negative integer, got {value!r}")
    return value


def _str(item: dict[str, Any], key: str, where: str, *, default: Any = _MISSING) -> str:
    value = item.get(key, default)
    if value is _MISSING:
        raise SimulatedFileError(f"{where}.{key}: missing")
    if not isinstance(value, str) or not value or len(value) > 128:
        raise SimulatedFileError(f"{where}.{key}: expected a string of 1 to 128 characters, got {value!r}")
    return value
