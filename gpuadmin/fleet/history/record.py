"""History written at ingest: what central keeps of past snapshots, proportional to what matters.

Raw samples say something new or nothing: a GPU's ``GpuSample`` is written when one
of its figures moved past its step since that GPU's last written sample (memory
used or attributed by more than ``GPUADMIN_HISTORY_PROCESS_STEP_BYTES``, the one
memory step of history; utilization, temperature and power draw by more than
``GPU_STEPS``' own; the power limit at all; any figure to or from zero or
unknown), or when that sample is ``GPUADMIN_HISTORY_RAW_SECONDS`` old (the
heartbeat, so charts and rollups still get points while nothing moves). A host's
``HostSample`` likewise (zombies, D state, pid_max at all; PIDs in use by more
than ``PIDS_STEP``). Full snapshots and updates decide alike (``sample_due``,
through ``decide_gpu_sample`` and ``decide_host_sample``), against the last
written figures kept on the ``Gpu`` and ``Host`` rows (``sampled_*``), which
both paths read and write with those rows anyway: no query of its own. A
sample holds until the next one; the rollups weigh it so (``retention.py``).

Per process that matters *by itself* (holds GPU memory or a device file, is a zombie, is in
D state, is an orphan) one ``ProcessLife`` for as long as it lives; ancestors
and descendants that are in the snapshot only for context get no row, and a
host with thousands of ordinary processes adds none at all.

A life's GPU memory and state are kept as ``ProcessPoint`` rows only when
they change: memory moved by more than ``GPUADMIN_HISTORY_PROCESS_STEP_BYTES``
or the state letter changed. A steady process costs one point; the life's own
``last_seen_at`` and ``last_*`` values end its series. Each life also counts
the snapshots in a row in which its memory rose (the "suspected leak" finding).

A steady life is not rewritten at all: while a life is open (no ``gone_at``),
every snapshot of its host shows it, so "last seen" is the host's newest
snapshot (``ProcessLife.latest_sighting_at``), and its stored ``last_seen_at``
is when it was last written (first seen, or last changed). The snapshot that
no longer shows a life sets ``gone_at`` and the exact ``last_seen_at``: the
host's snapshot before it.

How long all this is kept, and the 5-minute rollups, are ``retention.py``'s.

Everything is written in bulk: a snapshot costs a fixed handful of queries,
whatever the number of its processes (SQLite splits big inserts into batches
of its 999-parameter limit). All times here are the host's ``taken_at``, so a
host's samples and process lives line up with each other and with the ages the
probe measured.
"""

from __future__ import annotations

import hashlib
import heapq
import struct
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

import msgspec
from django.conf import settings

from gpuadmin.fleet.findings.rules import HistoryFacts, PidSample, Rising, zombies_grew
from gpuadmin.fleet.models import Gpu, GpuSample, Host, HostSample, ProcessLife, ProcessPoint
from gpuadmin.fleet.process_tree import ProcessRow
from gpuadmin.fleet.storage.statements import (
    Param,
    PendingRows,
    PreparedQuery,
    RowInsert,
    RowUpdate,
)
from gpuadmin.text import clip

LifeKey = tuple[str, int, int]  # boot id, pid, start time in ticks
# A life's stored or new values by column name (plain values: no model instance per process).
LifeValues = dict[str, Any]

# How far back the "PIDs running out" forecast looks.
PID_TREND_SECONDS = 3600
# Keeps each ``IN (...)`` list under SQLite's limit on bound parameters.
_PIDS_PER_QUERY = 5000

# What a snapshot says of a process beside its memory and state: written over a life's stored values,
# compared through their digest (description_digest).
_DESCRIPTION_FIELDS = ["ppid", "uid", "user", "name", "cmdline", "container_id", "owner"]
# The parent's name and user, from the parent's row in the same snapshot: written with a life that is
# written anyway, never compared (their change alone writes nothing), kept to name the launcher a
# process outlives (_launchers_exited).
_PARENT_FIELDS = ["parent_name", "parent_user"]
_PARENT_NAME_MAX_CHARS = ProcessLife._meta.get_field("parent_name").max_length or 256
# What an upsert writes over a stored life: all but first_seen_at, which only a new life sets (a life
# seen again after being marked gone keeps its first sighting).
_LIFE_UPDATE_FIELDS = [
    *_DESCRIPTION_FIELDS,
    *_PARENT_FIELDS,
    "description_digest",
    "last_seen_at",
    "gone_at",
    "last_state",
    "last_gpu_memory_bytes",
    "peak_gpu_memory_bytes",
    "held_device",
    "was_zombie",
    "was_orphaned",
    "point_gpu_memory_bytes",
    "point_state",
    "memory_rising_samples",
    "memory_rising_since",
    "memory_rising_from_bytes",
]

# What a life's upsert would change other than when it was last seen: its description by digest
# (_is_steady tells whether any of it changes).
_LIFE_COMPARED_FIELDS = [name for name in _LIFE_UPDATE_FIELDS
                         if name != "last_seen_at" and name not in (*_DESCRIPTION_FIELDS, *_PARENT_FIELDS)]
# What is read of a stored open life: its id and identity, and what a snapshot extends or compares.
# Not read: its description (the digest says whether it changed, so the two JSON columns of ~200
# lives need not be loaded), its last_seen_at and gone_at (the previous snapshot saw it).
_LIFE_KEY_COLUMNS = ["boot_id", "pid", "start_time_ticks"]  # a LifeKey's, in its order
_IDENTITY_COLUMNS = ["pk", *_LIFE_KEY_COLUMNS]
_OPEN_COLUMNS = [*_IDENTITY_COLUMNS, *_LIFE_COMPARED_FIELDS]
_GONE_COLUMNS = [*_IDENTITY_COLUMNS, *_LIFE_UPDATE_FIELDS]


# The host's open lives: read for every snapshot (_known_lives), its SQL written once, unordered (the
# model's ordering would sort them).
_OPEN_LIVES = PreparedQuery(
    ProcessLife.objects.filter(host=Param(ProcessLife, "host"), gone_at__isnull=True)
    .order_by()
    .values_list(*_OPEN_COLUMNS),
    binary=True,  # ~1,600 integers a snapshot
)

# The lives and points a snapshot writes (their SQL written once: RowInsert).
_LIFE_UPSERT = RowInsert(
    ProcessLife,
    ["host", "boot_id", "pid", "start_time_ticks", "first_seen_at", *_LIFE_UPDATE_FIELDS],
    conflict=["host", "boot_id", "pid", "start_time_ticks"],
    update=_LIFE_UPDATE_FIELDS,
    returning=["id"],
)
# A process's memory points: a full snapshot's and an update's (``updates``, deferred with its batch).
POINT_INSERT = RowInsert(ProcessPoint, ["life", "taken_at", "gpu_memory_bytes", "state"], deferrable=True)
# The samples every snapshot adds (their SQL written once: RowInsert), with these of a GPU's health
# (gpus[].health, absent from older agents' snapshots and null where the GPU cannot say).
_GPU_HEALTH_FIELDS = ["temperature_celsius", "power_draw_milliwatts", "power_limit_milliwatts"]
_GPU_SAMPLE = RowInsert(
    GpuSample, ["gpu", "taken_at", "memory_used_bytes", "memory_attributed_bytes", "utilization_percent",
                *_GPU_HEALTH_FIELDS], deferrable=True,
)
_HOST_SAMPLE = RowInsert(
    HostSample,
    ["host", "taken_at", "process_count", "zombie_count", "uninterruptible_count", "pids_in_use", "pid_max"],
    deferrable=True,
)
# A raw sample's figures that decide whether it is written (a GPU's in _GPU_SAMPLE's order, a host's in
# _HOST_SAMPLE's after process_count, which decides nothing), and the Gpu / Host columns keeping those of
# the last one written, with sampled_at.
Figures = tuple[int | None, ...]
GPU_SAMPLED_FIELDS = ["sampled_memory_used_bytes", "sampled_memory_attributed_bytes",
                      "sampled_utilization_percent", "sampled_temperature_celsius",
                      "sampled_power_draw_milliwatts", "sampled_power_limit_milliwatts"]
HOST_SAMPLED_FIELDS = ["sampled_zombie_count", "sampled_uninterruptible_count", "sampled_pids_in_use",
                       "sampled_pid_max"]
# Each figure's step, past which it is written again (0: any change). Memory's is
# GPUADMIN_HISTORY_PROCESS_STEP_BYTES (gpu_steps). Utilization swings of a few points are the noise of
# a busy GPU, not news; 10 points is a line a chart shows. Temperature and power draw: a step a chart
# shows, under the noise of a GPU under load. PIDs in use include threads, which come and go by dozens.
UTILIZATION_STEP_PERCENT = 10
TEMPERATURE_STEP_CELSIUS = 3
POWER_DRAW_STEP_MILLIWATTS = 25_000
PIDS_STEP = 100
HOST_STEPS = (0, 0, PIDS_STEP, 0)

# A GPU that started or stopped idling (update_idle_since): on a busy host, about as often as a job
# stalls on its data; compiled once, where bulk_update would build its CASE statement every time.
_SET_IDLE_SINCE = RowUpdate(Gpu, "id", ["idle_since"], deferrable=True)

# The host's samples of the last PID_TREND_SECONDS (findings_facts), compiled once; and the zombie
# count of the oldest of them alone.
_TREND_SAMPLES = HostSample.objects.filter(
    host=Param(HostSample, "host"),
    taken_at__gte=Param(HostSample, "taken_at", key="since"),
    taken_at__lte=Param(HostSample, "taken_at", key="until"),
).order_by("taken_at")
_PID_TREND = PreparedQuery(_TREND_SAMPLES.values_list("taken_at", "pids_in_use", "zombie_count"))
_PID_TREND_FIRST_ZOMBIES = PreparedQuery(_TREND_SAMPLES.values_list("zombie_count")[:1])


class GpuRow(Protocol):
    """What history reads of a GPU's row: ingest's ``ListedGpu`` or an update's ``_StoredGpu`` (no model
    instance); ``sampled_at`` and ``sampled``: its last written sample's moment and ``Figures``
    (``GPU_SAMPLED_FIELDS``), None before its first."""

    uuid: str
    idle_since: datetime | None
    sampled_at: datetime | None
    sampled: Figures | None

    @property
    def pk(self) -> Any: ...


def matters_by_itself(row: ProcessRow) -> bool:
    """A process worth a life of its own in history (not mere family of one)."""
    return row.holds_gpu or row.is_zombie or row.is_uninterruptible or row.orphaned


def mattering_rows(rows: Mapping[int, ProcessRow]) -> list[ProcessRow]:
    """The processes of a snapshot that are worth a life of their own, all of them (``matters_by_itself``)."""
    return [row for row in rows.values() if matters_by_itself(row)]


def _history_rank(row: ProcessRow) -> tuple[int, bool, int]:
    """Which processes keep their history when a snapshot has more than the cap: the biggest GPU-memory
    holders, then device holders, then the rest (zombies, D state, orphans); the oldest pid first."""
    return (-row.total_gpu_memory_bytes, not row.holds_gpu, row.pid)


def capped(mattering: list[ProcessRow]) -> list[ProcessRow]:
    """At most ``GPUADMIN_HISTORY_PROCESSES_PER_SNAPSHOT`` of them, by ``_history_rank``.

    One signed snapshot may list any number of made-up GPU holders (a compromised host, 15,000 of them):
    without a cap each would add a life and a point, every interval.
    """
    cap = settings.GPUADMIN_HISTORY_PROCESSES_PER_SNAPSHOT
    return mattering if len(mattering) <= cap else heapq.nsmallest(cap, mattering, key=_history_rank)


def sample_due(sampled_at: datetime | None, before: Figures | None, now: Figures, steps: Sequence[int], *,
               taken_at: datetime, heartbeat: timedelta) -> bool:
    """Whether a raw sample of ``now`` is written, after the last written one (``before``, at
    ``sampled_at``; None: none yet): it is ``heartbeat`` old (or from a later moment: a clock set
    back), or a figure moved by more than its step, or to or from zero or unknown (a GPU freed or
    going idle, a figure the GPU stopped reporting: always news, whatever the step)."""
    if sampled_at is None or before is None or not timedelta(0) <= taken_at - sampled_at < heartbeat:
        return True
    for old, new, step in zip(before, now, steps, strict=True):
        if old != new and (old is None or new is None or old == 0 or new == 0 or abs(new - old) > step):
            return True
    return False


def gpu_steps() -> tuple[int, ...]:
    """Each of a GPU's ``Figures``' step (``sample_due``)."""
    memory = settings.GPUADMIN_HISTORY_PROCESS_STEP_BYTES
    return (memory, memory, UTILIZATION_STEP_PERCENT, TEMPERATURE_STEP_CELSIUS, POWER_DRAW_STEP_MILLIWATTS, 0)


def raw_heartbeat() -> timedelta:
    """How old a last written raw sample may grow before the next snapshot writes one anyway."""
    return timedelta(seconds=settings.GPUADMIN_HISTORY_RAW_SECONDS)


def gpu_figures(g: Mapping[str, Any], attributed_bytes: int) -> Figures:
    """A GPU's ``Figures`` from a full snapshot's ``gpus[]`` entry and what its processes hold."""
    health = g.get("health")
    if health is None:
        return (g["memory_used_bytes"], attributed_bytes, g["utilization_percent"], None, None, None)
    return (g["memory_used_bytes"], attributed_bytes, g["utilization_percent"],
            *(health.get(name) for name in _GPU_HEALTH_FIELDS))


def decide_gpu_samples(gpus: Iterable[tuple[GpuRow, Figures]], *, taken_at: datetime) -> None:
    """For each GPU and its figures now: when a sample is due (``sample_due``), make them its last
    written (``sampled_at`` = ``taken_at``), for its row's write and ``record_samples``."""
    steps, heartbeat = gpu_steps(), raw_heartbeat()
    for gpu, figures in gpus:
        if sample_due(gpu.sampled_at, gpu.sampled, figures, steps, taken_at=taken_at, heartbeat=heartbeat):
            gpu.sampled_at, gpu.sampled = taken_at, figures


def decide_host_sample(host: Host, *, zombies: int, uninterruptible: int, pids_in_use: int, pid_max: int,
                       taken_at: datetime) -> None:
    """As ``decide_gpu_samples`` for the host: sets its ``sampled_*`` when a sample is due (the caller
    writes the row)."""
    now = (zombies, uninterruptible, pids_in_use, pid_max)
    before = (host.sampled_zombie_count, host.sampled_uninterruptible_count, host.sampled_pids_in_use,
              host.sampled_pid_max)
    if sample_due(host.sampled_at, before, now, HOST_STEPS, taken_at=taken_at, heartbeat=raw_heartbeat()):
        host.sampled_at = taken_at
        (host.sampled_zombie_count, host.sampled_uninterruptible_count, host.sampled_pids_in_use,
         host.sampled_pid_max) = now


def record_samples(host: Host, gpus: Iterable[GpuRow], *, process_count: int, taken_at: datetime) -> None:
    """The raw samples this snapshot (or update) writes: of the GPUs and the host whose last written
    sample ``decide_gpu_samples`` / ``decide_host_sample`` made this one."""
    _GPU_SAMPLE.run([(gpu.pk, taken_at, *gpu.sampled) for gpu in gpus
                     if gpu.sampled_at == taken_at and gpu.sampled is not None])
    if host.sampled_at == taken_at:
        _HOST_SAMPLE.run([(host.pk, taken_at, process_count, host.sampled_zombie_count,
                           host.sampled_uninterruptible_count, host.sampled_pids_in_use,
                           host.sampled_pid_max)])


def record_late_samples(host: Host, document: dict[str, Any], *, gpus_by_uuid: Mapping[str, Any],
                        attributed_bytes: Mapping[str, int], taken_at: datetime) -> None:
    """A late snapshot's samples (older than the host's newest), all of them: it fills a gap (one that
    came late because it was held up), and what it says is true of its moment; the rows' last written
    figures are the newest snapshot's business and stay."""
    _GPU_SAMPLE.run([
        (gpus_by_uuid[g["uuid"]].pk, taken_at, *gpu_figures(g, attributed_bytes.get(g["uuid"], 0)))
        for g in document["gpus"]
        if g["uuid"] in gpus_by_uuid
    ])
    counts = document["process_counts"]
    facts = document["host"]
    _HOST_SAMPLE.run([(host.pk, taken_at, counts["total"], counts["zombies"], counts["uninterruptible"],
                       facts["pids_in_use"], facts["pid_max"])])


def has_samples_at(host: Host, taken_at: datetime) -> bool:
    """Whether a snapshot taken at ``taken_at`` is already in this host's history (a redelivery)."""
    return HostSample.objects.filter(host=host, taken_at=taken_at).exists()


def record_process_lives(
    host: Host,
    rows: Mapping[int, ProcessRow],
    *,
    boot_id: str,
    taken_at: datetime,
    previous_taken_at: datetime | None,
    mattering: list[ProcessRow] | None = None,
) -> list[LifeValues]:
    """Start or extend the lives of the processes in this snapshot, end those it no longer shows.

    Must be called with the newest snapshot of the host only (``ingest`` makes
    sure): a life absent from it is over ("gone" means it exited or stopped
    mattering and left the snapshot), and lives of an earlier boot are all over.
    A life seen again after being marked gone is reopened, keeping its first
    sighting and its peak. Returns the lives this snapshot shows: each a dict of
    its values after it, with pid, start_time_ticks and the memory_rising_*
    values (a steady life's as read, without its description).

    ``previous_taken_at``: the host's snapshot before this one (None for its
    first), the last that showed every life still open: a life that ends now
    was last seen then.

    Stored lives are read as plain values (no model instances) and only the
    lives whose values changed, or that are new, are written; the others (most
    of them: a steady process) are not written at all.

    At most ``GPUADMIN_HISTORY_PROCESSES_PER_SNAPSHOT`` lives are kept open (``capped``): past it,
    an open life the cap leaves out ends as if its process had stopped mattering, and is reopened
    when it is among the kept again. ``mattering``: ``mattering_rows(rows)``, when the caller has it.
    """
    cap = settings.GPUADMIN_HISTORY_PROCESSES_PER_SNAPSHOT
    mattering = capped(mattering if mattering is not None else mattering_rows(rows))
    known = _known_lives(host, boot_id, mattering, start_reading_open_lives(host.pk))
    step = settings.GPUADMIN_HISTORY_PROCESS_STEP_BYTES  # read once, not once per process
    seen_before = previous_taken_at or taken_at
    lives: dict[LifeKey, LifeValues] = {}
    changed: dict[LifeKey, LifeValues] = {}
    newly_orphaned: list[tuple[LifeValues, ProcessRow]] = []  # stored lives this snapshot shows orphaned

    def extend(key: LifeKey, life: LifeValues | None, row: ProcessRow) -> None:
        digest = description_digest(row)
        if life is not None and _is_steady(life, row, digest, step):
            lives[key] = life  # as read: nothing of it changes (most lives, most snapshots)
        else:
            if life is not None and row.orphaned and not life["was_orphaned"]:
                newly_orphaned.append((life, row))
            lives[key] = changed[key] = _extended(life, row, digest=digest, taken_at=taken_at,
                                                  seen_before=seen_before, step=step,
                                                  parent=rows.get(row.ppid))

    for row in mattering:
        key = (boot_id, row.pid, row.start_time_ticks)
        extend(key, known.get(key), row)
    gone_ids: list[int] = []
    for key, life in known.items():
        if key in lives or life["gone_at"] is not None:
            continue
        current = rows.get(key[1]) if key[0] == boot_id else None
        if current is None or current.start_time_ticks != key[2] or len(lives) >= cap:
            gone_ids.append(life["pk"])
        else:
            # Still alive, no longer matters by itself (e.g. freed its memory): keep it current.
            extend(key, life, current)

    # Read before the upsert writes the new parent over the one the orphans lost.
    exited = _launchers_exited(newly_orphaned, taken_at=taken_at, seen_before=seen_before)
    if changed:
        ids = _write_changed(host, known, changed)
        _record_points(host, known, changed, ids, taken_at=taken_at)
    _update_in_chunks(gone_ids, gone_at=taken_at, last_seen_at=seen_before)
    for launcher, life_ids in exited:
        _update_in_chunks(life_ids, **launcher)
    return list(lives.values())


def _launchers_exited(
    newly_orphaned: Sequence[tuple[LifeValues, ProcessRow]], *, taken_at: datetime, seen_before: datetime
) -> list[tuple[LifeValues, list[int]]]:
    """The launchers this snapshot shows gone: for each life it shows orphaned for the first time whose
    parent changed, the parent it had (pid, name and user as last written) and between which snapshots
    that one went away, as ``launcher_*`` values, each with the ids of the lives it left behind.

    A process re-parented without being left behind (a daemon that double-forked: ``orphaned`` false)
    gets none. Stored parents are read only here, for these few lives (open lives are read without
    their description): a snapshot that orphans nothing reads nothing more.
    """
    if not newly_orphaned:
        return []
    open_ids = [life["pk"] for life, _ in newly_orphaned if "ppid" not in life]
    stored = {pk: (ppid, name, user) for pk, ppid, name, user in ProcessLife.objects.filter(
        pk__in=open_ids).values_list("pk", "ppid", *_PARENT_FIELDS)} if open_ids else {}
    exited: dict[tuple[tuple[str, Any], ...], list[int]] = defaultdict(list)
    for life, row in newly_orphaned:
        ppid, name, user = stored.get(life["pk"]) or (life["ppid"], life["parent_name"], life["parent_user"])
        if ppid in (row.ppid, 0):
            continue
        # A reopened life was last shown with its old parent when it was marked gone.
        after = life["last_seen_at"] if life["gone_at"] is not None else seen_before
        launcher = (("launcher_pid", ppid), ("launcher_name", name), ("launcher_user", user),
                    ("launcher_exited_after", after), ("launcher_exited_before", taken_at))
        exited[launcher].append(life["pk"])
    return [(dict(launcher), ids) for launcher, ids in exited.items()]


def _update_in_chunks(ids: list[int], **values: Any) -> None:
    for start in range(0, len(ids), _PIDS_PER_QUERY):
        ProcessLife.objects.filter(pk__in=ids[start : start + _PIDS_PER_QUERY]).update(**values)


def _write_changed(
    host: Host, known: Mapping[LifeKey, LifeValues], changed: Mapping[LifeKey, LifeValues]
) -> dict[LifeKey, int | None]:
    """Upsert the lives that are new or changed; their ids, where known."""
    returned = _LIFE_UPSERT.run(
        [(host.pk, key[0], life["pid"], life["start_time_ticks"], life["first_seen_at"],
          *(life[name] for name in _LIFE_UPDATE_FIELDS))
         for key, life in changed.items()],
        returning=not known.keys() >= changed.keys(),  # ids of new lives only: the rest were read
    )
    ids: dict[LifeKey, int | None] = {}
    for n, key in enumerate(changed):
        # The database's id when the upsert returned it; else the one read before, if any.
        before = known.get(key)
        ids[key] = returned[n][0] if returned else (before["pk"] if before else None)
    return ids


def _record_points(
    host: Host,
    known: Mapping[LifeKey, LifeValues],
    lives: Mapping[LifeKey, LifeValues],
    ids: dict[LifeKey, int | None],
    *,
    taken_at: datetime,
) -> None:
    """A point for each life whose memory or state changed enough since its newest point."""
    due = [key for key, life in lives.items() if _point_due(known.get(key), life)]
    if not due:
        return
    life_ids = {key: pk for key, pk in ids.items() if pk is not None}
    if any(key not in life_ids for key in due):
        # Databases that return no ids from an upsert: read them back, once.
        life_ids.update(_life_ids(host.pk, due))
    POINT_INSERT.run([
        (life_ids[key], taken_at, lives[key]["last_gpu_memory_bytes"], lives[key]["last_state"])
        for key in due
    ])


def _point_due(before: LifeValues | None, life: LifeValues) -> bool:
    """``life`` already carries the new point's values in point_*; ``before`` the stored ones."""
    if before is None or before["point_gpu_memory_bytes"] is None:
        return True
    return (before["point_gpu_memory_bytes"], before["point_state"]) != (
        life["point_gpu_memory_bytes"],
        life["point_state"],
    )


def _life_ids(host_id: int, keys: list[LifeKey]) -> dict[LifeKey, int]:
    wanted = set(keys)
    ids: dict[LifeKey, int] = {}
    pids = sorted({pid for _, pid, _ in keys})
    for start in range(0, len(pids), _PIDS_PER_QUERY):
        for pk, boot_id, pid, ticks in ProcessLife.objects.filter(
            host_id=host_id, pid__in=pids[start : start + _PIDS_PER_QUERY]
        ).values_list("pk", "boot_id", "pid", "start_time_ticks"):
            if (boot_id, pid, ticks) in wanted:
                ids[(boot_id, pid, ticks)] = pk
    return ids


def start_reading_open_lives(host_pk: int) -> PendingRows:
    """The host's open lives (any boot), as a snapshot compares them, asked for now
    (``PreparedQuery.start``)."""
    return _OPEN_LIVES.start(host=host_pk)


def _known_lives(
    host: Host, boot_id: str, mattering: Iterable[ProcessRow], open_lives: PendingRows
) -> dict[LifeKey, LifeValues]:
    """The host's open lives (``start_reading_open_lives``), then the gone lives of this boot that
    processes of this snapshot not among them may reopen, as the values ``_extended`` and
    ``_write_changed`` read (no model instances: a snapshot reads ~200).

    The second query runs only for processes without an open life (new ones, mostly none): a steady
    snapshot costs one query with no list of PIDs in it.
    """
    known: dict[LifeKey, LifeValues] = {}
    _add_lives(known, open_lives.rows(), _OPEN_COLUMNS)
    unmatched = sorted({row.pid for row in mattering
                        if (boot_id, row.pid, row.start_time_ticks) not in known})
    for start in range(0, len(unmatched), _PIDS_PER_QUERY):
        pids = unmatched[start : start + _PIDS_PER_QUERY]
        gone = ProcessLife.objects.filter(host=host, boot_id=boot_id, pid__in=pids, gone_at__isnull=False)
        _add_lives(known, list(gone.values_list(*_GONE_COLUMNS)), _GONE_COLUMNS)
    return known


def _add_lives(known: dict[LifeKey, LifeValues], rows: Sequence[tuple[Any, ...]], columns: list[str]) -> None:
    """Put ``rows`` (values of ``columns``, which begin with ``_IDENTITY_COLUMNS``) into ``known`` by
    identity, each life a dict of its values (its boot id among them)."""
    # The rows of one query are all as wide: the first says it for all. zip(strict=True) would check
    # each, and its keyword argument alone doubles the cost of each of ~200 dicts a snapshot.
    if rows and len(rows[0]) != len(columns):
        raise ValueError(f"{len(rows[0])} values for {len(columns)} columns")
    for values in rows:
        known[values[1 : 1 + len(_LIFE_KEY_COLUMNS)]] = dict(zip(columns, values))  # noqa: B905


def _is_steady(life: LifeValues, row: ProcessRow, digest: int, step: int) -> bool:
    """Whether this snapshot changes nothing of an open life but when it was seen: what ``_extended``
    would return equals the stored values (``_LIFE_COMPARED_FIELDS``). Its description (by digest),
    state and memory are as stored, no flag is newly set, and its newest point stays: then its peak
    and its count of rising snapshots stay too (memory neither rose nor fell).

    Most processes that matter are steady from one snapshot to the next (a training job's memory
    stays where its allocator put it): they are not written, and no dict is built for them
    (benchmarks/fleet.py). tests/fleet/history/test_record_steady.py holds this to ``_extended``."""
    return (
        life["gone_at"] is None
        and life["description_digest"] == digest
        and life["last_state"] == row.state
        and life["last_gpu_memory_bytes"] == row.total_gpu_memory_bytes
        and (life["held_device"] or not row.device_files)
        and (life["was_zombie"] or not row.is_zombie)
        and (life["was_orphaned"] or not row.orphaned)
        and _next_point(life, row.total_gpu_memory_bytes, row.state, step)
        == (life["point_gpu_memory_bytes"], life["point_state"])
    )


def _extended(
    life: LifeValues | None, row: ProcessRow, *, digest: int, taken_at: datetime, seen_before: datetime,
    step: int, parent: ProcessRow | None = None,
) -> LifeValues:
    """The life's values after this snapshot (``_LIFE_UPDATE_FIELDS``, pid, start_time_ticks, and
    first_seen_at for a new life); ``digest``: ``description_digest(row)``; ``seen_before``: when the
    previous snapshot showed it, if open; ``step``: GPUADMIN_HISTORY_PROCESS_STEP_BYTES; ``parent``:
    the snapshot's row of its parent, if it has one."""
    memory_bytes = row.total_gpu_memory_bytes
    point_memory, point_state = _next_point(life, memory_bytes, row.state, step)
    if life is not None and life["gone_at"] is not None:
        seen_before = life["last_seen_at"]  # reopened: last seen when it was marked gone
    rising, rising_since, rising_from = _rising(life, memory_bytes, seen_before)
    return {
        "pid": row.pid,
        "start_time_ticks": row.start_time_ticks,
        "ppid": row.ppid,
        "uid": row.uid,
        "user": row.user or "",
        "name": row.name,
        "cmdline": list(row.cmdline),
        "container_id": row.container_id or "",
        "owner": row.owner,
        "parent_name": clip(parent.command_line, _PARENT_NAME_MAX_CHARS) if parent is not None else "",
        "parent_user": (parent.user or "") if parent is not None else "",
        "description_digest": digest,
        "first_seen_at": taken_at,  # written for a new life only (_LIFE_UPDATE_FIELDS)
        "last_seen_at": taken_at,
        "gone_at": None,
        "last_state": row.state,
        "last_gpu_memory_bytes": memory_bytes,
        "peak_gpu_memory_bytes": max(memory_bytes, life["peak_gpu_memory_bytes"] if life else 0),
        "held_device": (life is not None and life["held_device"]) or bool(row.device_files),
        "was_zombie": (life is not None and life["was_zombie"]) or row.is_zombie,
        "was_orphaned": (life is not None and life["was_orphaned"]) or row.orphaned,
        "point_gpu_memory_bytes": point_memory,
        "point_state": point_state,
        "memory_rising_samples": rising,
        "memory_rising_since": rising_since,
        "memory_rising_from_bytes": rising_from,
    }


_encode_description = msgspec.json.Encoder().encode
# An empty 8-byte BLAKE2b, copied for each description: a copy costs half of making one anew (whose
# keyword argument is parsed every time), and ingest digests ~200 descriptions a snapshot.
_EMPTY_DIGEST = hashlib.blake2b(digest_size=8)
_SIGNED_BIG_ENDIAN_64 = struct.Struct(">q").unpack


def description_digest(row: ProcessRow) -> int:
    """A 64-bit digest of what ``_DESCRIPTION_FIELDS`` store of ``row`` (a bigint column): equal for an
    unchanged description. Owner keys in another order give another digest, and one rewrite. Stored
    digests are compared with new ones: its value must never change (tests/fleet/history/test_record.py)."""
    text = _encode_description(
        (row.ppid, row.uid, row.user or "", row.name, row.cmdline, row.container_id or "", row.owner)
    )
    digest = _EMPTY_DIGEST.copy()
    digest.update(text)
    return int(_SIGNED_BIG_ENDIAN_64(digest.digest())[0])


def _next_point(life: LifeValues | None, memory_bytes: int, state: str, step: int) -> tuple[int, str]:
    """The values of the life's newest point after this snapshot: new ones only on a real change."""
    if life is None or life["point_gpu_memory_bytes"] is None:
        return memory_bytes, state
    point_memory: int = life["point_gpu_memory_bytes"]
    moved = abs(memory_bytes - point_memory) > step
    # Memory freed entirely is always a change: the chart must come back down to zero.
    freed = memory_bytes == 0 and point_memory != 0
    if moved or freed or state != life["point_state"]:
        return memory_bytes, state
    return point_memory, life["point_state"]


def _rising(
    life: LifeValues | None, memory_bytes: int, seen_before: datetime
) -> tuple[int, datetime | None, int]:
    """(snapshots in a row with a rise, since when, from how much). Unchanged memory keeps the count:
    allocators grow in steps; any fall starts it again. ``seen_before``: when the life last showed
    its stored memory."""
    if life is None:
        return 0, None, memory_bytes
    before = life["last_gpu_memory_bytes"]
    if memory_bytes > before:
        if life["memory_rising_samples"] == 0:
            return 1, seen_before, before
        samples: int = life["memory_rising_samples"]
        return samples + 1, life["memory_rising_since"], life["memory_rising_from_bytes"]
    if memory_bytes < before:
        return 0, None, memory_bytes
    return life["memory_rising_samples"], life["memory_rising_since"], life["memory_rising_from_bytes"]


def update_idle_since(
    gpus_by_uuid: Mapping[str, GpuRow], document: dict[str, Any], attributed_bytes: Mapping[str, int], *,
    taken_at: datetime,
) -> None:
    """Keep each GPU's ``idle_since``: set when visible processes hold memory on it at 0% utilization,
    kept while that lasts, cleared as soon as it computes again or nothing is held."""
    changed = []
    for g in document["gpus"]:
        gpu = gpus_by_uuid.get(g["uuid"])
        if gpu is None:
            continue
        idle = g["utilization_percent"] == 0 and attributed_bytes.get(g["uuid"], 0) > 0
        wanted = (gpu.idle_since or taken_at) if idle else None
        if wanted != gpu.idle_since:
            gpu.idle_since = wanted
            changed.append(gpu)
    _SET_IDLE_SINCE.run([(gpu.pk, gpu.idle_since) for gpu in changed])


def _zombies_grew_since_oldest(window: dict[str, Any], zombies: int) -> bool:
    """``findings.zombies_grew`` from the window's oldest host sample to ``zombies`` (no sample: no)."""
    oldest = _PID_TREND_FIRST_ZOMBIES.rows(**window)
    return bool(oldest) and zombies_grew(oldest[0][0], zombies)


def findings_facts(
    host: Host,
    lives: Iterable[LifeValues],
    gpus: Iterable[GpuRow],
    *,
    taken_at: datetime,
    zombies: int | None = None,
) -> HistoryFacts:
    """What the history-based findings need beside the snapshot: the PID trend, when it can matter.

    ``zombies``: the snapshot's zombie count, when known (its host sample is
    stored already). The trend (an hour of samples, 360 rows at a 10 s
    interval) serves only "PIDs running out", which needs more zombies now
    than at the start of the window (``findings.zombies_grew``): none now,
    nothing read; no more than the window's oldest sample shows (a host with
    the same few zombies for hours, the usual case), that one count read.
    """
    trend: Iterable[tuple[datetime, int, int]] = ()
    window = {"host": host.pk, "since": taken_at - timedelta(seconds=PID_TREND_SECONDS), "until": taken_at}
    if zombies is None or (zombies > 0 and _zombies_grew_since_oldest(window, zombies)):
        trend = _PID_TREND.rows(**window)
    return HistoryFacts(
        taken_at=taken_at,
        rising={
            (life["pid"], life["start_time_ticks"]): Rising(
                life["memory_rising_samples"], life["memory_rising_since"], life["memory_rising_from_bytes"]
            )
            for life in lives
            if life["memory_rising_samples"]
        },
        idle_since={gpu.uuid: gpu.idle_since for gpu in gpus if gpu.idle_since is not None},
        pid_trend=tuple(PidSample(t, pids, zombies) for t, pids, zombies in trend),
    )
