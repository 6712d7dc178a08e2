"""The usage ledger written at ingest: each snapshot adds the time since the host's previous one.

Rules (docs/usage in ``templates/usage/usage.html`` says them to people):

- A process *holds* a device while its memory there is above ``GPUADMIN_USAGE_HELD_BYTES``. A MIG
  instance is a device of its own (``gpus[].mig_instances``; a process's share of it from
  ``processes[].mig_instances``), with its own name as its model.
- The time between two snapshots of a host is attributed to what the *earlier* one showed: a process
  first seen in a snapshot starts counting there, one gone from a snapshot counted until it. A gap
  longer than ``GAP_CAP_INTERVALS`` probe intervals (an agent down, a host off) counts only up to that
  cap: nobody is charged for hours nobody saw.
- *Busy*: the device's utilisation shared equally among its holders, an estimate (snapshots carry no
  per-process utilisation; NVML's ``nvmlDeviceGetProcessUtilization`` is not read by the probe).
  *Idle*: held while the device said 0 %. A device that gave no utilisation (a MIG instance, whose
  utilisation NVML does not report) counts as *unmeasured*, neither busy nor idle.
- Days are UTC days; an interval across midnight is split there.

Cost: what a snapshot adds is kept in the host's ``UsageCursor`` row (one read, one write per
snapshot) and written to ``LifeUsage`` and ``UsageDay`` at most every
``GPUADMIN_USAGE_FLUSH_SECONDS``, one statement each for all of a host's holders.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import msgspec
from django.conf import settings
from django.db import connection, transaction

from gpuadmin.fleet.models import Host
from gpuadmin.fleet.process_tree import ProcessRow, owner_label
from gpuadmin.fleet.storage.statements import Param, PreparedQuery, RowInsert
from gpuadmin.probe.owners import SLURM_JOB
from gpuadmin.usage.models import COUNTER_FIELDS, LifeUsage, UsageCursor, UsageDay

# A gap between two snapshots counts up to this many probe intervals.
GAP_CAP_INTERVALS = 3
_MS = timedelta(milliseconds=1)


class Holder(msgspec.Struct, array_like=True, frozen=True):
    """One process holding one device in a snapshot, and what the ledger needs to charge it."""

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
    memory_bytes: int
    # The device's utilisation (None: it gave none) and how many processes held it.
    utilization_percent: int | None
    holders: int


class Pending(msgspec.Struct, array_like=True):
    """What one holder added up on one UTC day since the cursor's last flush."""

    day: str
    holder: Holder
    first_at: datetime
    last_at: datetime
    counters: list[int]  # COUNTER_FIELDS' values


_encode = msgspec.json.Encoder().encode
_decode_state = msgspec.json.Decoder(list[Holder]).decode
_decode_pending = msgspec.json.Decoder(list[Pending]).decode

_CURSOR = PreparedQuery(UsageCursor.objects.filter(host=Param(UsageCursor, "host"))
                        .values_list("taken_at", "state", "pending", "pending_since"))
_CURSOR_UPSERT = RowInsert(UsageCursor, ["host", "taken_at", "state", "pending", "pending_since"],
                           conflict=["host"], update=["taken_at", "state", "pending", "pending_since"])


def on_snapshot_storing(sender: Any, *, host: Host, document: dict[str, Any], rows: Mapping[int, ProcessRow],
                        taken_at: datetime, **_: Any) -> None:
    """``fleet.signals.snapshot_storing``'s receiver: the ledger's share of ingest."""
    if settings.GPUADMIN_USAGE_LEDGER:
        record_snapshot(host.pk, document, rows, taken_at=taken_at)


def gap_cap() -> timedelta:
    return timedelta(seconds=GAP_CAP_INTERVALS * settings.GPUADMIN_PROBE_INTERVAL_SECONDS)


def record_snapshot(host_id: int, document: dict[str, Any], rows: Mapping[int, ProcessRow], *,
                    taken_at: datetime) -> None:
    """Charge the holders of the host's previous snapshot for the time until this one, and remember
    this one's. Must be called in the host's order, under its row lock (ingest's transaction)."""
    stored = _CURSOR.rows(host=host_id)
    pending: dict[tuple[str, str, int, int, str], Pending] = {}
    pending_since = taken_at
    if stored:
        before_at, state_text, pending_text, pending_since = stored[0]
        if taken_at <= before_at:
            return  # not newer than what the cursor saw: nothing to charge (ingest never sends one)
        for item in _decode_pending(pending_text):
            pending[_pending_key(item.day, item.holder)] = item
        if not pending:
            pending_since = before_at  # what is added now is owed since then
        charge(pending, _decode_state(state_text), before_at, taken_at)
    if pending and taken_at - pending_since >= timedelta(seconds=settings.GPUADMIN_USAGE_FLUSH_SECONDS):
        flush(host_id, pending.values())
        pending = {}
    if not pending:
        pending_since = taken_at
    _CURSOR_UPSERT.run([(host_id, taken_at, _encode(holders_of(document, rows)).decode(),
                         _encode(list(pending.values())).decode(), pending_since)], returning=False)


def _pending_key(day: str, holder: Holder) -> tuple[str, str, int, int, str]:
    return (day, holder.boot_id, holder.pid, holder.start_time_ticks, holder.device_uuid)


def day_parts(start: datetime, end: datetime) -> Iterator[tuple[date, datetime, datetime]]:
    """[start, end) split at UTC midnights: (day, from, to) each."""
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    while start < end:
        midnight = datetime.combine(start.date() + timedelta(days=1), time(0), tzinfo=UTC)
        part_end = min(end, midnight)
        yield start.date(), start, part_end
        start = part_end


def charge(pending: dict[tuple[str, str, int, int, str], Pending], state: list[Holder],
           before_at: datetime, taken_at: datetime) -> None:
    """Add [before_at, taken_at), capped at ``gap_cap()``, to each holder of ``state`` in ``pending``."""
    until = min(taken_at, before_at + gap_cap())
    for day, start, end in day_parts(before_at, until):
        milliseconds = (end - start) // _MS
        day_text = day.isoformat()
        for holder in state:
            key = _pending_key(day_text, holder)
            item = pending.get(key)
            if item is None:
                item = pending[key] = Pending(day_text, holder, start, end, [0] * len(COUNTER_FIELDS))
            else:
                item.holder, item.last_at = holder, end  # the latest description wins
            add(item.counters, holder, milliseconds)


def add(counters: list[int], holder: Holder, milliseconds: int) -> None:
    """``COUNTER_FIELDS`` of ``holder`` over ``milliseconds``."""
    counters[0] += milliseconds
    counters[1] += holder.memory_bytes * milliseconds // 1000
    utilization = holder.utilization_percent
    if utilization is None:
        counters[4] += milliseconds
        return
    counters[2] += milliseconds * utilization // (100 * holder.holders)
    if utilization == 0:
        counters[3] += milliseconds


def holders_of(document: dict[str, Any], rows: Mapping[int, ProcessRow]) -> list[Holder]:
    """Each process and device it holds in this snapshot (at most the history's per-snapshot cap of
    them, the biggest first: a made-up snapshot cannot grow the cursor without end)."""
    threshold = settings.GPUADMIN_USAGE_HELD_BYTES
    devices: dict[str, tuple[str, int | None]] = {}
    mig: dict[str, dict[tuple[int, int], tuple[str, str]]] = {}
    for g in document["gpus"]:
        devices[g["uuid"]] = (g["name"], g["utilization_percent"])
        if "mig_instances" in g:
            mig[g["uuid"]] = {(m["gpu_instance_id"], m["compute_instance_id"]): (m["uuid"], m["name"])
                              for m in g["mig_instances"]}
    on_mig = ({p["pid"]: p["mig_instances"] for p in document["processes"] if p.get("mig_instances")}
              if mig else {})
    held: list[tuple[ProcessRow, str, str, int | None, int]] = []
    for row in rows.values():
        if not row.gpu_memory_bytes:
            continue
        for uuid, memory_bytes in row.gpu_memory_bytes.items():
            if uuid in mig and row.pid in on_mig:
                for instance in on_mig[row.pid]:
                    found = mig[uuid].get((instance["gpu_instance_id"], instance["compute_instance_id"]))
                    used = instance["used_memory_bytes"] or 0
                    if instance["gpu_uuid"] == uuid and found is not None and used > threshold:
                        held.append((row, found[0], found[1], None, used))
            elif (memory_bytes or 0) > threshold:
                model, utilization = devices.get(uuid, ("", None))
                held.append((row, uuid, model, utilization, memory_bytes or 0))
    cap = settings.GPUADMIN_HISTORY_PROCESSES_PER_SNAPSHOT
    if len(held) > cap:
        held = heapq.nsmallest(cap, held, key=lambda h: (-h[4], h[0].pid))
    count: dict[str, int] = {}
    for _, device, *_rest in held:
        count[device] = count.get(device, 0) + 1
    boot_id = document["host"]["boot_id"]
    return [_holder(boot_id, row, device, model, utilization, memory_bytes=memory_bytes,
                    holders=count[device])
            for row, device, model, utilization, memory_bytes in held]


def _holder(boot_id: str, row: ProcessRow, device: str, model: str, utilization: int | None, *,
            memory_bytes: int, holders: int) -> Holder:
    owner = row.owner or {}
    kind = str(owner.get("kind") or "")
    owner_uid = owner.get("uid") if kind == SLURM_JOB and isinstance(owner.get("uid"), int) else None
    return Holder(boot_id, row.pid, row.start_time_ticks, device, model[:256], (row.user or "")[:256],
                  row.uid, owner_label(row.owner)[:200], kind[:32], owner_uid, memory_bytes, utilization,
                  holders)


def _upsert_sql(table: str, key: list[str], values: list[str]) -> str:
    """INSERT ... ON CONFLICT (key) DO UPDATE adding the counters (SQLite and PostgreSQL alike)."""
    quote = connection.ops.quote_name
    columns = [*key, *values, *COUNTER_FIELDS]
    sets = [f"{quote(c)} = {quote(table)}.{quote(c)} + excluded.{quote(c)}" for c in COUNTER_FIELDS]
    sets += [f"{quote(c)} = excluded.{quote(c)}" for c in values if c != "first_at"]
    # Names from the models, quoted; every value is a parameter.
    return (f"INSERT INTO {quote(table)} ({', '.join(map(quote, columns))}) "  # noqa: S608
            f"VALUES ({', '.join(['%s'] * len(columns))}) "
            f"ON CONFLICT ({', '.join(map(quote, key))}) DO UPDATE SET {', '.join(sets)}")


def flush(host_id: int, items: Any) -> None:
    """Write what ``items`` (``Pending``) added up into ``LifeUsage`` and ``UsageDay``."""
    items = list(items)
    if not items:
        return
    ops = connection.ops
    lives: dict[tuple[str, int, int, str], list[Any]] = {}
    days: dict[tuple[str, str, str, str], list[Any]] = {}
    for item in sorted(items, key=lambda i: i.first_at):
        h = item.holder
        life_key = (h.boot_id, h.pid, h.start_time_ticks, h.device_uuid)
        life = lives.get(life_key)
        if life is None:
            lives[life_key] = [h, item.first_at, item.last_at, list(item.counters)]
        else:
            life[0], life[2] = h, item.last_at
            life[3] = [a + b for a, b in zip(life[3], item.counters, strict=True)]
        day_key = (item.day, h.user, h.owner_label, h.device_model)
        day = days.get(day_key)
        if day is None:
            days[day_key] = [h, list(item.counters)]
        else:
            day[0] = h
            day[1] = [a + b for a, b in zip(day[1], item.counters, strict=True)]
    life_sql = _upsert_sql(LifeUsage._meta.db_table, ["host_id", "boot_id", "pid", "start_time_ticks",
                                                       "device_uuid"],
                           ["device_model", "user", "uid", "owner_label", "first_at", "last_at"])
    day_sql = _upsert_sql(UsageDay._meta.db_table, ["day", "host_id", "user", "owner_label", "device_model"],
                          ["uid", "owner_kind", "owner_uid"])
    with connection.cursor() as cursor:
        cursor.executemany(life_sql, [
            (host_id, h.boot_id, h.pid, h.start_time_ticks, h.device_uuid, h.device_model, h.user, h.uid,
             h.owner_label, ops.adapt_datetimefield_value(first), ops.adapt_datetimefield_value(last),
             *counters)
            for h, first, last, counters in lives.values()
        ])
        cursor.executemany(day_sql, [
            (ops.adapt_datefield_value(date.fromisoformat(day)), host_id, user, label, model, h.uid,
             h.owner_kind, h.owner_uid, *counters)
            for (day, user, label, model), (h, counters) in days.items()
        ])


def flush_all(cursors: Any = None) -> int:
    """Write the pending additions of ``cursors`` (a ``UsageCursor`` queryset; default every host's)
    now: tests, the digest, and ``retention.maintain_usage`` for hosts that went silent. How many hosts
    had some. Each under its host's row lock, as ingest holds it: an addition is written once."""
    flushed = 0
    cursors = UsageCursor.objects.all() if cursors is None else cursors
    for host_id in cursors.exclude(pending="[]").values_list("host_id", flat=True):
        with transaction.atomic():
            Host.objects.select_for_update().filter(pk=host_id).exists()
            stored = UsageCursor.objects.filter(host_id=host_id).values_list("pending", flat=True).first()
            items = _decode_pending(stored) if stored else []
            if items:
                flush(host_id, items)
                flushed += 1
                UsageCursor.objects.filter(host_id=host_id).update(pending="[]")
    return flushed
