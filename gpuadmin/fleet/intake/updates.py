"""A snapshot update in: the figures that moved since the host's last full snapshot (docs/snapshot.md).

``receive_snapshot_update`` takes the message as it came off the broker. The same trust rules as a
snapshot (``ingest.receive_snapshot``): the signature is checked before anything is parsed, the text
size against ``GPUADMIN_SNAPSHOT_UPDATE_MAX_BYTES``, and only the host's accepted key counts
(``trust.admit``). Then, under the host's row lock:

- the update must name the stored latest snapshot as its base (``LatestSnapshot.base_digest``) and be
  the next of that base's sequence, taken after the latest stored moment. A replayed or reordered one
  (a sequence already applied, or not newer) is refused; one that cannot be applied (an unknown base,
  a gap, a GPU the base does not have) is refused and the host is asked for a full snapshot
  (``request_probe(full=True)``, at most once per probe interval). In a batch, one of an unknown base
  but newer than the latest snapshot may first wait for its base, still on its way in the other queue,
  and one after a gap for the updates before it, which another worker may hold
  (``receive_snapshot_updates``' ``wait``);
- it is applied without reading the stored document: the host's facts and GPU rows, a raw history
  sample per GPU and for the host where one is due (``record.decide_gpu_samples``, the same rule as a
  full snapshot's), the GPUs' idle time, the memory of the processes it names (a
  ``ProcessPoint`` when it moved past the history step from the life's last point), and the update
  itself beside the document (``LatestSnapshot.update``), which the readers lay over it.

Findings are a function of the whole document: they are computed at full snapshots, which the agent
sends whenever the processes change and at least every ``GPUADMIN_FULL_SNAPSHOT_SECONDS``. Every
refusal leaves a ``SnapshotRejection`` row of kind "snapshot update"; nothing stored changes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NamedTuple

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpuadmin.fleet import summary
from gpuadmin.fleet.history import record
from gpuadmin.fleet.intake import trust
from gpuadmin.fleet.intake.validation import HOST_NAME_PATTERN, INT32_MAX, MAX_CLOCK_AHEAD, SnapshotRejected
from gpuadmin.fleet.models import Gpu, Host, LatestSnapshot, ProcessLife, SnapshotRejection
from gpuadmin.fleet.process_tree import memory_total_bytes
from gpuadmin.fleet.signals import UpdateStoring, snapshot_updates_storing
from gpuadmin.fleet.storage.json_text import ValidatedJson
from gpuadmin.fleet.storage.statements import AnyOf, PreparedQuery, RowLookup, RowUpdate, deferred, pipelined
from gpuadmin.fleet.taken_at import parse_taken_at
from gpuadmin.sending import request_probe
from gpuadmin.wire.signing import BadMessage, MessageKind, Opened, open_envelope
from gpuadmin.wire.snapshot_update import BadUpdate, GpuFigures, SnapshotUpdate, decode_update

logger = logging.getLogger(__name__)

_KIND = SnapshotRejection.MessageKind.SNAPSHOT_UPDATE
_CLAIMED_HOST = re.compile(r'"host":"([A-Za-z0-9][A-Za-z0-9._-]{0,252})"')

# What an update is checked against and works from, read for any number of hosts at once.
_LOCK_HOSTS = PreparedQuery(
    Host.objects.select_for_update().filter(AnyOf(Host, "name", key="names")).order_by("pk")
    .values_list(*trust.HOST_COLUMNS)
)
_LATEST = PreparedQuery(
    LatestSnapshot.objects.filter(AnyOf(LatestSnapshot, "host", key="hosts")).order_by()
    .values_list("host", "base_digest", "update_sequence")
)
# What an update waiting for its base or the updates before it waits on (``waited_on``).
_WAITED_ON = PreparedQuery(
    Host.objects.filter(AnyOf(Host, "name", key="names")).order_by()
    .values_list("name", "last_snapshot_taken_at", "latest_snapshot__base_digest",
                 "latest_snapshot__update_sequence")
)
_UPDATE_LATEST = RowUpdate(LatestSnapshot, "host", ["taken_at", "received_at", "update_sequence", "update"],
                           deferrable=True)
_HOST_UPDATE_FIELDS = ["last_seen_at", "last_snapshot_taken_at", "pids_in_use", "process_count",
                       "zombie_count", "last_error", "last_error_at", "sampled_at",
                       *record.HOST_SAMPLED_FIELDS]
_UPDATE_HOST = RowUpdate(Host, "id", _HOST_UPDATE_FIELDS, deferrable=True)
_STORED_GPUS = PreparedQuery(
    Gpu.objects.filter(AnyOf(Gpu, "host", key="hosts"), present=True).order_by()
    .values_list("host", "pk", "uuid", "idle_since", "sampled_at",
                 *record.GPU_SAMPLED_FIELDS)
)
# Every GPU's figures, each row by its id as read: only the figures and the last written sample
# (record.decide_gpu_samples) change.
_GPU_FIGURES = ["memory_used_bytes", "memory_attributed_bytes", "utilization_percent", "updated_at",
                "sampled_at", *record.GPU_SAMPLED_FIELDS]
_SET_GPU_FIGURES = RowUpdate(Gpu, "id", _GPU_FIGURES, deferrable=True)
_LIVES_MEMORY = RowUpdate(ProcessLife, "id", ["last_gpu_memory_bytes", "peak_gpu_memory_bytes",
                                              "point_gpu_memory_bytes"], deferrable=True)
# The open lives of the identities an update names (host id, boot id, pid, start time), each looked up
# by its key in the identity index: only the lives asked for are read, not every life of the batch's
# hosts whose pid another host's update named. A fixed statement: the ORM's compiling was a fifth of an
# update's CPU.
_NAMED_OPEN_LIVES = RowLookup(
    ProcessLife, ["host", "boot_id", "pid", "start_time_ticks"],
    ["id", "host", "boot_id", "pid", "start_time_ticks", "point_gpu_memory_bytes", "peak_gpu_memory_bytes",
     "last_state", "last_gpu_memory_bytes"],
    null=["gone_at"],
)


class UpdateRefused(SnapshotRejected):
    """An update that is not applied; ``full_requested``: the host was asked for a full snapshot."""

    def __init__(self, message: str, *, host_name: str = "", full_requested: bool = False) -> None:
        super().__init__(message, host_name=host_name)
        self.full_requested = full_requested


class _CannotApply(Exception):
    """``may_come``: what the update needs may still be on its way. Its base, when it is newer than the
    host's latest snapshot but of a base not stored (full snapshots go to ``central``, updates to
    ``central.updates``); or the updates before it, when some of its base's are not applied yet (another
    worker taking ``central.updates`` may hold them)."""

    def __init__(self, reason: str, *, ask_full: bool, may_come: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.ask_full = ask_full
        self.may_come = may_come


def update_max_bytes() -> int:
    return min(settings.GPUADMIN_SNAPSHOT_UPDATE_MAX_BYTES, settings.GPUADMIN_SNAPSHOT_MAX_BYTES)


class OpenedUpdate(NamedTuple):
    """A message this process opened and decoded (signature checked, text decoded, its moment): what
    a caller keeps of an update that waits for its base, and gives again in the message's place."""

    update: SnapshotUpdate
    opened: Opened
    taken_at: datetime


class _Waits(Exception):
    """The update cannot apply yet, and waits for what it needs (``_receive``'s ``may_wait`` said so)."""


def receive_snapshot_update(message: Any, *, received_at: datetime | None = None) -> Host | None:
    """Apply a snapshot update message as it came off the broker (or as ``OpenedUpdate``); the host, or
    None while it awaits acceptance. Raises ``UpdateRefused`` for anything not applied."""
    return _receive(message, received_at=received_at or timezone.now())


def _receive(message: Any, *, received_at: datetime,
             may_wait: Callable[[OpenedUpdate], bool] | None = None) -> Host | None:
    """``receive_snapshot_update``; one that cannot apply yet but whose needs may still come raises
    ``_Waits``, nothing recorded, where ``may_wait`` lets it wait."""
    item = message if isinstance(message, OpenedUpdate) else _opened(message, received_at=received_at)
    update, opened, taken_at = item
    size_bytes = len(opened.text)
    try:
        with transaction.atomic():
            host = trust.admit(update.host, opened, received_at=received_at)
            if host is None:
                return None  # awaiting acceptance: nothing of it is stored
            (cannot,) = _apply([_Locked(host, update, taken_at, opened.text)], received_at=received_at)
            if cannot is not None:
                raise cannot
            return host
    except trust.MessageRejected as rejected:
        trust.reject_message(_KIND, rejected.reason, host_name=update.host, size_bytes=size_bytes,
                             received_at=received_at)
        raise UpdateRefused(rejected.reason, host_name=update.host) from None
    except _CannotApply as cannot:
        if cannot.may_come and may_wait is not None and may_wait(item):
            raise _Waits from None
        asked = cannot.ask_full and ask_for_full_snapshot(update.host, received_at=received_at)
        reason = cannot.reason + ("; a full snapshot was asked for" if asked else "")
        _record_refusal(reason, host_name=update.host, size_bytes=size_bytes, received_at=received_at,
                        on_host=False)
        raise UpdateRefused(reason, host_name=update.host, full_requested=asked) from None


def _opened(message: Any, *, received_at: datetime) -> OpenedUpdate:
    """The message opened and decoded; ``UpdateRefused``, recorded, when it cannot be."""
    claimed = _claimed_host_name(message)
    try:
        opened = open_envelope(message, MessageKind.SNAPSHOT_UPDATE, max_text_chars=update_max_bytes())
    except BadMessage as error:
        reason = f"snapshot update not signed by a host key: {error}"
        trust.reject_message(_KIND, reason, host_name=claimed, size_bytes=_message_size(message),
                             received_at=received_at)
        raise UpdateRefused(reason, host_name=claimed) from None
    try:
        update, taken_at = _decoded(opened, received_at=received_at)
    except BadUpdate as error:
        # Only the host's own key may put an error on its page.
        on_host = bool(claimed) and trust.is_accepted_key(claimed, opened)
        _record_refusal(str(error), host_name=claimed, size_bytes=len(opened.text), received_at=received_at,
                        on_host=on_host)
        raise UpdateRefused(str(error), host_name=claimed) from None
    return OpenedUpdate(update, opened, taken_at)


# wait(i, opened): whether messages[i] may wait (the caller then keeps ``opened`` to give again).
Wait = Callable[[int, OpenedUpdate], bool]


def receive_snapshot_updates(messages: Sequence[Any], *, done: Callable[[int], None],
                             received_at: datetime | None = None, wait: Wait | None = None,
                             behind: Collection[str] = ()) -> None:
    """Apply a batch of snapshot update messages as they came off the broker, each as
    ``receive_snapshot_update`` would (refused ones recorded the same way). ``done(i)`` is called for
    ``messages[i]`` once its outcome is committed, applied or refused; a ``DatabaseError`` raised
    leaves the rest to be given again.

    ``wait(i, opened)``: whether ``messages[i]``, an update newer than its host's latest snapshot but of
    a base not stored yet, may wait for that base (its full snapshot, in the other queue, may not have
    been ingested yet: a backlog drains both queues at their own pace), or one of a stored base whose
    earlier updates are not applied yet may wait for them (another worker taking ``central.updates``
    may hold them: several central workers take it). True: the caller keeps
    ``opened`` and gives it again later in the message's place (not opened again), and the host's later
    updates in the batch wait behind it; False (or no ``wait``): it goes alone and is refused, and the
    host asked for a full snapshot. ``behind``: hosts of which the caller keeps an update waiting; their
    updates here are offered to wait behind it before anything else.

    The common case, a signed update of an accepted host that applies, is applied for all of them in
    one transaction: the hosts' rows locked together (in id order, as another batch would), what the
    updates read read once for all, each host's writes as alone (``_apply``) but kept and written
    together (``statements.deferred``). Every other message (a bad signature or text, a host not
    accepted, an update that does not apply, a second one of a host in the batch) then goes through
    ``receive_snapshot_update`` alone, in the batch's order: one home for every refusal."""
    received_at = received_at or timezone.now()
    items: dict[int, OpenedUpdate] = {}  # by position: each message that opened
    batch: dict[str, int] = {}  # by host: the position of its one update in the common case
    alone: list[int] = []
    waited: set[int] = set()  # neither done nor alone: the caller gives them again
    for index, message in enumerate(messages):
        item = _opened_update(message, received_at=received_at)
        if item is None:
            alone.append(index)
            continue
        items[index] = item
        if item.update.host in behind and wait is not None and wait(index, item):
            waited.add(index)
        elif item.update.host in batch:
            alone.append(index)
        else:
            batch[item.update.host] = index
    if batch:
        with transaction.atomic():
            admitted = _lock_hosts({host: (index, items[index]) for host, index in batch.items()})
            outcomes = _apply([locked for _, locked in admitted], received_at=received_at)
        applied = {index for (index, _), cannot in zip(admitted, outcomes, strict=True) if cannot is None}
        waited |= {index for (index, _), cannot in zip(admitted, outcomes, strict=True)
                   if cannot is not None and cannot.may_come and wait is not None
                   and wait(index, items[index])}
        handled = applied | waited
        alone.extend(index for index in batch.values() if index not in handled)
        for index in sorted(applied):
            done(index)
        logger.debug("applied %d snapshot updates of %d together", len(applied), len(messages))
    waiting = {items[index].update.host for index in waited}  # their hosts' later updates wait behind them
    tried_together = set(batch.values())
    for index in sorted(alone):
        item = items.get(index)
        if wait is not None and item is not None and item.update.host in waiting and wait(index, item):
            continue
        # One after its host's earlier one in the batch may find a gap (another worker holds the update
        # between them): it may wait as its host's first was offered to, where it was not offered yet.
        may_wait = None if wait is None or index in tried_together else partial(wait, index)
        try:
            _receive(messages[index] if item is None else item, received_at=received_at, may_wait=may_wait)
        except _Waits:
            waiting.add(items[index].update.host)
            continue
        except UpdateRefused as refused:
            logger.warning("refused a snapshot update from %s: %s", refused.host_name or "an unknown host",
                           refused)
        done(index)


class _Locked(NamedTuple):
    """An update and its host, whose row is locked and whose accepted key signed it: one to apply."""

    host: Host
    update: SnapshotUpdate
    taken_at: datetime
    text: str  # as signed: stored beside the document


def _opened_update(message: Any, *, received_at: datetime) -> OpenedUpdate | None:
    """The message opened and decoded (as given, when it is already), or None when it fails a check
    made before the database (the message then goes alone, which records why)."""
    if isinstance(message, OpenedUpdate):
        return message
    try:
        opened = open_envelope(message, MessageKind.SNAPSHOT_UPDATE, max_text_chars=update_max_bytes())
        update, taken_at = _decoded(opened, received_at=received_at)
    except (BadMessage, BadUpdate):
        return None
    return OpenedUpdate(update, opened, taken_at)


def _decoded(opened: Opened, *, received_at: datetime) -> tuple[SnapshotUpdate, datetime]:
    """The update a signed text is, and its moment (never after ``received_at``); ``BadUpdate``."""
    update = decode_update(opened.text)
    if not HOST_NAME_PATTERN.fullmatch(update.host):
        raise BadUpdate(f"host name {update.host[:80]!r} is not a host name")
    taken_at = parse_taken_at(update.taken_at)
    if taken_at > received_at + MAX_CLOCK_AHEAD:
        raise BadUpdate(f"taken_at {update.taken_at} is more than {MAX_CLOCK_AHEAD} ahead of central")
    return update, min(taken_at, received_at)


def _lock_hosts(by_name: dict[str, tuple[int, OpenedUpdate]]) -> list[tuple[int, _Locked]]:
    """Lock the hosts' rows, in id order; the positions of the updates (by host name) whose host's
    accepted key signed them, with their hosts (anything else, ``trust.admit``'s business, goes alone)."""
    admitted = []
    for row in _LOCK_HOSTS.rows(names=sorted(by_name)):
        host = Host.from_db(Host.objects.db, trust.HOST_COLUMNS, row)
        index, item = by_name[host.name]
        if host.key_accepted and host.public_key == item.opened.public_key:
            admitted.append((index, _Locked(host, item.update, item.taken_at, item.opened.text)))
    return admitted


def ask_for_full_snapshot(host_name: str, *, received_at: datetime) -> bool:
    """Ask the host for a full snapshot, unless it was asked within the last probe interval (a burst of
    replayed or stale updates must not become a burst of probes); whether it was asked now."""
    interval = timedelta(seconds=settings.GPUADMIN_PROBE_INTERVAL_SECONDS)
    asked = Host.objects.filter(name=host_name, key_accepted_at__isnull=False).exclude(
        full_snapshot_requested_at__gt=received_at - interval,
    ).update(full_snapshot_requested_at=received_at)
    if asked:
        transaction.on_commit(partial(request_probe, host_name, full=True), robust=True)
    return bool(asked)


def _apply(items: list[_Locked], *, received_at: datetime) -> list[_CannotApply | None]:
    """Apply decoded updates, each to its host whose row the caller locked (one item per host); for
    each, None when applied or the _CannotApply that says why it does not fit (nothing of it written).
    What they read is read for all of them at once, and what they write written together."""
    if not items:
        return []
    host_ids = [item.host.pk for item in items]
    latest, stored_gpus, top_holders = _read_stored(host_ids)
    outcomes: list[_CannotApply | None] = []
    applied: list[tuple[_Locked, dict[str, _StoredGpu]]] = []
    for item in items:
        gpus = {row[1]: _StoredGpu(row) for row in stored_gpus[item.host.pk]}
        try:
            _check(item, latest.get(item.host.pk), gpus)
        except _CannotApply as cannot:
            outcomes.append(cannot)
            continue
        outcomes.append(None)
        applied.append((item, gpus))
    if applied:
        with pipelined():
            with deferred():
                for item, gpus in applied:
                    _write(item, gpus, received_at=received_at)
                moved = _record_process_memory([item for item, _ in applied])
                snapshot_updates_storing.send(sender=Host, updates=[
                    UpdateStoring(item.host, item.update, item.taken_at) for item, _ in applied])
            # What the fleet page reads, after the rows it is computed from are written.
            applied_hosts = [item.host.pk for item, _ in applied]
            summary.refresh_updated_figures(applied_hosts, now=received_at, recheck=[
                host_id for host_id in applied_hosts
                if summary.top_holder_may_change(top_holders.get(host_id), moved.get(host_id, ()))])
    return outcomes


def _read_stored(host_ids: list[int]) -> tuple[dict[int, tuple[str, int]], dict[int, list[tuple[Any, ...]]],
                                                dict[int, summary.TopHolder]]:
    """By host: the stored latest snapshot's base digest and last applied update, the present GPUs'
    rows (``_STORED_GPUS``'s, less the host) and the summary's top holder, in one round trip."""
    stored_gpus: dict[int, list[tuple[Any, ...]]] = {host_id: [] for host_id in host_ids}
    with pipelined():
        latest_rows, gpu_rows = _LATEST.start(hosts=host_ids), _STORED_GPUS.start(hosts=host_ids)
        top_holders = summary.start_reading_top_holders(host_ids)
        latest = {host_id: (base, sequence) for host_id, base, sequence in latest_rows.rows()}
        for row in gpu_rows.rows():
            stored_gpus[row[0]].append(row[1:])
        return latest, stored_gpus, top_holders()


def _check(item: _Locked, latest: tuple[str, int] | None, gpus: dict[str, _StoredGpu]) -> None:
    """Raise _CannotApply when the update does not fit its host's stored latest snapshot."""
    cannot = _unfit(item.update, item.taken_at, item.host.last_snapshot_taken_at, latest)
    if cannot is not None:
        raise cannot
    unknown = [g.uuid for g in item.update.gpus if g.uuid not in gpus]
    if unknown:
        raise _CannotApply(f"update names GPU {unknown[0][:40]!r}, which the latest snapshot does not have",
                           ask_full=True)


def _unfit(update: SnapshotUpdate, taken_at: datetime, last_snapshot_taken_at: datetime | None,
           latest: tuple[str, int] | None) -> _CannotApply | None:
    """Why the update does not follow the host's latest snapshot (``latest``: its base digest and last
    applied update; None before the first), or None when it is the next."""
    known_base = latest is not None and latest[0] == update.base
    applied = latest[1] if latest is not None else 0
    if known_base and update.sequence <= applied:
        return _CannotApply(f"update {update.sequence} of this base is replayed or late (update {applied} is "
                            "applied)", ask_full=False)
    # Superseded by a newer snapshot (a full one that overtook it, of another base): late, not a loss.
    if last_snapshot_taken_at is not None and taken_at <= last_snapshot_taken_at:
        return _CannotApply(f"update taken at {update.taken_at} is not newer than the latest snapshot",
                            ask_full=False)
    if not known_base:
        return _CannotApply(f"update of an unknown base {update.base[:20]}... (not the latest full snapshot)",
                            ask_full=True, may_come=True)
    if update.sequence != applied + 1:
        return _CannotApply(f"updates {applied + 1} to {update.sequence - 1} of this base are missing",
                            ask_full=True, may_come=True)
    return None


# What a host's rows say of the snapshots it sent: its latest snapshot's moment, and its base and the
# updates of it applied (None before its first full snapshot is stored).
HostProgress = tuple[datetime | None, tuple[str, int] | None]


def waited_on(items: Sequence[OpenedUpdate]) -> list[HostProgress | None]:
    """For each update that waits (``wait``), what its host's rows say now (``HostProgress``) while what
    it waits for is still to come (its base not stored while it is newer than the latest snapshot, or
    the updates before it not applied), else None: given again now, it is decided (applied or refused).
    Read for all at once without a lock. A host whose progress changed moved (what an update waits for
    came in turn, or a full snapshot); a read that is already stale costs an offer or a second's wait,
    never a wrong outcome: the locked check decides."""
    if not items:
        return []
    stored: dict[str, HostProgress] = {
        name: (last_taken_at, None if base is None else (base, sequence))
        for name, last_taken_at, base, sequence
        in _WAITED_ON.rows(names=sorted({item.update.host for item in items}))}
    progress: list[HostProgress | None] = []
    for item in items:
        host = stored.get(item.update.host)
        cannot = None if host is None else _unfit(item.update, item.taken_at, *host)
        progress.append(host if cannot is not None and cannot.may_come else None)
    return progress


def _write(item: _Locked, gpus: dict[str, _StoredGpu], *, received_at: datetime) -> None:
    """An update that fits: the host's facts and GPU rows, its raw samples where due, the GPUs' idle
    time and the update beside the document (inside ``deferred()``: written with the batch's)."""
    host, update, taken_at = item.host, item.update, item.taken_at
    attributed = {g.uuid: g.process_memory_bytes for g in update.gpus}
    # What update_idle_since reads of a snapshot's GPUs.
    idle_input = {"gpus": [{"uuid": g.uuid, "utilization_percent": g.utilization_percent}
                           for g in update.gpus]}
    counts = update.process_counts
    record.decide_host_sample(host, zombies=counts.zombies, uninterruptible=counts.uninterruptible,
                              pids_in_use=update.pids_in_use, pid_max=host.pid_max or 0, taken_at=taken_at)
    record.decide_gpu_samples(((gpus[g.uuid], _gpu_figures(g)) for g in update.gpus), taken_at=taken_at)
    host.last_seen_at = received_at
    host.last_snapshot_taken_at = taken_at
    host.pids_in_use = update.pids_in_use
    host.process_count = counts.total
    host.zombie_count = counts.zombies
    host.last_error, host.last_error_at = "", None
    _UPDATE_HOST.run([(host.pk, *(getattr(host, name) for name in _HOST_UPDATE_FIELDS))])
    _UPDATE_LATEST.run([(host.pk, taken_at, received_at, update.sequence, ValidatedJson(item.text))])
    _SET_GPU_FIGURES.run([
        (gpus[g.uuid].pk, g.memory_used_bytes, g.process_memory_bytes, g.utilization_percent, received_at,
         gpus[g.uuid].sampled_at, *(gpus[g.uuid].sampled or ()))
        for g in update.gpus
    ])
    record.record_samples(host, gpus.values(), process_count=counts.total, taken_at=taken_at)
    record.update_idle_since(gpus, idle_input, attributed, taken_at=taken_at)


class _StoredGpu:
    """A GPU row as an update reads it (``record.GpuRow``)."""

    __slots__ = ("idle_since", "pk", "sampled", "sampled_at", "uuid")

    def __init__(self, row: tuple[Any, ...]) -> None:
        """``row``: _STORED_GPUS's, less the host."""
        self.pk, self.uuid, self.idle_since, self.sampled_at = row[:4]
        self.sampled: record.Figures | None = row[4:]


def _gpu_figures(g: GpuFigures) -> record.Figures:
    """A GPU's figures in an update as ``record.gpu_figures`` reads them from a full snapshot (what its
    processes hold is the update's process_memory_bytes)."""
    health = g.health
    if health is None:
        return (g.memory_used_bytes, g.process_memory_bytes, g.utilization_percent, None, None, None)
    return (g.memory_used_bytes, g.process_memory_bytes, g.utilization_percent, health.temperature_celsius,
            health.power_draw_milliwatts, health.power_limit_milliwatts)


def _record_process_memory(items: list[_Locked]) -> dict[int, list[tuple[int, int]]]:
    """The named processes' memory on their open lives: a point when it moved past the step from the
    life's last point (as a full snapshot would write it); processes without a life are not history's.
    One read for every host's (inside ``deferred()``: the writes go with the batch's). By host, the
    lives whose memory moved: (life id, memory bytes now)."""
    wanted: dict[tuple[int, str, int, int], int] = {}
    for item in items:
        if item.update.processes:
            for p in item.update.processes:
                key = (item.host.pk, item.host.boot_id, p.pid, p.start_time_ticks)
                wanted[key] = memory_total_bytes(p.gpu_memory_bytes)
    if not wanted:
        return {}
    taken_at = {item.host.pk: item.taken_at for item in items}
    step = settings.GPUADMIN_HISTORY_PROCESS_STEP_BYTES
    points, changed = [], []
    moved: dict[int, list[tuple[int, int]]] = {}
    for pk, host_id, boot_id, pid, start, point, peak, state, last in _NAMED_OPEN_LIVES.rows(list(wanted)):
        total = wanted[(host_id, boot_id, pid, start)]
        new_point = point
        if point is None or abs(total - point) > step:
            points.append((pk, taken_at[host_id], total, state or "R"))
            new_point = total
        # An update names what moved since its base, so the same memory again and again until the
        # next full snapshot: a life whose values stay is not rewritten.
        if (total, new_point) != (last, point):
            changed.append((pk, total, max(peak, total), new_point))
        if total != last:
            moved.setdefault(host_id, []).append((pk, total))
    _LIVES_MEMORY.run(changed)
    record.POINT_INSERT.run(points)
    return moved


def _record_refusal(reason: str, *, host_name: str, size_bytes: int, received_at: datetime,
                    on_host: bool) -> None:
    logger.warning("snapshot update from %s refused: %s", host_name or "an unknown host", reason)
    with transaction.atomic():
        SnapshotRejection.objects.create(host_name=host_name, message_kind=_KIND, received_at=received_at,
                                         size_bytes=min(size_bytes, INT32_MAX), error=reason)
        if host_name and on_host:
            Host.objects.filter(name=host_name).update(last_error=reason, last_error_at=received_at)


def _claimed_host_name(message: Any) -> str:
    """The host a message claims to be from (it proves nothing before its signature is checked)."""
    text = message.get("text") if isinstance(message, dict) else None
    found = _CLAIMED_HOST.search(text[:65536]) if isinstance(text, str) else None
    return found.group(1) if found else ""


def _message_size(message: Any) -> int:
    text = message.get("text") if isinstance(message, dict) else message
    return len(text) if isinstance(text, str | bytes) else 0
