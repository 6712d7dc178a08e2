"""The agent's probe: read this host with gpuadmin.probe, send the snapshot, signed with
this agent's key, to central.

Runs on a GPU host's own queue (``host.<name>``). It needs the broker and
nothing else: it never opens the database, so a GPU host holds no database
credentials (an agent with an unreachable DATABASE_URL still delivers).
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_ready
from django.conf import settings

from gpuadmin.celery import app, host_queue
from gpuadmin.keys import agent_signing_key
from gpuadmin.probe.budget import seal_snapshot
from gpuadmin.sending import request_probe, send_snapshot
from gpuadmin.wire.signing import fingerprint
from gpuadmin.wire.task_names import PROBE_HOST

logger = logging.getLogger(__name__)


def signed_snapshot(host_name: str) -> dict[str, Any]:
    """One snapshot of this host, signed with this agent's key; options from GPUADMIN_* variables.

    Cut to fit GPUADMIN_SNAPSHOT_MAX_BYTES as sent (the same variable and default
    as central's limit): a snapshot over it would be rejected and the host would
    drop off the panel, so what does not fit is left out and counted instead.
    """
    # Imported here so that loading the task modules (central imports them too)
    # does not load psutil and the GPU backends.
    from gpuadmin.probe import take_snapshot
    from gpuadmin.probe.config import ProbeConfig

    snapshot = take_snapshot(ProbeConfig.from_env(host_name=host_name))
    return seal_snapshot(snapshot, agent_signing_key(), max_bytes=settings.GPUADMIN_SNAPSHOT_MAX_BYTES)


def probe_and_send() -> int:
    """Probe this host and send the signed snapshot to central; returns its size in bytes."""
    message = signed_snapshot(settings.GPUADMIN_HOST_NAME)
    send_snapshot(message)
    return len(message["text"])  # ASCII: characters are bytes


@app.task(name=PROBE_HOST, ignore_result=True)
def probe_host() -> int:
    size_bytes = probe_and_send()
    logger.info("sent a snapshot of %s (%d bytes)", settings.GPUADMIN_HOST_NAME, size_bytes)
    return size_bytes


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
    key = agent_signing_key()  # made now on the first start, and its fingerprint logged
    logger.info("agent %s signs with key %s", settings.GPUADMIN_HOST_NAME, fingerprint(key))
    request_probe(settings.GPUADMIN_HOST_NAME)
