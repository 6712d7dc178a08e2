"""How much GPU memory a kill gave back, from two snapshots (pure functions).

A target's memory counts as released on a GPU when a later snapshot shows the
process gone *and* the GPU's unattributed memory did not grow by as much: if
the driver has not freed it yet (or never will), that memory stays "used"
with no visible process to account for it. Comparing unattributed memory,
rather than used memory, keeps a new job that started meanwhile from hiding
the release.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuadmin.fleet.process_tree import attributed_memory_bytes, process_rows


def identity(pid: int, start_time_ticks: int) -> str:
    return f"{pid}:{start_time_ticks}"


def _unattributed(document: dict[str, Any]) -> dict[str, int | None]:
    attributed = attributed_memory_bytes(process_rows(document))
    result: dict[str, int | None] = {}
    for gpu in document.get("gpus", ()):
        used = gpu.get("memory_used_bytes")
        result[gpu["uuid"]] = None if used is None else max(0, used - attributed.get(gpu["uuid"], 0))
    return result


def baseline(document: dict[str, Any], targets: Iterable[tuple[int, int]]) -> dict:
    """What the targets (pid, start_time_ticks) hold in ``document``, per GPU, and
    each GPU's unattributed memory there.

    A target already gone from ``document`` holds nothing: whatever it gave back
    (or left stuck) is already in that snapshot's figures.
    """
    rows = process_rows(document)
    held: dict[str, dict[str, int]] = {}
    for pid, start in targets:
        row = rows.get(pid)
        memory = row.gpu_memory_bytes if row and row.start_time_ticks == start else {}
        held[identity(pid, start)] = {uuid: used for uuid, used in memory.items() if used}
    return {
        "taken_at": document.get("taken_at"),
        "boot_id": document.get("host", {}).get("boot_id", ""),
        "unattributed_bytes": _unattributed(document),
        "targets": held,
    }


def expected_bytes(base: dict) -> int:
    return sum(sum(per_gpu.values()) for per_gpu in base.get("targets", {}).values())


@dataclass(frozen=True)
class Release:
    expected_bytes: int
    released_bytes: int
    # Per GPU uuid: {"expected_bytes", "released_bytes", "unattributed_growth_bytes"}.
    per_gpu: dict[str, dict[str, int]]
    # Identities ("pid:start") still holding GPU memory in the later snapshot.
    still_holding: list[str]

    @property
    def complete(self) -> bool:
        return self.released_bytes >= self.expected_bytes


def release(base: dict, later: dict[str, Any]) -> Release:
    rows = process_rows(later)
    rebooted = later.get("host", {}).get("boot_id") != base.get("boot_id")
    expected_per_gpu: dict[str, int] = {}
    freed_per_gpu: dict[str, int] = {}
    still_holding: list[str] = []
    for ident, held_per_gpu in base.get("targets", {}).items():
        pid, start = (int(part) for part in ident.split(":"))
        row = None if rebooted else rows.get(pid)
        alive = row is not None and row.start_time_ticks == start
        for uuid, used in held_per_gpu.items():
            expected_per_gpu[uuid] = expected_per_gpu.get(uuid, 0) + used
            still = alive and row is not None and bool(row.gpu_memory_bytes.get(uuid))
            if still:
                if ident not in still_holding:
                    still_holding.append(ident)
            else:
                freed_per_gpu[uuid] = freed_per_gpu.get(uuid, 0) + used
    before = base.get("unattributed_bytes", {})
    now = _unattributed(later)
    per_gpu: dict[str, dict[str, int]] = {}
    for uuid, expected in expected_per_gpu.items():
        freed = freed_per_gpu.get(uuid, 0)
        # With no used-memory reading to check against, trust the process list.
        unknown = before.get(uuid) is None or now.get(uuid) is None
        growth = 0 if unknown else max(0, now[uuid] - before[uuid])
        per_gpu[uuid] = {
            "expected_bytes": expected,
            "released_bytes": max(0, freed - growth),
            "unattributed_growth_bytes": growth,
        }
    return Release(
        expected_bytes=sum(expected_per_gpu.values()),
        released_bytes=sum(g["released_bytes"] for g in per_gpu.values()),
        per_gpu=per_gpu,
        still_holding=still_holding,
    )
