"""Sending tasks to the other side: the helpers central and the agent share, beside the Celery app.

Tasks cross the broker by name (``gpuadmin.wire.task_names``), so a sender
imports none of the receiving side's code: central asks for a probe without
loading the agent, and the agent sends its snapshot without loading ingest.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from gpuadmin.celery import CENTRAL_QUEUE, CENTRAL_UPDATES_QUEUE, app, host_queue
from gpuadmin.wire.signing import compress_envelope
from gpuadmin.wire.task_names import INGEST_SNAPSHOT, INGEST_SNAPSHOT_UPDATE, PROBE_HOST


def probe_expiry_seconds() -> int:
    # One interval: a probe the agent has not taken by then is superseded by the
    # next one, so the probes queued for an offline host are dropped, not run in
    # a burst when it comes back.
    return settings.GPUADMIN_PROBE_INTERVAL_SECONDS


def request_probe(host_name: str, *, full: bool = False) -> None:
    """Ask a host's agent for a snapshot now: the one way anything sends ``probe_host``.

    Sent by name to the host's own queue, expiring after one probe interval. The agent's own clock
    (``gpuadmin.agent.probing.ProbeClock``), "probe now" (``gpuadmin.fleet.probes``) and a full
    snapshot asked for come through here. No database: the agent calls it.
    ``full``: a full snapshot, not an update (central could not apply the host's update).
    """
    # Only when asked: a probe request stays what older agents read.
    extra: dict[str, Any] = {"kwargs": {"full": True}} if full else {}
    app.send_task(PROBE_HOST, queue=host_queue(host_name), expires=probe_expiry_seconds(), **extra)


def snapshot_expiry_seconds() -> float:
    # A snapshot central could not ingest within the offline window is stale:
    # the page already shows the host offline and a fresh probe is on its way.
    return float(settings.GPUADMIN_PROBE_INTERVAL_SECONDS * settings.GPUADMIN_OFFLINE_AFTER_INTERVALS)


def send_snapshot(message: dict[str, Any]) -> None:
    """Send a signed snapshot to central's ingest (the agent's probe, the demo's driver), its text
    compressed (``compress_envelope``): a 200-process snapshot's ~114 KB of JSON, escaped and base64'd on
    the way, would otherwise be ~170 KB in the broker, which every worker that takes it copies, encodes and
    decodes several times (benchmarks/README.md)."""
    app.send_task(INGEST_SNAPSHOT, args=[compress_envelope(message)], queue=CENTRAL_QUEUE,
                  expires=snapshot_expiry_seconds())


def send_snapshot_update(message: dict[str, Any]) -> None:
    """Send a signed snapshot update (what moved since the last snapshot) to central, in the queue that
    central's workers take in batches (``gpuadmin.fleet.update_batches``)."""
    app.send_task(INGEST_SNAPSHOT_UPDATE, args=[message], queue=CENTRAL_UPDATES_QUEUE,
                  expires=snapshot_expiry_seconds())
