"""Celery tasks of the kills app (central side): thin wrappers over services.

Agents load this module too (one Celery app lists every task module), so the
services are imported inside the tasks, where only central runs them.
"""

from __future__ import annotations

from typing import Any

from celery import Task
from django.db import DatabaseError

from gpuadmin.celery import CENTRAL_QUEUE, app
from gpuadmin.wire.task_names import RECORD_KILL_PROGRESS, SWEEP_KILLS

# How long a report waits for the earlier ones it overtook: 20 retries 0.1 s apart. The
# agent sends them milliseconds apart, so this is plenty; after it, the report
# is stored anyway rather than lost.
WAIT_FOR_EARLIER_RETRIES = 20
WAIT_FOR_EARLIER_SECONDS = 0.1


@app.task(
    bind=True,
    name=RECORD_KILL_PROGRESS,
    queue=CENTRAL_QUEUE,
    # The database being down or locked is worth waiting for; each report is
    # stored once per (request, seq), so a retry cannot double it.
    autoretry_for=(DatabaseError,),
    retry_backoff=1,
    retry_backoff_max=60,
    max_retries=10,
    ignore_result=True,
)
def record_kill_progress(self: Task, message: Any) -> int | None:
    from gpuadmin.kills.services import EarlierStepsMissing, receive_report

    waiting = self.request.retries < WAIT_FOR_EARLIER_RETRIES
    try:
        step = receive_report(message, wait_for_earlier=waiting)
    except EarlierStepsMissing as exc:
        raise self.retry(
            exc=exc, countdown=WAIT_FOR_EARLIER_SECONDS, max_retries=WAIT_FOR_EARLIER_RETRIES
        ) from exc
    return step.pk if step else None


@app.task(name=SWEEP_KILLS, queue=CENTRAL_QUEUE, ignore_result=True)
def sweep() -> dict[str, int]:
    from gpuadmin.kills.services import sweep as run_sweep

    result = run_sweep()
    return {"expired": result.expired, "resent": result.resent, "failed": result.failed}
