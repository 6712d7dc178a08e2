"""Celery tasks of the fleet app (central side), and the services that send probes.

The tasks are thin: ingest lives in ``gpuadmin.fleet.ingest``. Probes are sent
by name (``gpuadmin.agent.probe_host``) to the host's own queue, so central
never imports agent code; each carries ``expires`` = one probe interval, so
the probes queued for a host that is offline are dropped, not run in a burst
when it comes back.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from gpuadmin.celery import CENTRAL_QUEUE, app, host_queue
from gpuadmin.fleet.ingest import ingest_snapshot
from gpuadmin.fleet.models import Host
from gpuadmin.fleet.validation import SnapshotRejected

logger = logging.getLogger(__name__)

PROBE_TASK = "gpuadmin.agent.probe_host"
# A host offline this long is probably down or gone: probe it once a minute only.
LONG_OFFLINE_AFTER = timedelta(hours=1)
LONG_OFFLINE_PROBE_EVERY = timedelta(minutes=1)
INGEST_MAX_RETRIES = 8
INGEST_RETRY_BACKOFF_MAX_SECONDS = 300


@app.task(
    name="gpuadmin.fleet.ingest_snapshot",
    queue=CENTRAL_QUEUE,
    bind=True,
    # A rejection is final and is not a DatabaseError; the database being down
    # or locked is worth waiting for, with growing pauses.
    autoretry_for=(DatabaseError,),
    retry_backoff=2,
    retry_backoff_max=INGEST_RETRY_BACKOFF_MAX_SECONDS,
    retry_jitter=True,
    max_retries=INGEST_MAX_RETRIES,
)
def ingest_snapshot_task(self, snapshot_json: str) -> str | None:
    """Store one snapshot sent by an agent; return its host name (None when rejected)."""
    try:
        return ingest_snapshot(snapshot_json).name
    except SnapshotRejected as rejected:
        # Recorded by ingest (rejection log, host page); retrying cannot fix the payload.
        logger.warning("rejected a snapshot from %s: %s", rejected.host_name or "an unknown host", rejected)
        return None


@app.task(name="gpuadmin.fleet.schedule_probes", queue=CENTRAL_QUEUE)
def schedule_probes() -> int:
    """Send the probes that are due (run by beat every probe interval); return how many."""
    return len(send_due_probes())


def probe_expiry_seconds() -> int:
    return settings.GPUADMIN_PROBE_INTERVAL_SECONDS


def request_probe(host_name: str, *, now: datetime | None = None) -> None:
    """Probe one host now (the host page's "probe now"); dropped if its agent does not take it in time."""
    _send_probe(host_name)
    Host.objects.filter(name=host_name).update(last_probe_sent_at=now or timezone.now())


def send_due_probes(now: datetime | None = None) -> list[str]:
    """Send a probe to every known host that is due one; return their names.

    Every host is due each interval, except hosts offline for more than
    LONG_OFFLINE_AFTER, which are due once per LONG_OFFLINE_PROBE_EVERY (their
    probes still expire, so an agent that comes back runs at most one).
    """
    now = now or timezone.now()
    due = [
        (host.pk, host.name)
        for host in Host.objects.only("pk", "name", "last_seen_at", "first_seen_at", "last_probe_sent_at")
        if _probe_due(host, now)
    ]
    for _, name in due:
        _send_probe(name)
    if due:
        Host.objects.filter(pk__in=[pk for pk, _ in due]).update(last_probe_sent_at=now)
    return [name for _, name in due]


def _probe_due(host: Host, now: datetime) -> bool:
    last_heard_at = host.last_seen_at or host.first_seen_at
    if now - last_heard_at <= LONG_OFFLINE_AFTER:
        return True
    if host.last_probe_sent_at is None:
        return True
    # A little slack: beat's ticks are not exactly one interval apart.
    slack = timedelta(seconds=probe_expiry_seconds() / 2)
    return now - host.last_probe_sent_at >= LONG_OFFLINE_PROBE_EVERY - slack


def _send_probe(host_name: str) -> None:
    app.send_task(PROBE_TASK, queue=host_queue(host_name), expires=probe_expiry_seconds())
