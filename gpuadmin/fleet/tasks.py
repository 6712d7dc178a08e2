"""Celery tasks of the fleet app (central side): thin wrappers over services.

Ingest lives in ``gpuadmin.fleet.intake.ingest``, probe scheduling in
``gpuadmin.fleet.probes``; here are only the retry policies and the names.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from django.db import DatabaseError

from gpuadmin.celery import CENTRAL_QUEUE, app
from gpuadmin.fleet import summary
from gpuadmin.fleet.history.retention import maintain_history
from gpuadmin.fleet.intake import trust
from gpuadmin.fleet.intake.ingest import receive_snapshot
from gpuadmin.fleet.intake.updates import receive_snapshot_update
from gpuadmin.fleet.intake.validation import SnapshotRejected
from gpuadmin.wire.task_names import (
    INGEST_SNAPSHOT,
    INGEST_SNAPSHOT_UPDATE,
    MAINTAIN_HISTORY,
)

logger = logging.getLogger(__name__)

INGEST_MAX_RETRIES = 8
# The first pause after a DatabaseError; each next one twice the last, up to the max. Snapshot updates
# taken in batches (update_batches) wait the same.
INGEST_RETRY_BACKOFF_SECONDS = 2
INGEST_RETRY_BACKOFF_MAX_SECONDS = 300


# A rejection is final and is not a DatabaseError; the database being down or locked is worth waiting
# for, with growing pauses. For snapshots and snapshot updates alike.
_INGEST_RETRY: dict[str, Any] = {
    "autoretry_for": (DatabaseError,),
    "retry_backoff": INGEST_RETRY_BACKOFF_SECONDS,
    "retry_backoff_max": INGEST_RETRY_BACKOFF_MAX_SECONDS,
    "retry_jitter": True,
    "max_retries": INGEST_MAX_RETRIES,
}


@app.task(name=INGEST_SNAPSHOT, queue=CENTRAL_QUEUE, bind=True, **_INGEST_RETRY)
def ingest_snapshot_task(self: Task, message: Any) -> str | None:
    """Store one signed snapshot sent by an agent; return its host name (None when not stored)."""
    try:
        host = receive_snapshot(message)
    except SnapshotRejected as rejected:
        # Recorded by ingest (rejection log, host page); retrying cannot fix the payload.
        logger.warning("rejected a snapshot from %s: %s", rejected.host_name or "an unknown host", rejected)
        return None
    return host.name if host is not None else None


# Snapshot updates are sent to central.updates and taken in batches there (update_batches); this task
# applies those that reach `central` by name: sent by an older agent, or queued before an upgrade.
@app.task(name=INGEST_SNAPSHOT_UPDATE, queue=CENTRAL_QUEUE, bind=True, **_INGEST_RETRY)
def ingest_snapshot_update_task(self: Task, message: Any) -> str | None:
    """Apply one signed snapshot update sent by an agent; return its host name (None when not applied:
    refused, or a full snapshot asked for instead)."""
    try:
        host = receive_snapshot_update(message)
    except SnapshotRejected as refused:
        logger.warning("refused a snapshot update from %s: %s", refused.host_name or "an unknown host",
                       refused)
        return None
    return host.name if host is not None else None


@app.task(name=MAINTAIN_HISTORY, queue=CENTRAL_QUEUE)
def maintain_history_task() -> dict[str, int]:
    """Roll up and prune history in bounded steps (beat, every 5 minutes), withdraw expired host key
    offers (else they would go only when a new host offers), and give a summary to hosts without one;
    return what it did."""
    result = maintain_history()
    return {"buckets_rolled_up": result.buckets_rolled_up,
            "coarse_buckets_rolled_up": result.coarse_buckets_rolled_up, "rows_pruned": result.pruned.total,
            "partitions_created": result.partitions_created,
            "partitions_dropped": len(result.partitions_dropped), "offers_expired": trust.expire_offers(),
            "summaries_filled": summary.fill_missing()}
