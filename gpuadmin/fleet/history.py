"""History: what central keeps of past snapshots, proportional to what matters.

Per snapshot: one ``GpuSample`` per GPU and one ``HostSample``. Per process
that matters *by itself* (holds GPU memory or a device file, is a zombie, is in
D state, is an orphan) one ``ProcessLife`` for as long as it lives; ancestors
and descendants that are in the snapshot only for context get no row, and a
host with thousands of ordinary processes adds none at all.

Everything is written in bulk: a snapshot costs a fixed handful of queries,
whatever the number of its processes (SQLite splits big inserts into batches
of its 999-parameter limit). All times here are the host's ``taken_at``, so a
host's samples and process lives line up with each other and with the ages the
probe measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db.models import Q

from gpuadmin.fleet.models import Gpu, GpuSample, Host, HostSample, ProcessLife
from gpuadmin.fleet.process_tree import ProcessRow

LifeKey = tuple[str, int, int]  # boot id, pid, start time in ticks

# Keeps each ``IN (...)`` list under SQLite's limit on bound parameters.
_PIDS_PER_QUERY = 5000

_LIFE_UPDATE_FIELDS = [
    "ppid",
    "uid",
    "user",
    "name",
    "cmdline",
    "container_id",
    "owner",
    "first_seen_at",
    "last_seen_at",
    "gone_at",
    "last_state",
    "last_gpu_memory_bytes",
    "peak_gpu_memory_bytes",
    "held_device",
    "was_zombie",
    "was_orphaned",
]


def matters_by_itself(row: ProcessRow) -> bool:
    """A process worth a life of its own in history (not mere family of one)."""
    return row.holds_gpu or row.is_zombie or row.is_uninterruptible or row.orphaned


def record_samples(
    host: Host,
    document: dict[str, Any],
    *,
    gpus_by_uuid: Mapping[str, Gpu],
    attributed_bytes: Mapping[str, int],
    taken_at: datetime,
) -> None:
    """One sample per GPU of the snapshot that has a row in ``gpus_by_uuid``, and one for the host."""
    GpuSample.objects.bulk_create(
        GpuSample(
            gpu=gpus_by_uuid[g["uuid"]],
            taken_at=taken_at,
            memory_used_bytes=g["memory_used_bytes"],
            memory_attributed_bytes=attributed_bytes.get(g["uuid"], 0),
            utilization_percent=g["utilization_percent"],
        )
        for g in document["gpus"]
        if g["uuid"] in gpus_by_uuid
    )
    counts = document["process_counts"]
    HostSample.objects.create(
        host=host,
        taken_at=taken_at,
        process_count=counts["total"],
        zombie_count=counts["zombies"],
        uninterruptible_count=counts["uninterruptible"],
        pids_in_use=document["host"]["pids_in_use"],
        pid_max=document["host"]["pid_max"],
    )


def has_samples_at(host: Host, taken_at: datetime) -> bool:
    """Whether a snapshot taken at ``taken_at`` is already in this host's history (a redelivery)."""
    return HostSample.objects.filter(host=host, taken_at=taken_at).exists()


def record_process_lives(
    host: Host, rows: Mapping[int, ProcessRow], *, boot_id: str, taken_at: datetime
) -> None:
    """Start or extend the lives of the processes in this snapshot, end those it no longer shows.

    Must be called with the newest snapshot of the host only (``ingest`` makes
    sure): a life absent from it is over ("gone" means it exited or stopped
    mattering and left the snapshot), and lives of an earlier boot are all over.
    A life seen again after being marked gone is reopened, keeping its first
    sighting and its peak.
    """
    mattering = [row for row in rows.values() if matters_by_itself(row)]
    known = _known_lives(host, boot_id, (row.pid for row in mattering))
    in_snapshot: dict[LifeKey, ProcessRow] = {(boot_id, r.pid, r.start_time_ticks): r for r in rows.values()}

    lives: dict[LifeKey, ProcessLife] = {}
    for row in mattering:
        key = (boot_id, row.pid, row.start_time_ticks)
        lives[key] = _extended(known.get(key), row, host=host, boot_id=boot_id, taken_at=taken_at)
    gone_ids = []
    for key, life in known.items():
        if key in lives or life.gone_at is not None:
            continue
        row = in_snapshot.get(key)
        if row is None:
            gone_ids.append(life.pk)
        else:
            # Still alive, no longer matters by itself (e.g. freed its memory): keep it current.
            lives[key] = _extended(life, row, host=host, boot_id=boot_id, taken_at=taken_at)

    if lives:
        ProcessLife.objects.bulk_create(
            lives.values(),
            update_conflicts=True,
            unique_fields=["host", "boot_id", "pid", "start_time_ticks"],
            update_fields=_LIFE_UPDATE_FIELDS,
        )
    for start in range(0, len(gone_ids), _PIDS_PER_QUERY):
        ProcessLife.objects.filter(pk__in=gone_ids[start : start + _PIDS_PER_QUERY]).update(gone_at=taken_at)


def _known_lives(host: Host, boot_id: str, pids: Iterable[int]) -> dict[LifeKey, ProcessLife]:
    """The host's open lives (any boot), and this boot's lives, open or gone, of ``pids``."""
    pid_list = sorted(set(pids))
    chunks = [pid_list[i : i + _PIDS_PER_QUERY] for i in range(0, len(pid_list), _PIDS_PER_QUERY)] or [[]]
    known: dict[LifeKey, ProcessLife] = {}
    for chunk in chunks:
        query = Q(gone_at__isnull=True)
        if chunk:
            query |= Q(boot_id=boot_id, pid__in=chunk)
        for life in ProcessLife.objects.filter(query, host=host):
            known[(life.boot_id, life.pid, life.start_time_ticks)] = life
    return known


def _extended(
    life: ProcessLife | None,
    row: ProcessRow,
    *,
    host: Host,
    boot_id: str,
    taken_at: datetime,
) -> ProcessLife:
    """A fresh (pk-less) instance with the life's merged values, for the upsert."""
    memory_bytes = row.total_gpu_memory_bytes
    return ProcessLife(
        host=host,
        boot_id=boot_id,
        pid=row.pid,
        start_time_ticks=row.start_time_ticks,
        ppid=row.ppid,
        uid=row.uid,
        user=row.user or "",
        name=row.name,
        cmdline=list(row.cmdline),
        container_id=row.container_id or "",
        owner=row.owner,
        first_seen_at=life.first_seen_at if life else taken_at,
        last_seen_at=taken_at,
        gone_at=None,
        last_state=row.state,
        last_gpu_memory_bytes=memory_bytes,
        peak_gpu_memory_bytes=max(memory_bytes, life.peak_gpu_memory_bytes if life else 0),
        held_device=(life is not None and life.held_device) or bool(row.device_files),
        was_zombie=(life is not None and life.was_zombie) or row.is_zombie,
        was_orphaned=(life is not None and life.was_orphaned) or row.orphaned,
    )
