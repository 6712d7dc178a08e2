"""Celery tasks of the fair-use app (central side): thin wrappers over ``services``.

Agents load this module too (one Celery app lists every task module), so the services are
imported inside the tasks, where only central runs them. Their arguments come off the broker:
they only name a notice, whose row decides whether anything is sent.
"""

from __future__ import annotations

from gpuadmin.celery import CENTRAL_QUEUE, app
from gpuadmin.wire.task_names import DELIVER_FAIR_USE_NOTICE, EVALUATE_FAIR_USE


@app.task(name=EVALUATE_FAIR_USE, queue=CENTRAL_QUEUE, ignore_result=True)
def evaluate_policies() -> int:
    from gpuadmin.fairuse.services import evaluate

    return evaluate()


@app.task(name=DELIVER_FAIR_USE_NOTICE, queue=CENTRAL_QUEUE, ignore_result=True)
def deliver_notice(notice_id: int) -> bool:
    from gpuadmin.fairuse.services import deliver_notice as deliver

    return deliver(notice_id)
