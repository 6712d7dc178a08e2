"""Through a real central Celery worker over a real redis-server: filing a request reaches the
approver's webhook, and a failing webhook is retried, then reported failed; the request stays pending."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from django.db import connection

from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.states import Status
from gpuadmin.notify.delivery import DELIVERY_FAILED
from gpuadmin.notify.models import Notification
from tests.integration.helpers import Worker, database_url_for_workers
from tests.notify.helpers import REASON, person
from tests.services import RedisServer

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

TIMEOUT_SECONDS = 60
RETRIES = 2


def wait_until(what: str, check: Callable[[], object], worker: Worker) -> object:
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}\n{worker.log[-6000:]}")


def test_a_new_request_reaches_the_approver_and_a_failing_hook_is_retried(  # noqa: PLR0917 - fixtures
    lab, requester, approver, inbox, start_worker, redis_server: RedisServer, publish_to,
):
    person("April", user=approver, urls=f"{inbox.url('ok')}\n{inbox.url('fail')}")
    publish_to(redis_server.url)
    on_sqlite = connection.vendor == "sqlite"
    worker = start_worker(
        "central", "central",
        GPUADMIN_NOTIFY_RETRIES=str(RETRIES), GPUADMIN_NOTIFY_RETRY_SECONDS="0",
        GPUADMIN_NOTIFY_ALLOW_PRIVATE="1",  # the Inbox listens on loopback
        GPUADMIN_BASE_URL="https://gpuadmin.lab.example",
        **({} if on_sqlite else {"DATABASE_URL": database_url_for_workers()}),
    )
    kill_request = services.file_request(requester, host="gpu01", pid=4600, start_time_ticks=460000,
                                         reason=REASON)

    (message,) = wait_until("the webhook to receive the message", lambda: inbox.received, worker)
    assert "waits for approval" in message["title"]
    assert f"https://gpuadmin.lab.example/kills/{kill_request.pk}/" in message["message"]

    def failed() -> Notification | None:
        return Notification.objects.filter(status=Notification.Status.FAILED).first()

    failing = wait_until("the failing hook to be given up", failed, worker)
    assert failing.attempts == RETRIES + 1
    assert inbox.failed_attempts == RETRIES + 1
    assert failing.last_error == DELIVERY_FAILED  # the service's answer is for the log, not the page
    assert Notification.objects.get(destination__contains="/ok").status == Notification.Status.SENT
    assert KillRequest.objects.get(pk=kill_request.pk).status == Status.PENDING
