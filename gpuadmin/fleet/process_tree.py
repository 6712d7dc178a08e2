"""Read a snapshot document (already validated) as the rows and trees the
findings, pages and API show. Pure functions over the document: no database.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import msgspec
from msgspec.structs import force_setattr

from gpuadmin.probe.owners import (
    CONTAINER,
    KIND_FIELDS,
    KUBERNETES_POD,
    LOGIN_SESSION,
    SLURM_JOB,
    SYSTEM_SERVICE,
    USER_SERVICE,
    WORKLOAD_KINDS,
)
from gpuadmin.wire.snapshot_update import aged, decode_update, seconds_between

ZOMBIE = "Z"
UNINTERRUPTIBLE = "D"
# Docker's and crictl's short form of a container id.
SHORT_ID_CHARS = 12


class ProcessRow(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One process record of a snapshot (docs/snapshot.md), as the findings, pages and history read it.

    A msgspec Struct, made from the record by msgspec in C (``process_rows``), since ingest makes
    ~200 per snapshot. Not tracked by the garbage collector: a row refers to no row. A record lacking an
    optional field gets the default; unknown fields are left out.
    """

    pid: int
    ppid: int
    state: str
    start_time_ticks: int
    uid: int | None = None
    user: str | None = None
    name: str = ""
    cmdline: tuple[str, ...] = ()
    cmdline_truncated: bool = False
    rss_bytes: int | None = None
    pgid: int | None = None
    sid: int | None = None
    container_id: str | None = None
    elapsed_seconds: float | None = None
    orphaned: bool = False
    kernel_thread: bool = False
    reasons: tuple[str, ...] = ()
    gpu_memory_bytes: dict[str, int | None] = {}
    device_files: tuple[str, ...] = ()
    # Schema version 2 (gpuadmin/probe/owners.py); None in version 1 and when no owner was recognised.
    owner: dict[str, Any] | None = None
    # The executable (/proc/<pid>/exe) as the probe read it; None when unknown or from an older agent.
    exe: str | None = None
    # The process's GPU memory over all its GPUs (memory_total_bytes), worked out once when the row is
    # made (never taken from the record): ingest asks about four times per process.
    total_gpu_memory_bytes: int = 0

    def __post_init__(self) -> None:
        # Most processes hold no GPU memory: their total stays the default 0, without a call.
        if self.gpu_memory_bytes or self.total_gpu_memory_bytes:
            force_setattr(self, "total_gpu_memory_bytes", memory_total_bytes(self.gpu_memory_bytes))

    @classmethod
    def from_document(cls, record: dict[str, Any]) -> ProcessRow:
        """The row of one process record; raises ``msgspec.ValidationError`` for a record of the wrong
        shape (a validated snapshot has none)."""
        return msgspec.convert(record, cls)

    @property
    def command_line(self) -> str:
        """The command line as one string, for display (the template escapes it)."""
        return " ".join(self.cmdline) if self.cmdline else f"[{self.name}]"

    @property
    def owner_label(self) -> str:
        """The owner in a few words ("job 4242.0", "docker trainer", "pod ml/bert-0"); "" when none."""
        return owner_label(self.owner)

    @property
    def owner_details(self) -> str:
        """Every field of the owner that is known, for a tooltip."""
        if not self.owner:
            return ""
        # In the probe's order: a PostgreSQL jsonb column gives the keys back in its own.
        keys = ("kind", *KIND_FIELDS.get(self.owner.get("kind", ""), sorted(set(self.owner) - {"kind"})))
        return ", ".join(f"{key} {self.owner[key]}" for key in keys if self.owner.get(key) is not None)

    @property
    def workload(self) -> Workload | None:
        """The Slurm job, container or pod this process runs in (None for units, sessions, no owner)."""
        return workload_of(self.owner)

    @property
    def holds_gpu(self) -> bool:
        return bool(self.gpu_memory_bytes) or bool(self.device_files)

    @property
    def is_zombie(self) -> bool:
        return self.state == ZOMBIE

    @property
    def is_uninterruptible(self) -> bool:
        return self.state == UNINTERRUPTIBLE


def owner_label(owner: dict[str, Any] | None) -> str:
    """A snapshot's owner block in a few words."""
    if not owner:
        return ""
    label = _OWNER_LABELS.get(owner.get("kind", ""))
    return label(owner) if label else str(owner.get("kind"))


def _container_label(owner: dict[str, Any]) -> str:
    name = owner.get("container_name") or (owner.get("container_id") or "")[:SHORT_ID_CHARS]
    return f"{owner.get('runtime') or 'container'} {name}".strip()


def _pod_label(owner: dict[str, Any]) -> str:
    if owner.get("pod_name"):
        names = (owner.get("namespace"), owner["pod_name"], owner.get("container_name"))
        return "pod " + "/".join(str(name) for name in names if name)
    short_id = (owner.get("container_id") or "")[:SHORT_ID_CHARS]
    return f"pod {(owner.get('pod_uid') or '')[:8]}" + (f" ctr {short_id}" if short_id else "")


_OWNER_LABELS: dict[str, Callable[[dict[str, Any]], str]] = {
    SLURM_JOB: lambda o: f"job {o.get('job_id')}" + (f".{o['step']}" if o.get("step") else ""),
    CONTAINER: _container_label,
    KUBERNETES_POD: _pod_label,
    LOGIN_SESSION: lambda o: f"session {o.get('session_id')}",
    USER_SERVICE: lambda o: f"user unit {o.get('unit')}",
    SYSTEM_SERVICE: lambda o: f"unit {o.get('unit')}",
}


@dataclass(frozen=True)
class Workload:
    """What an admin acts on as one: a Slurm job (all its steps), a container, a Kubernetes pod.

    ``key`` names it on one host ("slurm_job:4242", "container:<64 hex>", "kubernetes_pod:<uid>"):
    the host page's filter and grouping and a kill request for "every process of" it use it.
    """

    kind: str
    id: str
    label: str

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.id}"


# The owner field that names each workload kind (a job's steps are one job).
_WORKLOAD_ID_FIELDS = {SLURM_JOB: "job_id", CONTAINER: "container_id", KUBERNETES_POD: "pod_uid"}
assert set(_WORKLOAD_ID_FIELDS) == set(WORKLOAD_KINDS)


def workload_of(owner: dict[str, Any] | None) -> Workload | None:
    """The workload of an owner block; None when it names none (or lacks the field that would)."""
    if not owner or owner.get("kind") not in _WORKLOAD_ID_FIELDS:
        return None
    kind = owner["kind"]
    workload_id = owner.get(_WORKLOAD_ID_FIELDS[kind])
    if not workload_id:
        return None
    if kind == SLURM_JOB:
        label = f"job {workload_id}"
    elif kind == KUBERNETES_POD:
        # The pod, not one of its containers: a pod's containers are acted on together.
        label = _pod_label({**owner, "container_name": None, "container_id": None})
    else:
        label = _container_label(owner)
    return Workload(kind=kind, id=str(workload_id), label=label)


def parse_workload_key(key: str) -> tuple[str, str] | None:
    """(kind, id) of a key made by ``Workload.key``; None for anything else."""
    kind, _, workload_id = key.partition(":")
    if kind not in _WORKLOAD_ID_FIELDS or not workload_id:
        return None
    return kind, workload_id


def workload_members(rows: dict[int, ProcessRow], key: str) -> list[ProcessRow]:
    """Every process of the snapshot in the workload ``key``, by pid."""
    return sorted(
        (r for r in rows.values() if r.workload is not None and r.workload.key == key), key=lambda r: r.pid
    )


@dataclass(frozen=True)
class ZombieTree:
    """A parent and the defunct children only it can reap."""

    parent_pid: int
    parent: ProcessRow | None  # None when the parent is not in the snapshot
    zombies: tuple[ProcessRow, ...]


def process_rows(document: dict[str, Any]) -> dict[int, ProcessRow]:
    """The document's processes by pid (``ProcessRow.from_document``, all in one call)."""
    return {row.pid: row for row in msgspec.convert(document.get("processes", ()), list[ProcessRow])}


class _DocumentRows(msgspec.Struct, gc=False):
    """What ``current_process_rows`` reads of a stored document: the rest of its text is skipped."""

    taken_at: str
    processes: list[ProcessRow] = []


_DOCUMENT_ROWS = msgspec.json.Decoder(_DocumentRows)


def current_process_rows(document_text: str, update_text: str | None) -> dict[int, ProcessRow]:
    """``process_rows`` of a stored snapshot's text with its latest update's (``LatestSnapshot``) laid
    over it as ``wire.snapshot_update.overlay`` lays it: the same rows, made by msgspec straight from
    the texts, without the document's thousands of dicts (fair use reads every host's each minute).
    ValueError for a text that is not a stored document's or update's."""
    document = _DOCUMENT_ROWS.decode(document_text)
    rows = document.processes
    if update_text is not None:
        update = decode_update(update_text)
        age = seconds_between(document.taken_at, update.taken_at)
        moved = {(p.pid, p.start_time_ticks): p.gpu_memory_bytes for p in update.processes}
        rows = [_overlaid(row, moved.get((row.pid, row.start_time_ticks)), age) for row in rows]
    return {row.pid: row for row in rows}


def _overlaid(row: ProcessRow, memory: dict[str, int | None] | None, age: float) -> ProcessRow:
    if memory is None and row.elapsed_seconds is None:
        return row
    changes: dict[str, Any] = {}
    if memory is not None:
        changes["gpu_memory_bytes"] = dict(memory)
    if row.elapsed_seconds is not None:
        changes["elapsed_seconds"] = aged(row.elapsed_seconds, age)
    return msgspec.structs.replace(row, **changes)  # __post_init__ works its total out again


def gpu_holders(rows: dict[int, ProcessRow]) -> list[ProcessRow]:
    """Processes holding GPU memory or a device file, biggest holder first."""
    holders = [r for r in rows.values() if r.holds_gpu]
    return sorted(holders, key=lambda r: (-r.total_gpu_memory_bytes, r.pid))


def zombie_trees(rows: dict[int, ProcessRow]) -> list[ZombieTree]:
    """Zombies grouped under their parent, the parent with the most zombies first."""
    by_parent: dict[int, list[ProcessRow]] = defaultdict(list)
    for row in rows.values():
        if row.is_zombie:
            by_parent[row.ppid].append(row)
    trees = [
        ZombieTree(parent_pid=ppid, parent=rows.get(ppid), zombies=tuple(sorted(z, key=lambda r: r.pid)))
        for ppid, z in by_parent.items()
    ]
    return sorted(trees, key=lambda t: (-len(t.zombies), t.parent_pid))


def orphans(rows: dict[int, ProcessRow]) -> list[ProcessRow]:
    """Orphans that still hold GPU memory or a device file (see docs/snapshot.md, `orphaned`)."""
    return sorted((r for r in rows.values() if r.orphaned and r.holds_gpu), key=lambda r: r.pid)


def attributed_memory_bytes(rows: dict[int, ProcessRow]) -> dict[str, int]:
    """Per GPU uuid: the memory the visible processes account for."""
    return memory_by_gpu(map(_GPU_MEMORY, rows.values()))


_GPU_MEMORY = attrgetter("gpu_memory_bytes")


def memory_total_bytes(gpu_memory_bytes: Mapping[str, int | None]) -> int:
    """One process's GPU memory over all its GPUs (a snapshot's ``gpu_memory_bytes``; null counts 0)."""
    return sum(filter(None, gpu_memory_bytes.values()))  # filter, not a generator: half the time


def memory_by_gpu(gpu_memory: Iterable[Mapping[str, int | None]]) -> dict[str, int]:
    """Per GPU uuid, the memory of several processes' ``gpu_memory_bytes`` added up (null counts 0)."""
    per_gpu: dict[str, int] = defaultdict(int)
    for memory in filter(None, gpu_memory):  # most processes hold none: skipped in C
        for uuid, used in memory.items():
            per_gpu[uuid] += used or 0
    return dict(per_gpu)
