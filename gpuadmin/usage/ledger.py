"""The usage ledger written at ingest: each snapshot adds the time since the host's previous one.

Rules (the usage page and docs/api.md say them to people):

- A process *holds* a device while its memory there is above ``GPUADMIN_USAGE_HELD_BYTES``. A MIG
  instance is a device of its own (``gpus[].mig_instances``; a process's share of it from
  ``processes[].mig_instances``), with its own name as its model.
- The time between two snapshots of a host is attributed to what the *earlier* one showed: a process
  first seen in a snapshot starts counting there, one gone from a snapshot counted until it. A gap
  longer than ``GAP_CAP_INTERVALS`` probe intervals (an agent down, a host off) counts only up to that
  cap: nobody is charged for hours nobody saw.
- *Busy*: measured where the snapshot gives the process's own utilisation on the device
  (``processes[].gpu_utilization_percent``, NVML's ``nvmlDeviceGetProcessUtilization``): that
  percentage of the interval. Otherwise *estimated*: the device's utilisation less what its measured
  holders used (never below 0), shared equally among its holders without a figure; with none measured,
  the device's utilisation shared among all its holders. ``busy_estimated_milliseconds`` is the
  estimated part of ``busy_milliseconds``. A process's own figure counts only on a device that gave
  a utilisation of its own (a MIG instance gives neither).
  *Idle*: held while the device said 0 %. A device that gave no utilisation (a MIG instance, whose
  utilisation NVML does not report) counts as *unmeasured*, neither busy nor idle.
- Days are UTC days; an interval across midnight is split there.
- A snapshot update (``gpuadmin.wire.snapshot_update``, sent between full snapshots) counts like a
  snapshot for time, utilisation and memory; who holds what changes only at a full snapshot. An
  update carries no per-process utilisation: a holder keeps its last measured figure until the next
  full snapshot.

How it stays cheap (benchmarks/README.md): every holder of a device gets the same share of each
interval, so the host's ``UsageCursor`` keeps running totals per *device* (and one clock for the
host), and each holder only the totals it joined at; its figures are the difference. A holder with a
measured figure (few: only where NVML gives one) keeps its own busy counter in its device's entry,
with the estimated shares that went past it while measured, to take from the difference. A snapshot
whose holders are the ones before (most of them) rewrites the device totals and the holders'
memory, a few hundred bytes; an update finds the holders whose memory moved in the holders' *index*
(their identities alone: a tenth of the list's bytes); the holders' list is read and rewritten only
when one comes or goes, and when the cursor is *settled*: written to ``LifeUsage`` and ``UsageDay``,
at most every ``GPUADMIN_USAGE_FLUSH_SECONDS`` and at each UTC midnight.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import msgspec
from django.conf import settings
from django.db import transaction

from gpuadmin.fleet.models import Host
from gpuadmin.fleet.process_tree import ProcessRow, owner_label
from gpuadmin.fleet.signals import UpdateStoring
from gpuadmin.fleet.storage.statements import AnyOf, Param, PreparedQuery, RowInsert, RowUpdate
from gpuadmin.probe.owners import SLURM_JOB
from gpuadmin.usage.models import COUNTER_FIELDS, LifeUsage, UsageCursor, UsageDay

# A gap between two snapshots counts up to this many probe intervals.
GAP_CAP_INTERVALS = 3
_MS = timedelta(milliseconds=1)

HolderKey = tuple[str, int, int, str]  # boot id, pid, start ticks, device uuid


class Holder(msgspec.Struct, array_like=True):
    """One process holding one device, as the cursor keeps it: who, and the device's running totals
    (``Device``) and the host's clock when it joined (or at the last settling)."""

    boot_id: str
    pid: int
    start_time_ticks: int
    device_uuid: str
    device_model: str
    user: str
    uid: int | None
    owner_label: str
    owner_kind: str
    owner_uid: int | None
    first_at: datetime
    clock_from: int
    busy_from: int
    idle_from: int
    unmeasured_from: int

    @property
    def key(self) -> HolderKey:
        return (self.boot_id, self.pid, self.start_time_ticks, self.device_uuid)


class HolderIndex(msgspec.Struct, array_like=True):
    """The holders' identities alone, in the holders' list's order, for an update to look a holder up
    without reading that long list: the devices held, and per holder its pid, start ticks and device
    (its place in ``devices``). The boot id is left out: every holder is one snapshot's."""

    devices: list[str]
    holders: list[tuple[int, int, int]]


class Own(msgspec.Struct, array_like=True):
    """A holder's measured busy time on a device since the cursor was settled: its utilisation in the
    latest snapshot (None: none given there), the milliseconds busy by it, and the estimated shares
    its device's ``busy`` counted while it was measured (which are not its own)."""

    utilization_percent: int | None
    busy: int = 0
    skipped: int = 0


class Device(msgspec.Struct, array_like=True):
    """A device with holders: its utilisation in the latest snapshot and how many held it, and the
    milliseconds each of its holders was busy (estimated), idle or unmeasured since the cursor was
    settled; ``own``: by index in the holders' list, the holders with a measured figure."""

    utilization_percent: int | None
    holders: int
    busy: int = 0
    idle: int = 0
    unmeasured: int = 0
    own: dict[int, Own] = msgspec.field(default_factory=dict)


class Settled(msgspec.Struct, array_like=True):
    """A holder's figures ready for LifeUsage and UsageDay (``COUNTER_FIELDS``)."""

    holder: Holder
    last_at: datetime
    counters: list[int]


_encode = msgspec.json.Encoder().encode
_decode_devices = msgspec.json.Decoder(dict[str, Device]).decode
_decode_bytes = msgspec.json.Decoder(list[tuple[int, int]]).decode
_decode_holders = msgspec.json.Decoder(list[Holder]).decode
_decode_index = msgspec.json.Decoder(HolderIndex).decode
_decode_pending = msgspec.json.Decoder(list[Settled]).decode

_STEADY_COLUMNS = ["taken_at", "day_start", "settled_at", "clock_milliseconds", "devices", "holder_bytes",
                   "holders_digest"]
_CURSOR = PreparedQuery(
    UsageCursor.objects.filter(host=Param(UsageCursor, "host")).values_list(*_STEADY_COLUMNS))
# The holders' list and what is pending, read only when needed whole (Cursor._load: a holder came or
# went, or the cursor is settled), compiled once: the ORM's compiling was a third of an update's CPU.
_HOLDERS = PreparedQuery(
    UsageCursor.objects.filter(host=Param(UsageCursor, "host")).values_list("holders", "pending"))
# Updates' cursors, of any number of hosts: with the holders' index, which an update naming processes
# looks holders up in, in the same row.
_UPDATED_CURSORS = PreparedQuery(
    UsageCursor.objects.filter(AnyOf(UsageCursor, "host", key="hosts")).order_by()
    .values_list("host", *_STEADY_COLUMNS, "holder_index"))
FLUSH_HOSTS_PER_BATCH = 100
# A cursor whose holders stayed: keyed by host, so a batch of hosts' updates write theirs together.
_STEADY_UPDATE = RowUpdate(UsageCursor, "host", ["taken_at", "clock_milliseconds", "devices", "holder_bytes"],
                           deferrable=True)
_ALL_COLUMNS = [*_STEADY_COLUMNS, "holders", "pending", "holder_index"]
_CURSOR_UPSERT = RowInsert(UsageCursor, ["host", *_ALL_COLUMNS], conflict=["host"], update=_ALL_COLUMNS,
                           deferrable=True)


# Settled figures, added to what each life and day has so far: one statement each per settling, its text
# the same for any number of rows (the SQL of a VALUES list of each length was parsed anew every time).
_LIFE_KEY = ["host", "boot_id", "pid", "start_time_ticks", "device_uuid"]
_LIFE_ADD = RowInsert(LifeUsage, [*_LIFE_KEY, "device_model", "user", "uid", "owner_label", "first_at",
                                  "last_at", *COUNTER_FIELDS],
                      conflict=_LIFE_KEY, update=["device_model", "user", "uid", "owner_label", "last_at"],
                      add=COUNTER_FIELDS)
_DAY_KEY = ["host", "day", "user", "owner_label", "device_model"]
_DAY_ADD = RowInsert(UsageDay, [*_DAY_KEY, "uid", "owner_kind", "owner_uid", *COUNTER_FIELDS],
                     conflict=_DAY_KEY, update=["uid", "owner_kind", "owner_uid"], add=COUNTER_FIELDS)


def on_snapshot_storing(sender: Any, *, host: Host, document: dict[str, Any], rows: Mapping[int, ProcessRow],
                        taken_at: datetime, **_: Any) -> None:
    """``fleet.signals.snapshot_storing``'s receiver: the ledger's share of ingest."""
    if settings.GPUADMIN_USAGE_LEDGER:
        record_snapshot(host.pk, document, rows, taken_at=taken_at)


def on_snapshot_updates_storing(sender: Any, *, updates: Sequence[UpdateStoring], **_: Any) -> None:
    """``fleet.signals.snapshot_updates_storing``'s receiver: the time between full snapshots."""
    if settings.GPUADMIN_USAGE_LEDGER:
        record_updates(updates)


def gap_cap() -> timedelta:
    return timedelta(seconds=GAP_CAP_INTERVALS * settings.GPUADMIN_PROBE_INTERVAL_SECONDS)


class Cursor:
    """A host's ``UsageCursor`` in memory: its small columns always, the holders' list when needed."""

    def __init__(self, host_id: int, values: tuple[Any, ...] | None, now: datetime) -> None:
        """``values``: the stored row's ``_STEADY_COLUMNS`` (None: none stored)."""
        self.host_id = host_id
        self.stored = values is not None
        if values is None:
            self.taken_at, self.day, self.settled_at = now, _day(now), now
            self.clock, self.devices, self.memory, self.digest = 0, {}, [], _digest([])
        else:
            taken_at, day_start, settled_at, clock, devices, memory, digest = values
            self.taken_at, self.settled_at, self.clock = taken_at, settled_at, clock
            self.day = _day(day_start)
            self.devices, self.memory, self.digest = _decode_devices(devices), _decode_bytes(memory), digest
        self._holders: list[Holder] | None = None if self.stored else []
        self._pending: list[Settled] | None = None if self.stored else []
        # Whether the holders' or pending lists (or the columns that change with them) were changed;
        # if not, a save writes only the columns every snapshot moves (_STEADY_UPDATE).
        self._lists_changed = False

    def _load(self) -> None:
        if self._holders is None or self._pending is None:
            ((holders, pending),) = _HOLDERS.rows(host=self.host_id)  # the row self was read from
            self._holders, self._pending = _decode_holders(holders), _decode_pending(pending)
            for item in self._pending:
                if len(item.counters) == len(COUNTER_FIELDS) - 1:
                    # Settled before busy was ever measured: all of its busy time was estimated.
                    item.counters.append(item.counters[2])

    @property
    def holders(self) -> list[Holder]:
        self._load()
        assert self._holders is not None
        return self._holders

    @property
    def pending(self) -> list[Settled]:
        self._load()
        assert self._pending is not None
        return self._pending

    def charge(self, milliseconds: int) -> None:
        """Add ``milliseconds`` of the state the cursor holds."""
        if milliseconds <= 0:
            return
        self.clock += milliseconds
        for device in self.devices.values():
            utilization = device.utilization_percent
            if utilization is None:
                device.unmeasured += milliseconds
                continue
            share = 0
            if device.own:
                measured = [own for own in device.own.values() if own.utilization_percent is not None]
                left = max(0, utilization - sum(own.utilization_percent or 0 for own in measured))
                if device.holders > len(measured):
                    share = milliseconds * left // (100 * (device.holders - len(measured)))
                for own in measured:
                    own.busy += milliseconds * (own.utilization_percent or 0) // 100
                    own.skipped += share
            else:
                share = milliseconds * utilization // (100 * device.holders)
            device.busy += share
            if utilization == 0:
                device.idle += milliseconds
        self.memory = [(memory_bytes, byte_ms + memory_bytes * milliseconds)
                       for memory_bytes, byte_ms in self.memory]

    def figures(self, index: int, holder: Holder, last_at: datetime) -> Settled:
        device = self.devices[holder.device_uuid]
        own = device.own.get(index)
        estimated = device.busy - holder.busy_from - (own.skipped if own is not None else 0)
        measured = own.busy if own is not None else 0
        return Settled(holder, last_at, [
            self.clock - holder.clock_from, self.memory[index][1] // 1000, measured + estimated,
            device.idle - holder.idle_from, device.unmeasured - holder.unmeasured_from, estimated])

    def settle(self, charged_until: datetime) -> None:
        """Write every holder's figures and those gone since to LifeUsage and UsageDay; start again."""
        settled = [*self.pending, *(self.figures(i, h, charged_until) for i, h in enumerate(self.holders))]
        write(self.host_id, self.day, [item for item in settled if item.counters[0] > 0])
        self.clock = 0
        for device in self.devices.values():
            device.busy = device.idle = device.unmeasured = 0
            device.own = {i: Own(own.utilization_percent) for i, own in device.own.items()
                          if own.utilization_percent is not None}
        self._holders = [msgspec.structs.replace(h, clock_from=0, busy_from=0, idle_from=0, unmeasured_from=0)
                         for h in self.holders]
        self._pending = []
        self._lists_changed = True
        self.memory = [(memory_bytes, 0) for memory_bytes, _ in self.memory]
        self.settled_at = charged_until

    def save(self) -> None:
        devices = _encode(self.devices).decode()
        memory = _encode(self.memory).decode()
        if self.stored and not self._lists_changed:
            _STEADY_UPDATE.run([(self.host_id, self.taken_at, self.clock, devices, memory)])
            return
        day_start = datetime.combine(self.day, time(0), tzinfo=UTC)
        _CURSOR_UPSERT.run([(self.host_id, self.taken_at, day_start, self.settled_at, self.clock, devices,
                             memory, self.digest, _encode(self.holders).decode(),
                             _encode(self.pending).decode(), _encode(holder_index(self.holders)).decode())],
                           returning=False)


def holder_index(holders: Sequence[Holder]) -> HolderIndex:
    devices: dict[str, int] = {}  # each device's place, in the order first held
    rows = [(h.pid, h.start_time_ticks, devices.setdefault(h.device_uuid, len(devices))) for h in holders]
    return HolderIndex(list(devices), rows)


def _day(moment: datetime) -> date:
    return moment.astimezone(UTC).date()


def _digest(keys: list[HolderKey]) -> int:
    """Which holders, in a bigint: equal lists, equal digests (one boot id per snapshot: left out)."""
    text = _encode([(pid, ticks, uuid) for _, pid, ticks, uuid in keys])
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big", signed=True)


def record_snapshot(host_id: int, document: dict[str, Any], rows: Mapping[int, ProcessRow], *,
                    taken_at: datetime) -> None:
    """Charge the holders of the host's previous snapshot for the time until this one, and remember
    this one's. Must be called in the host's order, under its row lock (ingest's transaction)."""
    stored = _CURSOR.rows(host=host_id)
    cursor = Cursor(host_id, stored[0] if stored else None, taken_at)
    until = taken_at
    if cursor.stored:
        charged = _charge_until(cursor, taken_at)
        if charged is None:
            return  # not newer than what the cursor saw: nothing to charge (ingest never sends one)
        until = charged
    follow(cursor, document, rows, taken_at=taken_at, charged_until=until)
    cursor.taken_at = taken_at
    cursor.save()


def record_updates(updates: Sequence[UpdateStoring]) -> None:
    """Snapshot updates between full snapshots, one per host: each host's processes are its base's, so
    the holders stay; charge them for the time until its update, then take its GPUs' utilisation and
    the memory that moved. A holder whose memory crosses the held threshold is added or dropped at the
    next full snapshot (an update cannot change which processes there are; the agent sends one at least
    every GPUADMIN_FULL_SNAPSHOT_SECONDS). The hosts' cursors are read at once; inside
    ``statements.deferred()`` a steady cursor's write goes with the batch's."""
    stored = _cursors([item.host.pk for item in updates])
    for host, update, taken_at in updates:
        values = stored.get(host.pk)
        if values is None:
            continue  # no full snapshot charged yet: an update has no holders to charge
        cursor = Cursor(host.pk, values[:-1], taken_at)
        if _charge_until(cursor, taken_at) is None:
            continue
        utilization = {gpu.uuid: gpu.utilization_percent for gpu in update.gpus}
        for uuid, device in cursor.devices.items():
            if uuid in utilization:  # a MIG instance is not in the update's GPUs: it keeps no utilisation
                device.utilization_percent = utilization[uuid]
        if update.processes:
            moved = {p.pid: (p.start_time_ticks, p.gpu_memory_bytes) for p in update.processes}
            # The index as stored: a settling just now rewrote the holders' list in the same order.
            memory, index = cursor.memory, _decode_index(values[-1])
            if len(memory) != len(index.holders):
                raise ValueError(f"host {host.pk}'s usage cursor has {len(memory)} memory figures for "
                                 f"{len(index.holders)} holders")
            # A few processes moved among many holders: look each holder's pid up, rebuild only theirs.
            uuids = index.devices
            for place, (pid, ticks, held) in enumerate(index.holders):
                found = moved.get(pid)
                if found is not None and found[0] == ticks:
                    new = found[1].get(uuids[held])
                    if new is not None:
                        memory[place] = (new, memory[place][1])
        cursor.taken_at = taken_at
        cursor.save()


def _cursors(host_ids: list[int]) -> dict[int, tuple[Any, ...]]:
    """The hosts' stored cursors: ``_STEADY_COLUMNS`` then the holders' index's text."""
    return {row[0]: row[1:] for row in _UPDATED_CURSORS.rows(hosts=host_ids)}


def _charge_until(cursor: Cursor, taken_at: datetime) -> datetime | None:
    """Charge a stored cursor's state from its last snapshot until ``taken_at`` (a gap capped at
    ``gap_cap()``, split at midnight), settling when due; the moment charged until, or None when
    ``taken_at`` is not newer than what the cursor saw."""
    start = cursor.taken_at
    if taken_at <= start:
        return None
    until = min(taken_at, start + gap_cap())
    midnight = datetime.combine(_day(start) + timedelta(days=1), time(0), tzinfo=UTC)
    if until > midnight:
        # The day's part, settled into its day; the rest is the next day's.
        cursor.charge((midnight - start) // _MS)
        cursor.settle(midnight)
        cursor.day = _day(midnight)
        cursor.charge((until - midnight) // _MS)
    else:
        cursor.charge((until - start) // _MS)
    flush_due = taken_at - cursor.settled_at >= timedelta(seconds=settings.GPUADMIN_USAGE_FLUSH_SECONDS)
    if flush_due or _day(taken_at) != cursor.day:
        cursor.settle(until)
        cursor.day = _day(taken_at)  # a gap past midnight: this snapshot's day from now on
    return until


def follow(cursor: Cursor, document: dict[str, Any], rows: Mapping[int, ProcessRow], *,
           taken_at: datetime, charged_until: datetime) -> None:
    """Make the cursor hold this snapshot's holders: their memory and devices' utilisation always; the
    holders' list only when a holder came or went (the gone ones' figures kept for the settling)."""
    held, models = holding(document, rows)
    keys = [key for key, *_ in held]
    digest = _digest(keys)
    utilization = {uuid: models[uuid][1] for uuid in {key[3] for key in keys}}
    measured = _measured(document, keys)
    if digest == cursor.digest and cursor.stored:
        cursor.memory = [(memory_bytes, byte_ms) for (_, memory_bytes, _), (_, byte_ms)
                         in zip(held, cursor.memory, strict=True)]
        for uuid, device in cursor.devices.items():
            device.utilization_percent = utilization[uuid]
        _measure(cursor.devices, keys, measured)
        return
    before = {h.key: (i, h) for i, h in enumerate(cursor.holders)}
    now = set(keys)
    gone = [cursor.figures(i, h, charged_until) for key, (i, h) in before.items() if key not in now]
    cursor.pending.extend(item for item in gone if item.counters[0] > 0)
    counts: dict[str, int] = {}
    for key in keys:
        counts[key[3]] = counts.get(key[3], 0) + 1
    devices = {}
    owns = {uuid: device.own for uuid, device in cursor.devices.items()}
    for uuid, count in counts.items():
        device = cursor.devices.get(uuid) or Device(utilization[uuid], count)
        device.utilization_percent, device.holders = utilization[uuid], count
        device.own = {}
        devices[uuid] = device
    boot_id = document["host"]["boot_id"]
    holders, memory = [], []
    for index, (key, memory_bytes, row) in enumerate(held):
        kept = before.get(key)
        if kept is not None:
            holders.append(kept[1])
            memory.append((memory_bytes, cursor.memory[kept[0]][1]))
            own = owns.get(key[3], {}).get(kept[0])
            if own is not None:
                devices[key[3]].own[index] = own  # its measured time, under its new place in the list
        else:
            holders.append(_holder(boot_id, row, key[3], models[key[3]][0], joined_at=taken_at,
                                   clock=cursor.clock, device=devices[key[3]]))
            memory.append((memory_bytes, 0))
    _measure(devices, keys, measured)
    cursor.devices, cursor.memory, cursor.digest = devices, memory, digest
    cursor._holders = holders
    cursor._lists_changed = True


def _measured(document: dict[str, Any], keys: list[HolderKey]) -> list[int | None]:
    """Each holder's own utilisation on its device in this snapshot (None: not given there)."""
    given = {p["pid"]: p["gpu_utilization_percent"] for p in document["processes"]
             if p.get("gpu_utilization_percent")}
    if not given:
        return [None] * len(keys)
    return [given.get(pid, {}).get(uuid) for _, pid, _, uuid in keys]


def _measure(devices: dict[str, Device], keys: list[HolderKey], measured: list[int | None]) -> None:
    """Put this snapshot's measured figures in the holders' devices: a holder measured before and not
    now keeps its measured time, and counts as estimated from now on."""
    for index, (key, percent) in enumerate(zip(keys, measured, strict=True)):
        device = devices[key[3]]
        own = device.own.get(index)
        if percent is not None:
            if own is None:
                device.own[index] = Own(percent)
            else:
                own.utilization_percent = percent
        elif own is not None:
            if own.busy or own.skipped:
                own.utilization_percent = None
            else:
                del device.own[index]


def holding(document: dict[str, Any], rows: Mapping[int, ProcessRow]
            ) -> tuple[list[tuple[HolderKey, int, ProcessRow]], dict[str, tuple[str, int | None]]]:
    """Each process and device it holds in this snapshot, by identity (at most the history's
    per-snapshot cap of them, the biggest first: a made-up snapshot cannot grow the cursor without
    end); and each device's model and utilisation."""
    threshold = settings.GPUADMIN_USAGE_HELD_BYTES
    devices: dict[str, tuple[str, int | None]] = {}
    mig: dict[str, dict[tuple[int, int], str]] = {}
    for g in document["gpus"]:
        devices[g["uuid"]] = (g["name"], g["utilization_percent"])
        if "mig_instances" in g:
            mig[g["uuid"]] = {}
            for m in g["mig_instances"]:
                mig[g["uuid"]][(m["gpu_instance_id"], m["compute_instance_id"])] = m["uuid"]
                devices[m["uuid"]] = (m["name"], None)  # NVML gives no utilisation in MIG mode
    on_mig = ({p["pid"]: p["mig_instances"] for p in document["processes"] if p.get("mig_instances")}
              if mig else {})
    boot_id = document["host"]["boot_id"]
    held: list[tuple[HolderKey, int, ProcessRow]] = []
    for row in rows.values():
        if not row.gpu_memory_bytes:
            continue
        for uuid, memory_bytes in row.gpu_memory_bytes.items():
            if uuid in mig and row.pid in on_mig:
                for instance in on_mig[row.pid]:
                    found = mig[uuid].get((instance["gpu_instance_id"], instance["compute_instance_id"]))
                    used = instance["used_memory_bytes"] or 0
                    if instance["gpu_uuid"] == uuid and found is not None and used > threshold:
                        held.append(((boot_id, row.pid, row.start_time_ticks, found), used, row))
            elif (memory_bytes or 0) > threshold:
                if uuid not in devices:
                    devices[uuid] = ("", None)
                held.append(((boot_id, row.pid, row.start_time_ticks, uuid), memory_bytes or 0, row))
    cap = settings.GPUADMIN_HISTORY_PROCESSES_PER_SNAPSHOT
    if len(held) > cap:
        held = heapq.nsmallest(cap, held, key=lambda h: (-h[1], h[0]))
    held.sort(key=lambda h: h[0])
    return held, devices


def _holder(boot_id: str, row: ProcessRow, device_uuid: str, model: str, *, joined_at: datetime, clock: int,
            device: Device) -> Holder:
    owner = row.owner or {}
    kind = str(owner.get("kind") or "")
    owner_uid = owner.get("uid") if kind == SLURM_JOB and isinstance(owner.get("uid"), int) else None
    return Holder(boot_id, row.pid, row.start_time_ticks, device_uuid, model[:256], (row.user or "")[:256],
                  row.uid, owner_label(row.owner)[:200], kind[:32], owner_uid, joined_at, clock, device.busy,
                  device.idle, device.unmeasured)


def write(host_id: int, day: date, items: list[Settled]) -> None:
    """Add ``items``, of ``day``, to ``LifeUsage`` (each life and device) and ``UsageDay``."""
    if not items:
        return
    days: dict[tuple[str, str, str], list[Any]] = {}
    lives: dict[HolderKey, list[Any]] = {}
    for item in items:
        h = item.holder
        key = (h.user, h.owner_label, h.device_model)
        if key in days:
            days[key][1] = [a + b for a, b in zip(days[key][1], item.counters, strict=True)]
        else:
            days[key] = [h, list(item.counters)]
        # A life that left and came back since the last settling: one row (an upsert touches a row once).
        life = lives.get(h.key)
        if life is None:
            lives[h.key] = [h, item.last_at, list(item.counters)]
        else:
            life[1], life[2] = max(life[1], item.last_at), [a + b for a, b in zip(life[2], item.counters,
                                                                                     strict=True)]
    _LIFE_ADD.run([(host_id, h.boot_id, h.pid, h.start_time_ticks, h.device_uuid, h.device_model, h.user,
                    h.uid, h.owner_label, h.first_at, last, *counters)
                   for h, last, counters in lives.values()], returning=False)
    _DAY_ADD.run([(host_id, day, user, label, model, h.uid, h.owner_kind, h.owner_uid, *counters)
                  for (user, label, model), (h, counters) in days.items()], returning=False)


def flush_all(cursors: Any = None, *, hosts_per_batch: int = FLUSH_HOSTS_PER_BATCH) -> int:
    """Settle ``cursors`` (a ``UsageCursor`` queryset; default every host's) now: tests, and
    ``retention.maintain_usage`` for hosts that went silent. How many were settled. Under the hosts'
    row locks, as ingest holds them (a figure is written once), ``hosts_per_batch`` hosts a
    transaction, locked in id order as ingest locks a batch's. A cursor with nothing charged since its
    last settling and nothing pending (a host silent since then) is not even locked."""
    cursors = UsageCursor.objects.all() if cursors is None else cursors
    host_ids = list(cursors.exclude(clock_milliseconds=0, pending=_encode([]).decode())
                    .order_by("host_id").values_list("host_id", flat=True))
    flushed = 0
    for first in range(0, len(host_ids), hosts_per_batch):
        with transaction.atomic():
            batch = Host.objects.lock_in_id_order(host_ids[first:first + hosts_per_batch])
            for host_id, values in _cursors(batch).items():
                cursor = Cursor(host_id, values[:-1], values[0])  # less the holders' index
                if cursor.clock == 0 and not cursor.pending:
                    continue  # settled by ingest since it was listed
                cursor.settle(cursor.taken_at)
                cursor.save()
                flushed += 1
    return flushed
