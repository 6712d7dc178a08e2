"""Ingest: turn one snapshot from an agent into what central stores.

``receive_snapshot`` takes the message as it came off the broker: signed by
the host's own key (``gpuadmin.wire.signing``), or a rejected message
(``fleet.intake.trust``) that changes nothing. A rejected snapshot changes nothing
already stored: it leaves a ``SnapshotRejection`` row and, when the host's
accepted key signed it, the error on the host (shown on its page until a good
snapshot arrives). An accepted one is stored in one transaction: host facts,
latest document, GPUs, history, findings.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpuadmin.fleet import summary
from gpuadmin.fleet.findings import rules, sync
from gpuadmin.fleet.history import record, retention
from gpuadmin.fleet.intake import trust
from gpuadmin.fleet.intake.validation import (
    INT32_MAX,
    SnapshotRejected,
    host_name_from_text,
    parse_snapshot,
)
from gpuadmin.fleet.models import Gpu, Host, LatestSnapshot, SnapshotRejection
from gpuadmin.fleet.process_tree import ProcessRow, attributed_memory_bytes, process_rows
from gpuadmin.fleet.signals import snapshot_ingested, snapshot_storing
from gpuadmin.fleet.storage.json_text import ValidatedJson
from gpuadmin.fleet.storage.statements import (
    Param,
    PreparedQuery,
    PreparedUpdate,
    RowInsert,
    pipelined,
)
from gpuadmin.fleet.taken_at import parse_taken_at
from gpuadmin.wire.signing import BadMessage, MessageKind, canonical_json, envelope_text, open_envelope
from gpuadmin.wire.snapshot_update import snapshot_digest

logger = logging.getLogger(__name__)

_HOST_SNAPSHOT_FIELDS = [
    "last_seen_at",
    "last_snapshot_taken_at",
    "boot_id",
    "kernel",
    "driver_version",
    "pid_max",
    "pids_in_use",
    "process_count",
    "zombie_count",
    "gpu_process_count",
    "gpu_backend_name",
    "gpu_backend_available",
    "gpu_backend_reason",
    "last_error",
    "last_error_at",
    "history_processes_mattering_count",
    "history_processes_kept_count",
    "sampled_at",
    *record.HOST_SAMPLED_FIELDS,
]
_GPU_UPDATE_FIELDS = [
    "index",
    "name",
    "memory_total_bytes",
    "memory_used_bytes",
    "memory_attributed_bytes",
    "utilization_percent",
    "present",
    "updated_at",
    "sampled_at",
    *record.GPU_SAMPLED_FIELDS,
]
# The statements every snapshot runs, compiled once (fleet.storage.statements). What
# host.save(update_fields=_HOST_SNAPSHOT_FIELDS) would run:
_UPDATE_HOST = PreparedUpdate(
    Host.objects.filter(pk=Param(Host, "id")), **{name: Param(Host, name) for name in _HOST_SNAPSHOT_FIELDS}
)
# The host's latest document, replaced (or stored, the first time) without asking whether it was there; a
# new base for the host's updates (fleet/intake/updates.py), none applied to it yet.
_LATEST_FIELDS = ["taken_at", "received_at", "document", "base_digest", "update_sequence", "update"]
_LATEST_UPSERT = RowInsert(LatestSnapshot, ["host", *_LATEST_FIELDS], conflict=["host"],
                           update=_LATEST_FIELDS)
# The host's GPUs as plain values, unordered (Gpu's default ordering would join the host row for its name).
_STORED_GPUS = PreparedQuery(
    Gpu.objects.filter(host=Param(Gpu, "host")).order_by()
    .values_list("pk", "uuid", "present", "idle_since", "sampled_at", *record.GPU_SAMPLED_FIELDS)
)
# A GPU row as a snapshot lists it; idle_since is record.update_idle_since's, never set here.
_GPU_UPSERT = RowInsert(Gpu, ["host", "uuid", *_GPU_UPDATE_FIELDS], conflict=["host", "uuid"],
                        update=_GPU_UPDATE_FIELDS, returning=["uuid", "id"])


def receive_snapshot(message: Any, *, received_at: datetime | None = None) -> Host | None:
    """Store a snapshot message as it came off the broker; the host, or None while it awaits acceptance.

    Raises ``SnapshotRejected`` for anything not stored: not signed, signed by
    another key than the host's (a rejected message, ``fleet.intake.trust``), or a
    document that does not validate.
    """
    received_at = received_at or timezone.now()
    try:
        # Verified before it is parsed; the size limit proper is checked by parse_snapshot.
        opened = open_envelope(message, MessageKind.SNAPSHOT, max_text_chars=_max_text_chars())
    except BadMessage as error:
        claimed, size_bytes = _claimed_host_and_size(message)
        reason = f"snapshot not signed by a host key: {error}"
        trust.reject_message(SnapshotRejection.MessageKind.SNAPSHOT, reason, host_name=claimed,
                             size_bytes=size_bytes, received_at=received_at)
        raise SnapshotRejected(reason, host_name=claimed) from None
    try:
        document = parse_snapshot(opened.text, now=received_at)
    except SnapshotRejected as rejected:
        # Only the host's own key may put an error on its page.
        verified = bool(rejected.host_name) and trust.is_accepted_key(rejected.host_name, opened)
        record_rejection(rejected, size_bytes=len(opened.text), received_at=received_at, on_host=verified)
        raise
    host_name = document["host"]["name"]
    try:
        # One transaction per snapshot: the key check and the storing, under one lock of the host row.
        with transaction.atomic():
            host = trust.admit(host_name, opened, received_at=received_at)
            if host is None:
                return None  # awaiting acceptance: nothing of it is stored
            return ingest_document(document, received_at=received_at, locked_host=host, text=opened.text)
    except trust.MessageRejected as rejected:
        trust.reject_message(SnapshotRejection.MessageKind.SNAPSHOT, rejected.reason, host_name=host_name,
                             size_bytes=len(opened.text), received_at=received_at)
        raise SnapshotRejected(rejected.reason, host_name=host_name) from None


def _max_text_chars() -> int:
    """The longest text a snapshot envelope is opened (or inflated) to: parse_snapshot checks the limit
    proper on the text, so this only bounds what is held before that."""
    return 4 * settings.GPUADMIN_SNAPSHOT_MAX_BYTES


def _clamped_taken_at(document: dict[str, Any], received_at: datetime) -> datetime:
    """When a validated snapshot was taken, as ingest reads it: never after it arrived (see
    ``ingest_document``)."""
    return min(parse_taken_at(document["taken_at"]), received_at)


def _claimed_host_and_size(message: Any) -> tuple[str, int]:
    """The host a message that failed its signature claims to be about (it proves nothing), and its
    text's size: inflated within the size limit if compressed (as it came, when it does not inflate),
    once for both."""
    text = message
    if isinstance(message, dict):
        try:
            text = envelope_text(message, max_text_chars=_max_text_chars())
        except BadMessage:
            text = message.get("text", message.get("zlib"))
    if not isinstance(text, str | bytes):
        return "", 0
    return host_name_from_text(text), len(text)


def ingest_document(
    document: dict[str, Any],
    *,
    received_at: datetime,
    locked_host: Host,
    text: str | None = None,
) -> Host:
    """Store one validated snapshot document; return its host.

    Snapshots can arrive out of order (several central workers, redelivery
    after a worker died). Only a snapshot taken after the stored latest one
    moves the host forward: latest document, host facts, GPUs, process lives
    and findings all describe "now", and an older reading must not overwrite
    a newer one. An older snapshot still adds its GPU and host samples to
    history (they are indexed by taken_at, so a late one fills its gap in the
    charts) unless that moment is already there; a snapshot taken at the same
    instant as the latest is a redelivery and changes nothing.

    A host's clock may run ahead of central's (validation refuses more than
    MAX_CLOCK_AHEAD): its taken_at is read as no later than its arrival, so
    one snapshot dated ahead never makes the newer ones look late.

    ``locked_host``: the document's host, whose row the caller's transaction
    has locked (``receive_snapshot``, after the key check: the only way in).
    ``text``: the JSON text ``document`` was parsed from (``parse_snapshot``), stored as the latest
    document as it is instead of encoding the document again (~125 KB for 200 processes).
    """
    taken_at = _clamped_taken_at(document, received_at)
    # No savepoint inside the caller's transaction: any error here fails the whole snapshot anyway.
    with transaction.atomic(savepoint=False):
        host = locked_host
        if host.last_snapshot_taken_at and taken_at <= host.last_snapshot_taken_at:
            _store_late(host, document, taken_at)
            return host

        rows = process_rows(document)
        attributed_bytes = attributed_memory_bytes(rows)
        mattering = record.mattering_rows(rows)
        previous_taken_at = host.last_snapshot_taken_at  # before _update_host moves it to this one
        # Writes go out without waiting for each answer; the reads in between wait for them.
        with pipelined():
            _update_host(host, document, rows, taken_at=taken_at, received_at=received_at,
                         mattering_count=len(mattering))
            _store_latest(host, document, taken_at=taken_at, received_at=received_at, text=text)
            gpus_by_uuid = _upsert_gpus(host, document, attributed_bytes, received_at=received_at,
                                        taken_at=taken_at)
            record.record_samples(host, gpus_by_uuid.values(),
                                  process_count=document["process_counts"]["total"], taken_at=taken_at)
            record.update_idle_since(gpus_by_uuid, document, attributed_bytes, taken_at=taken_at)
            boot_id = document["host"]["boot_id"]
            lives = record.record_process_lives(host, rows, boot_id=boot_id, taken_at=taken_at,
                                                previous_taken_at=previous_taken_at,
                                                mattering=mattering)
            facts = record.findings_facts(host, lives, gpus_by_uuid.values(), taken_at=taken_at,
                                          zombies=document["process_counts"]["zombies"])
            synced = sync.sync_findings(host, rules.compute_findings(document, facts, rows=rows), received_at)
            snapshot_storing.send(sender=Host, host=host, document=document, rows=rows, taken_at=taken_at)
            summary.refresh_host_summary(host.pk, now=received_at)  # what the fleet page reads of it
        transaction.on_commit(
            partial(snapshot_ingested.send, sender=Host, host=host, document=document,
                    open_finding_kinds=synced.open_kinds),
            robust=True,
        )
    return host


def record_rejection(rejected: SnapshotRejected, *, size_bytes: int, received_at: datetime,
                     on_host: bool = True) -> None:
    """Keep the refusal where people look: the rejection log and (``on_host``) the host's page."""
    logger.warning("snapshot from %s rejected: %s", rejected.host_name or "an unknown host", rejected.message)
    with transaction.atomic():
        SnapshotRejection.objects.create(
            host_name=rejected.host_name,
            received_at=received_at,
            size_bytes=min(size_bytes, INT32_MAX),
            error=rejected.message,
        )
        if rejected.host_name and on_host:
            # A rejected snapshot never creates a host: anyone on a GPU host can
            # send junk, and a name alone proves nothing.
            Host.objects.filter(name=rejected.host_name).update(
                last_error=rejected.message, last_error_at=received_at
            )


def _store_late(host: Host, document: dict[str, Any], taken_at: datetime) -> None:
    if retention.is_rolled_up(host, taken_at):
        # Its bucket is closed and its raw rows may be pruned already: rolling it up again would
        # summarise this sample alone (a replayed old snapshot would rewrite the past).
        logger.info("snapshot of %s taken at %s is older than its rolled-up history; ignored",
                    host.name, taken_at)
        return
    if taken_at == host.last_snapshot_taken_at or record.has_samples_at(host, taken_at):
        logger.info("snapshot of %s taken at %s already stored; ignored", host.name, taken_at)
        return
    logger.info("late snapshot of %s taken at %s: added to history only", host.name, taken_at)
    gpus_by_uuid = {g.uuid: g for g in host.gpus.filter(uuid__in=[g["uuid"] for g in document["gpus"]])}
    record.record_late_samples(
        host,
        document,
        gpus_by_uuid=gpus_by_uuid,
        attributed_bytes=attributed_memory_bytes(process_rows(document)),
        taken_at=taken_at,
    )


def _update_host(
    host: Host,
    document: dict[str, Any],
    rows: dict[int, ProcessRow],
    *,
    taken_at: datetime,
    received_at: datetime,
    mattering_count: int,
) -> None:
    facts = document["host"]
    backend = document["gpu_backend"]
    counts = document["process_counts"]
    host.last_seen_at = received_at
    host.last_snapshot_taken_at = taken_at
    host.boot_id = facts["boot_id"]
    host.kernel = facts.get("kernel") or ""
    host.driver_version = facts.get("driver_version") or ""
    host.pid_max = facts["pid_max"]
    host.pids_in_use = facts["pids_in_use"]
    host.process_count = counts["total"]
    host.zombie_count = counts["zombies"]
    # Holders of GPU memory or of a device file (gpu_holders, counted without its sort): both keep a GPU busy.
    host.gpu_process_count = sum(1 for row in rows.values() if row.holds_gpu)
    host.gpu_backend_name = backend["name"]
    host.gpu_backend_available = backend["available"]
    host.gpu_backend_reason = backend["reason"] or ""
    host.last_error = ""
    host.last_error_at = None
    # Shown on the host page when history kept only the cap's worth of them (record.capped).
    cap = settings.GPUADMIN_HISTORY_PROCESSES_PER_SNAPSHOT
    host.history_processes_mattering_count = mattering_count if mattering_count > cap else 0
    host.history_processes_kept_count = cap if mattering_count > cap else 0
    record.decide_host_sample(host, zombies=counts["zombies"], uninterruptible=counts["uninterruptible"],
                              pids_in_use=facts["pids_in_use"], pid_max=facts["pid_max"], taken_at=taken_at)
    # Named fields only: "probe now" writes probe_now_sent_at on the same row concurrently.
    _UPDATE_HOST.run(id=host.pk, **{name: getattr(host, name) for name in _HOST_SNAPSHOT_FIELDS})


def _store_latest(
    host: Host, document: dict[str, Any], *, taken_at: datetime, received_at: datetime, text: str | None
) -> None:
    # The validated text says the same as the document (nothing changes a parsed document): it is
    # stored as it is (a text column, fleet/storage/json_text.py), so the steady case encodes nothing.
    stored: Any = document if text is None else ValidatedJson(text)
    base_digest = snapshot_digest(canonical_json(document) if text is None else text)
    _LATEST_UPSERT.run([(host.pk, taken_at, received_at, stored, base_digest, 0, None)])


@dataclass(slots=True)
class ListedGpu:
    """A GPU of the snapshot as ingest goes on with it: its row's id, idle_since and last written sample
    (``record.GpuRow``; no model instance per GPU per snapshot: ingest needs a few of its values)."""

    uuid: str
    pk: int | None
    idle_since: datetime | None
    sampled_at: datetime | None = None
    sampled: record.Figures | None = None


def _upsert_gpus(
    host: Host, document: dict[str, Any], attributed_bytes: dict[str, int], *, received_at: datetime,
    taken_at: datetime,
) -> dict[str, ListedGpu]:
    """GPU rows as this snapshot lists them; GPUs it no longer lists stay, marked not present.

    The host's GPUs are read first (their ids, idle_since and last written samples), so that the upsert
    needs no read-back, writes each GPU's last written sample as this snapshot decides it
    (``record.decide_gpu_samples``), and a GPU is marked not present only when one is missing (the host
    row is locked: nothing else adds GPUs meanwhile).
    """
    stored = {row[1]: row for row in _STORED_GPUS.start(host=host.pk).rows()}
    listed = document["gpus"]
    gpus_by_uuid: dict[str, ListedGpu] = {}
    decided = []
    for g in listed:
        uuid = g["uuid"]
        before = stored.get(uuid)
        # The upsert leaves idle_since as stored; the id is the stored row's (a new GPU's: returned below).
        gpu = gpus_by_uuid[uuid] = (ListedGpu(uuid, before[0], before[3], before[4], tuple(before[5:]))
                                    if before is not None else ListedGpu(uuid, None, None))
        decided.append((gpu, record.gpu_figures(g, attributed_bytes.get(uuid, 0))))
    record.decide_gpu_samples(decided, taken_at=taken_at)
    rows = []
    for g in listed:
        gpu = gpus_by_uuid[g["uuid"]]
        values = {"index": g["index"], "name": g["name"], "memory_total_bytes": g["memory_total_bytes"],
                  "memory_used_bytes": g["memory_used_bytes"],
                  "memory_attributed_bytes": attributed_bytes.get(g["uuid"], 0),
                  "utilization_percent": g["utilization_percent"], "present": True, "updated_at": received_at,
                  "sampled_at": gpu.sampled_at}
        # Every listed GPU has a last written sample once decided (a new one: this snapshot's).
        values.update(zip(record.GPU_SAMPLED_FIELDS, gpu.sampled or (), strict=True))
        rows.append((host.pk, g["uuid"], *(values[name] for name in _GPU_UPDATE_FIELDS)))
    # Ids asked back for new GPUs only: the others' were read above.
    returned = _GPU_UPSERT.run(rows, returning=not stored.keys() >= gpus_by_uuid.keys())
    for uuid, pk in returned or []:
        gpus_by_uuid[uuid].pk = pk
    unlisted = [row[0] for uuid, row in stored.items() if row[2] and uuid not in gpus_by_uuid]
    if unlisted:
        Gpu.objects.filter(pk__in=unlisted).update(present=False, updated_at=received_at)
    unknown_ids = [uuid for uuid, gpu in gpus_by_uuid.items() if gpu.pk is None]
    if unknown_ids:
        # New GPUs, on a database that returns no ids from an upsert: read them back.
        for pk, uuid in Gpu.objects.filter(host=host, uuid__in=unknown_ids).values_list("pk", "uuid"):
            gpus_by_uuid[uuid].pk = pk
    return gpus_by_uuid
