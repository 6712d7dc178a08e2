"""Celery tasks of the notify app (central side): thin wrappers over ``services``.

Their arguments come off the broker, which is not trusted: they only name what the services look up
(a kill request and one of its audit events, a notification); the services decide from the database.

Agents load this module too (one Celery app lists every task module), so the services are
imported inside the tasks, where only central runs them.
"""

from __future__ import annotations

from celery import Task
from django.conf import settings
from django.db import DatabaseError

from gpuadmin.celery import CENTRAL_QUEUE, app, send_central
from gpuadmin.wire.task_names import (
    DELIVER_NOTIFICATION,
    NOTIFY_KILL_EVENT,
    SYNC_PEOPLE,
    WARN_EXPIRING_REQUESTS,
)


def _send_each(notification_ids: list[int]) -> None:
    # One task per message: a slow or failing service delays and retries only its own.
    for notification_id in notification_ids:
        send_central(DELIVER_NOTIFICATION, notification_id)


@app.task(name=NOTIFY_KILL_EVENT, queue=CENTRAL_QUEUE, ignore_result=True,
          autoretry_for=(DatabaseError,), retry_backoff=1, retry_backoff_max=60, max_retries=10)
def notify_kill_event(kill_request_id: int, action: str) -> int:
    from gpuadmin.notify.services import plan_for_event

    ids = plan_for_event(kill_request_id, action)
    _send_each(ids)
    return len(ids)


@app.task(name=WARN_EXPIRING_REQUESTS, queue=CENTRAL_QUEUE, ignore_result=True)
def warn_expiring_requests() -> int:
    from gpuadmin.notify.services import plan_expiry_warnings

    ids = plan_expiry_warnings()
    _send_each(ids)
    return len(ids)


@app.task(bind=True, name=DELIVER_NOTIFICATION, queue=CENTRAL_QUEUE, ignore_result=True,
          autoretry_for=(DatabaseError,), retry_backoff=1, retry_backoff_max=60, max_retries=10)
def deliver_notification(self: Task, notification_id: int) -> bool:
    from gpuadmin.notify.services import DeliveryFailed, deliver

    try:
        return deliver(notification_id)
    except DeliveryFailed as exc:
        # Doubling waits: a service that is down for a minute still gets the message. Counted by the
        # notification's attempts, and retried until its row says the last was made: this task's retry
        # count comes in its message, which whoever can write to the broker can write.
        countdown = settings.GPUADMIN_NOTIFY_RETRY_SECONDS * 2 ** (exc.attempts - 1)
        raise self.retry(exc=exc, countdown=countdown, max_retries=self.request.retries + 1) from exc


@app.task(name=SYNC_PEOPLE, queue=CENTRAL_QUEUE, ignore_result=True)
def sync_people() -> str:
    from gpuadmin.accounts import audit_trail
    from gpuadmin.notify.people_from_directory import sync_people

    with audit_trail.acting(None, via="beat sync_people"):
        return str(sync_people())
