"""The demo's simulated GPU memory: each demo process *claims* memory on a GPU, the driver turns the
claims of live processes into the simulated GPU file (``gpuadmin/probe/gpus/simulated.py``).

A claim is ``<scenario dir>/claims/<pid>.json``, written by the process itself,
so memory follows the process: a process that ends (killed through the panel,
or by Ctrl+C) stops holding memory at the driver's next pass. No Django here.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from gpuadmin.data_dir import data_dir
from gpuadmin.wire.files import write_file

MiB = 1024**2
GiB = 1024**3
SCENARIO_FOLDER = "scenario"  # in the data directory: claims, checkpoints, the synthetic hosts' keys
CLAIMS_FOLDER = "claims"
GPU_FILE = "simulated-gpus.json"


def scenario_dir() -> Path:
    return data_dir() / SCENARIO_FOLDER


def claims_dir() -> Path:
    return scenario_dir() / CLAIMS_FOLDER


def gpu_file() -> Path:
    return scenario_dir() / GPU_FILE


LEAK_LIMIT_BYTES = 30 * GiB  # a leak stops growing here, so the GPU never overflows


def write_claim(gpu_uuid: str, used_memory_bytes: int, *, leak_bytes_per_second: int = 0) -> None:
    """This process holds ``used_memory_bytes`` on the GPU (plus a steady leak from now on).

    No waves on processes: memory that rises for minutes would be taken for a leak.
    """
    claim = {"pid": os.getpid(), "gpu_uuid": gpu_uuid, "used_memory_bytes": used_memory_bytes,
             "leak_bytes_per_second": leak_bytes_per_second, "since": time.time()}
    write_file(claims_dir() / f"{os.getpid()}.json", json.dumps(claim), sync=False)


def _alive(pid: int) -> bool:
    """Alive and not a zombie: a dead process's memory is freed."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def live_claims(now: float) -> list[dict[str, Any]]:
    """The simulated file's process entries for every live claimant; dead claimants' files are removed."""
    entries = []
    for path in sorted(claims_dir().glob("*.json")):
        try:
            claim = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not _alive(int(claim["pid"])):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        leaked = int(claim.get("leak_bytes_per_second", 0) * max(0.0, now - claim.get("since", now)))
        entries.append({"pid": claim["pid"], "gpu_uuid": claim["gpu_uuid"],
                        "used_memory_bytes": claim["used_memory_bytes"] + min(leaked, LEAK_LIMIT_BYTES)})
    return entries


def write_gpu_file(gpus: list[dict[str, Any]], now: float | None = None) -> None:
    """The simulated GPU file: these GPUs, the memory of every live claim."""
    now = time.time() if now is None else now
    # The probe reads it every few seconds: whole, never half (not worth an fsync).
    write_file(gpu_file(), json.dumps({"gpus": gpus, "processes": live_claims(now)}, indent=1), sync=False)


def prepare() -> None:
    """A fresh claims folder: claims of a previous run name processes that are gone (or reused PIDs)."""
    claims_dir().mkdir(parents=True, exist_ok=True, mode=0o700)
    for stale in claims_dir().glob("*.json"):
        stale.unlink()
