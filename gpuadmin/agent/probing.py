"""The agent's probe: read this host with gpuadmin.probe, send the snapshot to central.

Runs on a GPU host's own queue (``host.<name>``). It needs the broker and
nothing else: it never opens the database, so a GPU host holds no database
credentials (an agent with an unreachable DATABASE_URL still delivers).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from celery.signals import worker_ready
from django.conf import settings

from gpuadmin.celery import CENTRAL_QUEUE, EXPIRES_SHARE_OF_PERIOD, app, host_queue

logger = logging.getLogger(__name__)

PROBE_TASK = "gpuadmin.agent.probe_host"
INGEST_TASK = "gpuadmin.fleet.ingest_snapshot"


def snapshot_json(host_name: str) -> str:
    """One snapshot of this host as JSON text (schema v1), options from GPUADMIN_* variables."""
    # Imported here so that loading the task modules (central imports them too)
    # does not load psutil and the GPU backends.
    from gpuadmin.probe import take_snapshot
    from gpuadmin.probe.config import ProbeConfig

    snapshot = take_snapshot(ProbeConfig.from_env(host_name=host_name))
    return json.dumps(snapshot, separators=(",", ":"))


def snapshot_expiry_seconds() -> float:
    # A snapshot central could not ingest within the offline window is stale:
    # the page already shows the host offline and a fresh probe is on its way.
    return float(settings.GPUADMIN_PROBE_INTERVAL_SECONDS * settings.GPUADMIN_OFFLINE_AFTER_INTERVALS)


def send_snapshot(snapshot_text: str) -> None:
    app.send_task(INGEST_TASK, args=[snapshot_text], queue=CENTRAL_QUEUE, expires=snapshot_expiry_seconds())


def probe_and_send() -> int:
    """Probe this host and send the snapshot to central; returns its size in bytes."""
    text = snapshot_json(settings.GPUADMIN_HOST_NAME)
    send_snapshot(text)
    return len(text)


@app.task(name=PROBE_TASK, ignore_result=True)
def probe_host() -> int:
    size_bytes = probe_and_send()
    logger.info("sent a snapshot of %s (%d bytes)", settings.GPUADMIN_HOST_NAME, size_bytes)
    return size_bytes


def request_probe(host_name: str, expires_seconds: float) -> None:
    """Ask a host's agent for a snapshot now; the request is dropped if the agent does not take it in time."""
    app.send_task(PROBE_TASK, queue=host_queue(host_name), expires=expires_seconds)


@worker_ready.connect
def probe_on_worker_start(sender: Any = None, **kwargs: Any) -> None:
    """A new agent shows up at once instead of at central's next scheduled probe.

    The request goes through this host's own queue, so the probe runs in the
    worker's pool like every other probe and the consumer is not held up.
    """
    consumer = sender
    if getattr(consumer, "app", None) is not app:
        return
    own_queue = host_queue(settings.GPUADMIN_HOST_NAME)
    consumed = {queue.name for queue in consumer.task_consumer.queues}
    if own_queue not in consumed:
        return  # a central-only worker: it has no host to probe
    request_probe(
        settings.GPUADMIN_HOST_NAME,
        expires_seconds=settings.GPUADMIN_PROBE_INTERVAL_SECONDS * EXPIRES_SHARE_OF_PERIOD,
    )
