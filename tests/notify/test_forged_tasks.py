"""Notify tasks forged on the broker, which anyone on a GPU host can write to (docs/security.md), say
nothing false, take no real notice's place and send nothing twice: their arguments only name a request,
an event or a notification; what is said, and whether it is sent, follows from the database."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Task
from django.core import mail

from gpuadmin.audit.models import Action
from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest
from gpuadmin.notify import services as notify_services
from gpuadmin.notify.models import Notification
from gpuadmin.notify.services import deliver, plan_for_event
from gpuadmin.notify.tasks import deliver_notification, notify_kill_event, warn_expiring_requests
from gpuadmin.wire.task_names import DELIVER_NOTIFICATION
from tests.notify.helpers import REASON, person

pytestmark = pytest.mark.django_db

Event = Notification.Event
Status = Notification.Status


@pytest.fixture
def people(requester, approver, inbox):
    return {
        "rick": person("Rick", "rick@lab.example", user=requester),
        "april": person("April", "april@lab.example", user=approver, urls=inbox.url("april")),
        "alice": person("Alice", "alice@lab.example", unix="alice"),
    }


@pytest.fixture
def queued(monkeypatch) -> list[tuple[str, list[Any]]]:
    """The tasks central queues (name, args), kept here instead of sent."""
    from gpuadmin.celery import app

    sent: list[tuple[str, list[Any]]] = []

    def keep(name: str, args: Any = None, **options: Any) -> None:
        sent.append((name, list(args or [])))

    monkeypatch.setattr(app, "send_task", keep)
    return sent


def filed(requester) -> KillRequest:
    return services.file_request(requester, host="gpu01", pid=4120, start_time_ticks=412000, reason=REASON,
                                 include_descendants=True)


def run(task: Task, *args: Any, **options: Any) -> Any:
    """Run a task as a central worker would (eagerly, retries included); its result, or its exception."""
    return task.apply(args=list(args), **options).get()


def deliver_queued(queued: list[tuple[str, list[Any]]]) -> None:
    for name, args in queued:
        if name == DELIVER_NOTIFICATION:
            run(deliver_notification, *args)


@pytest.mark.usefixtures("lab", "people")
def test_a_forged_approval_drafts_nothing_and_the_real_one_still_goes_out(requester, approver, queued,
                                                                          caplog):
    kill_request = filed(requester)
    assert run(notify_kill_event, kill_request.pk, "approved") == 0
    assert not Notification.objects.exists()
    assert "not borne out by its audit log" in caplog.text

    services.approve(kill_request.pk, approver)
    assert run(notify_kill_event, kill_request.pk, "approved") == 1
    deliver_queued(queued)
    (message,) = mail.outbox
    assert message.to == ["rick@lab.example"]
    assert "was approved by april" in message.body
    assert Notification.objects.get(event=Event.APPROVED).status == Status.SENT


@pytest.mark.usefixtures("lab", "people")
@pytest.mark.parametrize(("state", "forged"), [
    ("pending", Action.APPROVED),  # "approved" before any approval: "was pending by ."
    ("rejected", Action.APPROVED),
    ("rejected", Action.FINISHED),  # no agent ran it
    ("rejected", Action.EXPIRED),
    ("cancelled", Action.REJECTED),
    ("expired", Action.FINISHED),  # expired unapproved: "expired" is also an agent's result, but none ran it
    ("approved", Action.REQUESTED),  # it happened, but nothing waits for approval now
])
def test_an_event_the_audit_log_and_status_do_not_bear_out_drafts_nothing(requester, approver, state, forged):
    kill_request = filed(requester)
    if state == "rejected":
        services.reject(kill_request.pk, approver, "ask alice first")
    elif state == "cancelled":
        services.cancel(kill_request.pk, requester, "wrong host")
    elif state == "approved":
        services.approve(kill_request.pk, approver)
    elif state == "expired":
        services.sweep(kill_request.pending_expires_at)
    assert plan_for_event(kill_request.pk, forged) == []
    assert not Notification.objects.exists()


@pytest.mark.usefixtures("lab", "people")
def test_a_repeated_real_task_drafts_once_and_each_message_is_sent_once(requester, inbox, queued):
    kill_request = filed(requester)
    for _ in range(2):
        run(notify_kill_event, kill_request.pk, Action.REQUESTED)
    # April by email and webhook, Alice (the owner) by email: each once, though queued twice.
    assert Notification.objects.count() == 3
    assert len([name for name, _ in queued if name == DELIVER_NOTIFICATION]) == 6
    deliver_queued(queued)
    assert sorted(m.to[0] for m in mail.outbox) == ["alice@lab.example", "april@lab.example"]
    assert len(inbox.received) == 1
    assert set(Notification.objects.values_list("status", "attempts")) == {(Status.SENT, 1)}


@pytest.mark.usefixtures("lab", "people")
def test_two_tasks_delivering_one_notification_at_once_send_it_once(requester, inbox, monkeypatch):
    plan_for_event(filed(requester).pk, Action.REQUESTED)
    hook = Notification.objects.get(destination__contains="/april")
    real_send, others = notify_services.send, []

    def send_while_another_task_delivers(url: str, subject: str, body: str) -> Any:
        if not others:  # the second task starts while the first one is talking to the service
            others.append(deliver(hook.pk))
        return real_send(url, subject, body)

    monkeypatch.setattr(notify_services, "send", send_while_another_task_delivers)
    assert deliver(hook.pk) is True
    assert others == [True]  # not its to send
    assert len(inbox.received) == 1
    hook.refresh_from_db()
    assert (hook.status, hook.attempts) == (Status.SENT, 1)
    assert deliver(hook.pk) is True and len(inbox.received) == 1  # a later task sends nothing either


@pytest.mark.usefixtures("lab")
def test_a_task_that_claims_to_be_a_late_retry_does_not_end_a_notification_early(
        requester, approver, inbox, settings):
    settings.GPUADMIN_NOTIFY_RETRIES, settings.GPUADMIN_NOTIFY_RETRY_SECONDS = 2, 0
    person("April", user=approver, urls=inbox.url("fail"))
    plan_for_event(filed(requester).pk, Action.REQUESTED)
    failing = Notification.objects.get()
    # The retry count is in the task's message: a forged one says "the last retry" at once.
    assert run(deliver_notification, failing.pk, retries=99) is False
    failing.refresh_from_db()
    assert (failing.status, failing.attempts) == (Status.FAILED, 3)  # the first and two retries
    assert inbox.failed_attempts == 3


@pytest.mark.usefixtures("lab", "people")
def test_a_forged_expiry_warning_run_warns_of_no_request_that_is_not_about_to_expire(requester):
    kill_request = filed(requester)  # an hour left
    assert run(warn_expiring_requests) == 0
    with pytest.raises(TypeError):
        run(warn_expiring_requests, kill_request.pending_expires_at)  # no "now" to pass: central's clock
    assert not Notification.objects.exists()
