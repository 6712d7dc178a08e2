"""After a kill: the next snapshots of the host confirm how much GPU memory
came back (recorded once per request), and close the "unkillable" findings
of processes that have since gone.

Called from the fleet app's ``snapshot_ingested`` signal, after the snapshot
committed.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from gpuadmin.fleet.models import Finding, Host
from gpuadmin.fleet.process_tree import process_rows
from gpuadmin.fleet.validation import document_taken_at
from gpuadmin.kills import memory
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.services.auditing import audit
from gpuadmin.kills.states import Status
from gpuadmin.text import human_bytes

logger = logging.getLogger(__name__)

# The driver may free a dead process's memory a little later: until this long
# after the kill finished, a snapshot showing less than expected is not final.
SETTLE_SECONDS = 60
# Requests that finished longer ago than this are not waited on any more.
WATCH_FOR = timedelta(hours=6)
# Results after which some target may have gone and memory may have come back.
RELEASING = (Status.SUCCEEDED, Status.UNKILLABLE, Status.FAILED)


def confirm_released(host: Host, document: dict[str, Any], *, now: datetime | None = None) -> list[int]:
    """Record released memory for the host's finished requests this snapshot settles; their ids."""
    now = now or timezone.now()
    taken_at = document_taken_at(document)
    if taken_at is None:
        return []
    candidates = KillRequest.objects.filter(
        host=host, status__in=RELEASING, memory_confirmed_at__isnull=True,
        finished_at__isnull=False, finished_at__lt=taken_at, finished_at__gte=now - WATCH_FOR,
    ).values_list("pk", flat=True)
    confirmed: list[int] = []
    for kill_request_id in list(candidates):
        if _confirm_one(kill_request_id, document, taken_at):
            confirmed.append(kill_request_id)
    return confirmed


def _confirm_one(kill_request_id: int, document: dict[str, Any], taken_at: datetime) -> bool:
    with transaction.atomic():
        kill_request = KillRequest.objects.select_for_update().select_related("host").get(pk=kill_request_id)
        if kill_request.memory_confirmed_at is not None or kill_request.finished_at is None:
            return False
        if not kill_request.targets.filter(outcome__in=("exited", "exited_not_reaped")).exists():
            return False  # nothing went, so nothing came back to confirm
        base = kill_request.memory_baseline
        if not base.get("targets"):
            return False
        outcome = memory.release(base, document)
        settled = (taken_at - kill_request.finished_at).total_seconds() >= SETTLE_SECONDS
        if not outcome.complete and not settled:
            return False  # the driver may still be freeing it; a later snapshot decides
        kill_request.memory_released_bytes = outcome.released_bytes
        kill_request.memory_confirmed_at = taken_at
        kill_request.save(update_fields=["memory_released_bytes", "memory_confirmed_at"])
        audit(
            "memory_released", kill_request,
            details={
                "expected_bytes": outcome.expected_bytes,
                "released_bytes": outcome.released_bytes,
                "released": human_bytes(outcome.released_bytes),
                "expected": human_bytes(outcome.expected_bytes),
                "per_gpu": outcome.per_gpu,
                "still_holding": outcome.still_holding,
                "snapshot_taken_at": document.get("taken_at"),
            },
        )
    return True


def resolve_gone_unkillable(host: Host, document: dict[str, Any], *, now: datetime | None = None) -> int:
    """Close "unkillable" findings whose process this snapshot no longer shows (same boot, same start)."""
    now = now or timezone.now()
    rows = process_rows(document)
    boot_id = document.get("host", {}).get("boot_id")
    resolved = 0
    for finding in Finding.objects.filter(host=host, kind=Finding.Kind.UNKILLABLE, resolved_at__isnull=True):
        pid = finding.details.get("pid")
        start = finding.details.get("start_time_ticks")
        row = rows.get(pid) if isinstance(pid, int) else None
        same_boot = finding.details.get("boot_id") in (None, boot_id)
        if same_boot and row is not None and row.start_time_ticks == start:
            finding.last_seen_at = now
            finding.save(update_fields=["last_seen_at"])
            continue
        finding.resolved_at = now
        finding.save(update_fields=["resolved_at"])
        resolved += 1
    return resolved


def on_snapshot_ingested(sender: Any, host: Host, document: dict[str, Any], **kwargs: Any) -> None:
    try:
        resolve_gone_unkillable(host, document)
        confirm_released(host, document)
    except Exception:
        # A receiver error must not look like a failed ingest: the snapshot is stored.
        logger.exception("kills: could not check released memory after a snapshot of %s", host)
