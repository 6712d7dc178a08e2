"""A failing destination is retried and reported on the request's timeline; nothing else is affected."""

from __future__ import annotations

import pytest
from django.urls import reverse

from gpuadmin.audit.models import Action
from gpuadmin.kills import services
from gpuadmin.kills.states import Status
from gpuadmin.notify.delivery import DELIVERY_FAILED
from gpuadmin.notify.models import Notification
from gpuadmin.notify.services import DeliveryFailed, deliver, plan_for_event
from tests.notify.helpers import REASON, person

pytestmark = pytest.mark.django_db


@pytest.fixture
def filed(lab, requester, approver, inbox, settings):
    settings.GPUADMIN_NOTIFY_RETRIES = 1  # two attempts in all
    person("April", "april@lab.example", user=approver, urls=f"{inbox.url('fail')}\n{inbox.url('ok')}")
    kill_request = services.file_request(requester, host="gpu01", pid=4600, start_time_ticks=460000,
                                         reason=REASON)
    plan_for_event(kill_request.pk, Action.REQUESTED)
    return kill_request


def by_path(path: str) -> Notification:
    return Notification.objects.get(destination__contains=f"/{path}")


def test_a_failure_before_the_last_attempt_asks_for_a_retry_and_keeps_the_error(filed, inbox):
    failing = by_path("fail")
    with pytest.raises(DeliveryFailed) as failed:
        deliver(failing.pk)
    assert failed.value.attempts == 1
    failing.refresh_from_db()
    assert failing.status == Notification.Status.QUEUED
    assert failing.attempts == 1
    assert failing.last_error == DELIVERY_FAILED  # the service's answer is for the log, not the page


def test_the_last_failed_attempt_marks_it_failed(filed, inbox):
    failing = by_path("fail")
    with pytest.raises(DeliveryFailed):
        deliver(failing.pk)
    assert deliver(failing.pk) is False
    failing.refresh_from_db()
    assert (failing.status, failing.attempts) == (Notification.Status.FAILED, 2)
    assert inbox.failed_attempts == 2
    assert deliver(failing.pk) is True  # no longer queued: never sent again


def test_other_destinations_and_the_request_are_not_affected(filed, inbox, approver):
    with pytest.raises(DeliveryFailed):
        deliver(by_path("fail").pk)
    assert deliver(by_path("ok").pk) is True
    assert deliver(Notification.objects.get(destination__startswith="djangomail").pk) is True
    assert len(inbox.received) == 1
    services.approve(filed.pk, approver)
    filed.refresh_from_db()
    assert filed.status == Status.APPROVED


def test_the_approval_commits_when_notifications_cannot_be_queued(lab, requester, approver, monkeypatch,
                                                                  django_capture_on_commit_callbacks):
    from gpuadmin.celery import app

    kill_request = services.file_request(requester, host="gpu01", pid=4600, start_time_ticks=460000,
                                         reason=REASON)

    def broker_down(name, *args, **kwargs):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(app, "send_task", broker_down)
    with django_capture_on_commit_callbacks(execute=True):
        services.approve(kill_request.pk, approver)
    kill_request.refresh_from_db()
    assert kill_request.status == Status.APPROVED


def test_the_timeline_shows_sent_and_failed_notifications(filed, viewer_client, settings):
    settings.GPUADMIN_NOTIFY_RETRIES = 0
    deliver(by_path("fail").pk)
    deliver(by_path("ok").pk)
    page = viewer_client.get(reverse("kill_request_detail", args=[filed.pk])).content.decode()
    assert "<h2>Notifications</h2>" in page
    assert page.count('class="notification notification-sent"') == 1
    assert 'class="notification notification-failed"' in page
    assert "after 1 attempt" in page
    assert "Waiting for approval" in page and "April" in page
