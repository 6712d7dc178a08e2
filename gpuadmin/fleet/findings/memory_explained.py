"""Each GPU's memory explained: what NVML says is used, against what the snapshot can account for,
and for every part nobody frees, its likely cause and the remedy (a pure function of the document).

The numbers compared, per GPU:

- ``used``: NVML's used memory (``gpus[].memory_used_bytes``);
- ``by visible processes``: the sum of the processes' ``gpu_memory_bytes`` this host's /proc shows;
- ``by PIDs outside /proc``: the sum of ``unmatched_gpu_processes`` (processes of another PID
  namespace: a container);
- ``by no process``: what is left, used minus both (never below 0: the readings are moments apart).

The gaps: memory that is held but will not be released by itself —

- orphans of a dead launcher (a kill request frees it);
- a process whose main thread exited while its other threads run on (``leader_exited``): it looks
  like a zombie but holds its memory; a kill ends every thread;
- a process in D state: no signal acts until its kernel call returns; the probe says where it
  waits (``wchan``, ``kernel_stack``);
- PIDs outside /proc: a container's processes, named by the owner data of the container processes
  the host sees holding the GPU's device files without memory;
- memory held by no process at all, above ``GPUADMIN_UNATTRIBUTED_THRESHOLD_BYTES``: driver-held
  (a stuck context), which only a GPU reset, a driver reload or a reboot frees; the processes that
  hold the GPU's device files without memory are named, as they may be what holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuadmin.fleet.findings.rules import hidden_container_suspects, workload_list
from gpuadmin.fleet.process_tree import ProcessRow, attributed_memory_bytes, orphans
from gpuadmin.text import human_bytes

_PIDS_SHOWN_MAX = 5
_FRAMES_SHOWN_MAX = 3


@dataclass(frozen=True)
class Gap:
    """One part of a GPU's memory nobody will free by themselves."""

    cause: str  # orphans | leader_exited | uninterruptible | other_namespace | no_process
    memory_bytes: int
    pids: tuple[int, ...]
    seen: str  # what was seen, with its numbers
    remedy: str


@dataclass(frozen=True)
class MemoryExplained:
    gpu_uuid: str
    gpu_index: int
    used_bytes: int
    visible_bytes: int
    other_namespace_bytes: int
    no_process_bytes: int
    gaps: tuple[Gap, ...]

    @property
    def compared(self) -> str:
        """The numbers compared, in one line."""
        parts = [f"{human_bytes(self.used_bytes)} used",
                 f"{human_bytes(self.visible_bytes)} by visible processes"]
        if self.other_namespace_bytes:
            parts.append(f"{human_bytes(self.other_namespace_bytes)} by PIDs outside /proc")
        parts.append(f"{human_bytes(self.no_process_bytes)} by no process")
        return ", ".join(parts)


def memory_explained(document: dict[str, Any], rows: dict[int, ProcessRow], *, threshold_bytes: int
                     ) -> dict[str, MemoryExplained]:
    """GPU uuid -> its memory explained, for each GPU whose used memory NVML knows."""
    visible = attributed_memory_bytes(rows)
    records = {r["pid"]: r for r in document.get("processes", ()) if r.get("leader_exited") or "wchan" in r
               or r.get("state") == "D"}
    orphan_rows = orphans(rows)
    explained: dict[str, MemoryExplained] = {}
    for gpu in document.get("gpus", ()):
        used, uuid, index = gpu["memory_used_bytes"], gpu["uuid"], gpu["index"]
        if used is None:
            continue
        unmatched = [e for e in document.get("unmatched_gpu_processes", ()) if e["gpu_uuid"] == uuid]
        other_bytes = sum(e["used_memory_bytes"] or 0 for e in unmatched)
        no_process_bytes = max(0, used - visible.get(uuid, 0) - other_bytes)
        gaps = [
            *_orphans(orphan_rows, uuid),
            *_stuck(rows, records, uuid),
            *_other_namespace(unmatched, other_bytes, rows, index),
        ]
        if no_process_bytes > threshold_bytes:
            gaps.append(_no_process(no_process_bytes, rows, index, has_unmatched=bool(unmatched)))
        explained[uuid] = MemoryExplained(uuid, index, used, visible.get(uuid, 0), other_bytes,
                                          no_process_bytes, tuple(gaps))
    return explained


def _on(row: ProcessRow, uuid: str) -> int:
    return row.gpu_memory_bytes.get(uuid) or 0


def _pids(pids: list[int]) -> str:
    shown = ", ".join(map(str, pids[:_PIDS_SHOWN_MAX]))
    return shown + (f" and {len(pids) - _PIDS_SHOWN_MAX} more" if len(pids) > _PIDS_SHOWN_MAX else "")


def _orphans(orphan_rows: list[ProcessRow], uuid: str) -> list[Gap]:
    holding = [r for r in orphan_rows if _on(r, uuid)]
    if not holding:
        return []
    held = sum(_on(r, uuid) for r in holding)
    pids = sorted(r.pid for r in holding)
    return [Gap("orphans", held, tuple(pids),
                f"{human_bytes(held)} held by orphans of a dead launcher (pid {_pids(pids)})",
                "They free nothing until they exit: file a kill request for them "
                "(the orphans finding has one).")]


def _stuck(rows: dict[int, ProcessRow], records: dict[int, dict[str, Any]], uuid: str) -> list[Gap]:
    gaps = []
    for pid in sorted(records):
        row, record = rows.get(pid), records[pid]
        held = _on(row, uuid) if row is not None else 0
        if not held:
            continue
        if record.get("state") == "D":
            waits = record.get("wchan")
            frames = record.get("kernel_stack") or []
            where = f"waiting in {waits}" if waits else "waiting in the kernel (wchan not readable)"
            if frames:
                where += f" ({' < '.join(frames[:_FRAMES_SHOWN_MAX])})"
            gaps.append(Gap("uninterruptible", held, (pid,),
                            f"{human_bytes(held)} held by pid {pid} in D state, {where}",
                            "No signal acts until that kernel call returns: fix what it waits on (storage, "
                            "NFS, the GPU driver: dmesg), else reboot the host."))
        elif record.get("leader_exited"):
            gaps.append(Gap("leader_exited", held, (pid,),
                            f"{human_bytes(held)} held by pid {pid}, whose main thread exited while its "
                            "other threads run on (it looks like a zombie, and is none)",
                            "Kill the process: its threads end with it and free the memory (a kill request "
                            "works; waiting for a parent to reap it does not)."))
    return gaps


def _other_namespace(unmatched: list[dict[str, Any]], held: int, rows: dict[int, ProcessRow], index: int
                     ) -> list[Gap]:
    if not unmatched:
        return []
    pids = sorted(e["pid"] for e in unmatched)
    suspects = hidden_container_suspects(rows, index)
    if suspects:
        remedy = (f"Most likely {workload_list(suspects)}, whose processes hold the GPU's device files "
                  "with no memory shown: stop or kill the job there (the driver lists its processes under "
                  "the container's own PIDs).")
    else:
        remedy = ("Find the container (another PID namespace) that runs them (docker top, crictl ps); "
                  "an agent that cannot read other users' open files cannot name it.")
    seen = f"{human_bytes(held)} held by PID {_pids(pids)}, which this host's /proc does not show"
    return [Gap("other_namespace", held, tuple(pids), seen, remedy)]


def _no_process(held: int, rows: dict[int, ProcessRow], index: int, *, has_unmatched: bool) -> Gap:
    own = f"/dev/nvidia{index}"
    holders = sorted(r.pid for r in rows.values() if own in r.device_files and not r.total_gpu_memory_bytes)
    suspects = [] if has_unmatched else hidden_container_suspects(rows, index)
    seen = f"{human_bytes(held)} held by no process the GPU lists"
    if holders:
        seen += f"; pid {_pids(holders)} hold {own} with no memory shown"
    if suspects:
        remedy = (f"Most likely {workload_list(suspects)} (their processes hold the device files with no "
                  "memory shown: the driver lists them under the container's own PIDs); else driver-held: "
                  f"reset the GPU when idle (nvidia-smi -r -i {index}) or reboot.")
    else:
        remedy = (f"Driver-held (a context no process owns any more): reset the GPU when it is idle "
                  f"(nvidia-smi -r -i {index}), reload nvidia_uvm, or reboot; dmesg for NVRM/Xid.")
    return Gap("no_process", held, tuple(holders), seen, remedy)
