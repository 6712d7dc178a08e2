"""Simulated GPUs from a JSON file, re-read at every snapshot (tests, the demo,
machines without a GPU):

    {"gpus": [{"uuid", "name", "memory_total_bytes", "extra_used_bytes", "utilization_percent"}],
     "processes": [{"pid", "gpu_uuid", "used_memory_bytes"}]}

A GPU's index is its place in the list. Its used memory is the sum of every
listed process on it, PIDs unknown to /proc included, plus extra_used_bytes
(memory no process accounts for, as a stuck driver would show).

Each process gets its own utilisation on its GPU, as NVML's per-process samples
give it (``processes[].gpu_utilization_percent``): its ``utilization_percent``
when the file says it, else the GPU's utilisation shared equally among the
GPU's processes that say none (what the others leave). A GPU without a
utilisation gives none, nor does a process whose ``utilization_percent`` is
null (a GPU that has no sample of it).

Values can move over time, so that charts have something to show (the demo of
``make run``): a process's ``wave_bytes``, a GPU's ``extra_wave_bytes`` and
``utilization_wave_percent`` add a smooth rise and fall of that amplitude,
``(1 - cos(2 pi t / period_seconds)) / 2`` of it at Unix time t, the item's
``period_seconds`` defaulting to 600.

A GPU reset (an approved reset order, gpuadmin/probe/kill/reset.py) reads what
a GPU says of itself: ``device``, a file that stands for its /dev/nvidia<minor>
(processes holding it open hold the GPU), ``persistence_mode`` (true/false),
``virtualization`` ("none", or "passthrough" for a VM's GPU), ``mig_instances``
(a count) and ``reset_refused`` (the text the driver answers instead of
resetting). A reset that goes through removes the GPU's processes from the
file and sets its extra used memory to 0.

A GPU may say how healthy it is: ``health``, an object with any of the
snapshot's health fields (docs/snapshot.md), written as the snapshot writes
them (``{"temperature_celsius": 91, "clock_event_reasons":
["hw_thermal_slowdown"], "remapped_rows_pending": true, "xid_errors":
[{"xid": 79, "count": 1}]}``); a field left out is unknown (null). An XID's
``last_seen_at`` defaults to the time of reading. Without ``health`` the GPU
says nothing of it, as a backend that cannot.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuadmin.probe.gpus import (
    MAX_TEMPERATURE_CELSIUS,
    Gpu,
    GpuHealth,
    GpuProcess,
    GpuResetFailed,
    GpuState,
    ProcessUtilization,
    ResetFacts,
    XidError,
    unavailable,
)
from gpuadmin.wire.files import write_file
from gpuadmin.wire.timestamps import wire_time

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
        utilization = _process_utilization(document, gpus, processes)
    except OSError as exc:
        return unavailable(BACKEND, f"simulated GPU file {path}: {exc.strerror or exc}")
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError and SimulatedFileError are ValueErrors
        return unavailable(BACKEND, f"simulated GPU file {path}: {exc}"[:1024])
    return GpuState(backend=BACKEND, available=True, gpus=gpus, processes=processes,
                    process_utilization=utilization)


def _process_utilization(document: dict[str, Any], gpus: tuple[Gpu, ...], processes: tuple[GpuProcess, ...]
                         ) -> tuple[ProcessUtilization, ...]:
    """Each listed process's own utilisation on its GPU (the module's docstring says how)."""
    given: dict[int, int | None] = {}
    for i, item in enumerate(document.get("processes") or ()):
        if "utilization_percent" in item:
            percent = _int(item, "utilization_percent", f"processes[{i}]", nullable=True)
            if percent is not None and percent > 100:
                raise SimulatedFileError(f"processes[{i}].utilization_percent: must be 0..100, got {percent}")
            given[i] = percent
    figures: list[ProcessUtilization] = []
    for gpu in gpus:
        if gpu.utilization_percent is None:
            continue
        on_it = [(i, p) for i, p in enumerate(processes) if p.gpu_uuid == gpu.uuid]
        said = sum(percent for i, _ in on_it if (percent := given.get(i)) is not None)
        shared = [p for i, p in on_it if i not in given]
        share = max(0, gpu.utilization_percent - said) // len(shared) if shared else 0
        for i, p in on_it:
            percent = given.get(i, share)
            if percent is not None:
                figures.append(ProcessUtilization(p.pid, gpu.uuid, percent))
    return tuple(figures)


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
            health=_health(item["health"], f"{where}.health", now) if "health" in item else None,
        ))
    for i, p in enumerate(processes):
        if p.gpu_uuid not in seen:
            raise SimulatedFileError(f"processes[{i}].gpu_uuid: no GPU with uuid {p.gpu_uuid!r}")
    return tuple(gpus), tuple(processes)


def _load_for_reset(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        document = json.loads(f.read())
    _parse(document)  # the same rules as a snapshot's reading; SimulatedFileError otherwise
    return document  # type: ignore[no-any-return]


def _gpu_item(document: dict[str, Any], uuid: str) -> tuple[int, dict[str, Any]] | None:
    return next(((index, item) for index, item in enumerate(document["gpus"]) if item["uuid"] == uuid), None)


def reset_facts(path: str, uuid: str) -> ResetFacts | None:
    """What the simulated GPU ``uuid`` says of itself before a reset; None when there is none.

    Raises OSError or SimulatedFileError when the file cannot be read.
    """
    found = _gpu_item(_load_for_reset(path), uuid)
    if found is None:
        return None
    index, item = found
    device = item.get("device")
    persistence = item.get("persistence_mode")
    mig = item.get("mig_instances")
    virtualization = item.get("virtualization", "none")
    return ResetFacts(
        uuid=uuid, index=index,
        device_path=device if isinstance(device, str) and device else None,
        mig_instances=mig if isinstance(mig, int) and not isinstance(mig, bool) else None,
        persistence_mode=persistence if isinstance(persistence, bool) else None,
        virtualization=virtualization if isinstance(virtualization, str) else None,
    )


def reset(path: str, uuid: str) -> None:
    """Reset the simulated GPU: its processes and extra used memory are gone from the file.

    Raises GpuResetFailed with the GPU's ``reset_refused`` text, as a driver that says no.
    """
    document = _load_for_reset(path)
    found = _gpu_item(document, uuid)
    if found is None:
        raise GpuResetFailed(f"no GPU with uuid {uuid!r} in {path}")
    _index, item = found
    if item.get("reset_refused"):
        raise GpuResetFailed(str(item["reset_refused"])[:1024])
    item["extra_used_bytes"] = 0
    item.pop("extra_wave_bytes", None)
    document["processes"] = [p for p in document.get("processes", []) if p.get("gpu_uuid") != uuid]
    mode = os.stat(path).st_mode & 0o777
    write_file(Path(path), json.dumps(document, indent=1), mode=mode)


_HEALTH_FLAGS = ("remapped_rows_pending", "remapped_rows_failed", "retired_pages_pending")
_HEALTH_COUNTS = tuple(name for name in GpuHealth.__slots__
                       if name not in {"clock_event_reasons", "xid_errors", *_HEALTH_FLAGS})
_REASON_NAME = re.compile(r"[a-z0-9_]{1,40}")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z")


def _health(item: Any, where: str, now: float) -> GpuHealth:
    _object(item, where)
    unknown = item.keys() - set(GpuHealth.__slots__)
    if unknown:
        raise SimulatedFileError(f"{where}: unknown fields {sorted(unknown)}")
    values: dict[str, Any] = {name: _int(item, name, where, nullable=True, default=None)
                              for name in _HEALTH_COUNTS}
    for name in _HEALTH_FLAGS:
        flag = item.get(name)
        if flag is not None and not isinstance(flag, bool):
            raise SimulatedFileError(f"{where}.{name}: expected true, false or null, got {flag!r}")
        values[name] = flag
    if (values["temperature_celsius"] or 0) > MAX_TEMPERATURE_CELSIUS:
        raise SimulatedFileError(f"{where}.temperature_celsius: at most {MAX_TEMPERATURE_CELSIUS}")
    reasons = item.get("clock_event_reasons")
    if reasons is not None:
        if not isinstance(reasons, list) or not all(isinstance(r, str) and _REASON_NAME.fullmatch(r)
                                                    for r in reasons):
            raise SimulatedFileError(f"{where}.clock_event_reasons: expected a list of reason names")
        reasons = tuple(reasons)
    values["clock_event_reasons"] = reasons
    xids = item.get("xid_errors")
    if xids is not None:
        if not isinstance(xids, list):
            raise SimulatedFileError(f"{where}.xid_errors: expected a list")
        xids = tuple(_xid(entry, f"{where}.xid_errors[{i}]", now) for i, entry in enumerate(xids))
    values["xid_errors"] = xids
    return GpuHealth(**values)


def _xid(item: Any, where: str, now: float) -> XidError:
    _object(item, where)
    count = _int(item, "count", where, default=1)
    seen = item.get("last_seen_at", wire_time(now, timespec="seconds"))
    if count < 1 or not isinstance(seen, str) or not _TIME.fullmatch(seen):
        raise SimulatedFileError(f"{where}: expected a count of 1 or more and a UTC last_seen_at ending in Z")
    xid = _int(item, "xid", where)
    if xid > 0xFFFFFFFF:
        raise SimulatedFileError(f"{where}.xid: at most 4294967295")
    return XidError(xid=xid, count=count, last_seen_at=seen)


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
