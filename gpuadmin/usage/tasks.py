"""Celery tasks of the usage app (central side): thin wrappers over ``retention`` and ``digest``.

Their arguments come off the broker, which is not trusted: they only name a digest message; what it
says and whether it is sent follow from its row.
"""

from __future__ import annotations

from dataclasses import asdict

from django.db import DatabaseError

from gpuadmin.celery import CENTRAL_QUEUE, app, send_central
from gpuadmin.wire.task_names import DELIVER_USAGE_DIGEST, MAINTAIN_USAGE, SEND_USAGE_DIGEST


@app.task(name=MAINTAIN_USAGE, queue=CENTRAL_QUEUE, ignore_result=True)
def maintain_usage_task() -> dict[str, int]:
    """Write silent hosts' pending usage and prune the ledger past GPUADMIN_USAGE_DAYS (beat)."""
    from gpuadmin.usage.retention import maintain_usage

    return asdict(maintain_usage())


@app.task(name=SEND_USAGE_DIGEST, queue=CENTRAL_QUEUE, ignore_result=True,
          autoretry_for=(DatabaseError,), retry_backoff=1, retry_backoff_max=60, max_retries=10)
def send_usage_digest() -> int:
    """Last week's digest to every approver (beat, weekly); once per week however often it runs."""
    from gpuadmin.usage.digest import last_week, queue_digest

    ids = queue_digest(last_week())
    for message_id in ids:
        send_central(DELIVER_USAGE_DIGEST, message_id)
    return len(ids)


@app.task(name=DELIVER_USAGE_DIGEST, queue=CENTRAL_QUEUE, ignore_result=True,
          autoretry_for=(DatabaseError,), retry_backoff=1, retry_backoff_max=60, max_retries=10)
def deliver_usage_digest(message_id: int) -> bool:
    from gpuadmin.usage.digest import deliver

    return deliver(message_id)
