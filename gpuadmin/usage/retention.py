"""How long the usage ledger is kept: ``GPUADMIN_USAGE_DAYS`` (400 by default), longer than raw
history. Pruned in bounded batches by the ``maintain_usage`` task, which also writes what silent
hosts' cursors still hold (a host that stopped sending has no next snapshot to flush it)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.utils import timezone

from gpuadmin.fleet.history.retention import PRUNE_BATCH_ROWS, PRUNE_MAX_BATCHES, _delete_in_batches
from gpuadmin.usage import ledger
from gpuadmin.usage.models import DigestMessage, LifeUsage, UsageCursor, UsageDay


@dataclass(frozen=True)
class UsageMaintenance:
    hosts_flushed: int
    days_pruned: int
    lives_pruned: int
    digests_pruned: int


def usage_kept_since(now: datetime) -> datetime:
    return now - timedelta(days=settings.GPUADMIN_USAGE_DAYS)


def maintain_usage(now: datetime | None = None, *, batch_rows: int = PRUNE_BATCH_ROWS,
                   max_batches: int = PRUNE_MAX_BATCHES) -> UsageMaintenance:
    now = now or timezone.now()
    cutoff = usage_kept_since(now)
    batches = {"batch_rows": batch_rows, "max_batches": max_batches}
    stale = now - timedelta(seconds=settings.GPUADMIN_USAGE_FLUSH_SECONDS)
    # Silent: not heard from (central's clock) for a window. A cursor's times are its host's clock, which
    # may lag central's: a host still sending is settled by ingest a window of its own clock apart, and
    # would otherwise be settled again at every run here.
    flushed = ledger.flush_all(UsageCursor.objects.filter(settled_at__lt=stale, host__last_seen_at__lt=stale))
    return UsageMaintenance(
        hosts_flushed=flushed,
        days_pruned=_delete_in_batches(UsageDay.objects.filter(day__lt=cutoff.astimezone(UTC).date()),
                                       **batches),
        lives_pruned=_delete_in_batches(LifeUsage.objects.filter(last_at__lt=cutoff), **batches),
        digests_pruned=_delete_in_batches(DigestMessage.objects.filter(created_at__lt=cutoff), **batches),
    )
