"""Valid snapshot documents for tests that do not need a real probe.

Build one with ``snapshot()`` and ``proc()``; tests that exercise the probe
itself use real processes instead (tests/probe).
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

GiB = 1024**3
BOOT_ID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def gpu(index: int = 0, *, uuid: str | None = None, total: int = 80 * GiB, used: int = 0,
        utilization_percent: int | None = 0, name: str = "Simulated H100") -> dict[str, Any]:
    return {
        "index": index,
        "uuid": uuid or f"GPU-sim-{index:04d}",
        "name": name,
        "memory_total_bytes": total,
        "memory_used_bytes": used,
        "utilization_percent": utilization_percent,
    }


def proc(pid: int, *, ppid: int = 1, state: str = "S", start: int | None = None, uid: int = 1000,
         user: str = "alice", name: str = "python", cmdline: list[str] | None = None,
         gpu_memory: dict[str, int | None] | None = None, device_files: list[str] | None = None,
         orphaned: bool = False, reasons: list[str] | None = None, pgid: int | None = None,
         sid: int | None = None, elapsed_seconds: float = 60.0, **extra: Any) -> dict[str, Any]:
    argv = cmdline if cmdline is not None else [name, f"job{pid}.py"]
    record = {
        "pid": pid,
        "ppid": ppid,
        "state": state,
        "start_time_ticks": start if start is not None else pid * 100,
        "uid": uid,
        "user": user,
        "name": name,
        "cmdline": argv,
        "cmdline_truncated": False,
        "cmdline_sha256": hashlib.sha256(b"".join(a.encode() + b"\0" for a in argv)).hexdigest(),
        "rss_bytes": 100 * 1024**2,
        "pgid": pgid if pgid is not None else pid,
        "sid": sid if sid is not None else pid,
        "container_id": None,
        "owner": None,
        "elapsed_seconds": elapsed_seconds,
        "kernel_thread": False,
        "orphaned": orphaned,
        "reasons": reasons or [],
        "gpu_memory_bytes": gpu_memory or {},
        "device_files": device_files or [],
    }
    record.update(extra)
    return record


def snapshot(host: str = "gpu01", *, processes: list[dict[str, Any]] | None = None,
             gpus: list[dict[str, Any]] | None = None, taken_at: datetime | None = None,
             boot_id: str = BOOT_ID, pid_max: int = 4194304, pids_in_use: int | None = None,
             backend: str = "simulated", available: bool = True, reason: str | None = None,
             unmatched: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    processes = processes if processes is not None else []
    taken = (taken_at or datetime.now(UTC)).astimezone(UTC)
    return {
        "schema_version": 2,
        "taken_at": taken.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "probe_duration_seconds": 0.01,
        "scope": "matters",
        "device_glob": "/dev/nvidia*",
        "host": {
            "name": host,
            "boot_id": boot_id,
            "pid_max": pid_max,
            "pids_in_use": pids_in_use if pids_in_use is not None else len(processes) + 100,
            "kernel": "6.18.0-test",
            "driver_version": None,
            "boot_time": "2026-12-01T00:00:00Z",
            "clock_ticks_per_second": 100,
            "agent_pid": 4242,
        },
        "gpu_backend": {"name": backend, "available": available, "reason": reason},
        "gpus": gpus if gpus is not None else [gpu(0)],
        "processes": processes,
        "process_counts": {
            "total": len(processes) + 100,
            "zombies": sum(1 for p in processes if p["state"] == "Z"),
            "uninterruptible": sum(1 for p in processes if p["state"] == "D"),
            "omitted": 100,
        },
        "unmatched_gpu_processes": unmatched or [],
    }


def snapshot_json(*args: Any, **kwargs: Any) -> str:
    return json.dumps(snapshot(*args, **kwargs))


def slurm_owner(job_id: str = "4242", step: str = "0", uid: int | None = 1000) -> dict[str, Any]:
    """The owner block of a Slurm job step's process (docs/snapshot.md, `owner`)."""
    return {"kind": "slurm_job", "job_id": job_id, "step": step, "uid": uid}


def container_owner(container_id: str, name: str | None = "trainer", runtime: str = "docker",
                    image: str | None = "pytorch/pytorch:2.3") -> dict[str, Any]:
    """The owner block of a container's process; pass it with ``container_id=`` to ``proc``."""
    return {"kind": "container", "runtime": runtime, "container_id": container_id,
            "container_name": name, "image": image}
