"""Who is told what: approvers, the requester and the owners of the targeted processes, by their choices."""

from __future__ import annotations

import pytest
from django.utils import timezone

from gpuadmin.audit.models import Action
from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest
from gpuadmin.notify.models import Notification
from gpuadmin.notify.services import plan_expiry_warnings, plan_for_event
from tests.notify.helpers import REASON, person

pytestmark = pytest.mark.django_db

Event = Notification.Event


@pytest.fixture
def people(requester, approver, second_approver, inbox):
    return {
        "rick": person("Rick", "rick@lab.example", user=requester),
        "april": person("April", "april@lab.example", user=approver, urls=inbox.url("april")),
        "abe": person("Abe", user=second_approver, urls=inbox.url("abe"), notify_requests_to_approve=False),
        "alice": person("Alice", "alice@lab.example", unix="alice"),
        "carol": person("Carol", "carol@lab.example", unix="carol", notify_my_processes=False),
    }


def filed(requester, pid: int = 4120, **kwargs) -> KillRequest:
    return services.file_request(requester, host="gpu01", pid=pid, start_time_ticks=pid * 100, reason=REASON,
                                 include_descendants=True, **kwargs)


def sent_to(kill_request: KillRequest, event: str) -> dict[str, Notification]:
    return {n.destination: n for n in Notification.objects.filter(kill_request=kill_request, event=event)}


def test_a_new_request_tells_the_approvers_with_a_link(lab, people, requester):
    kill_request = filed(requester)
    plan_for_event(kill_request.pk, Action.REQUESTED)
    waiting = Notification.objects.filter(event=Event.WAITING)
    # April by email and webhook; Abe opted out; Rick filed it and cannot approve it.
    assert sorted(n.recipient_name for n in waiting) == ["April", "April"]
    note = waiting.first()
    assert f"https://gpuadmin.lab.example/kills/{kill_request.pk}/" in note.body
    assert REASON in note.body
    assert "PID 4120 python (user alice" in note.body
    assert note.role == Notification.Role.APPROVER


def test_the_process_owner_is_told_the_reason_and_the_plan_to_save_their_work(lab, people, requester):
    kill_request = filed(requester)
    plan_for_event(kill_request.pk, Action.REQUESTED)
    (note,) = Notification.objects.filter(event=Event.KILL_REQUESTED)
    assert note.recipient_name == "Alice" and note.destination.startswith("djangomail://")
    assert REASON in note.body
    assert "1. SIGINT, then up to" in note.body
    assert "save your work (a checkpoint) now" in note.body
    assert "PID 4121 pt_data_worker" in note.body  # every one of her targets


def test_an_owner_who_opted_out_hears_nothing(lab, people, requester):
    kill_request = services.file_request(requester, host="gpu01", pid=4600, start_time_ticks=460000,
                                         reason=REASON)
    plan_for_event(kill_request.pk, Action.REQUESTED)
    assert not Notification.objects.filter(event=Event.KILL_REQUESTED).exists()


def test_approval_tells_the_requester(lab, people, requester, approver):
    kill_request = filed(requester)
    services.approve(kill_request.pk, approver)
    plan_for_event(kill_request.pk, Action.APPROVED)
    (note,) = Notification.objects.filter(event=Event.APPROVED)
    assert note.recipient_name == "Rick"
    assert "was approved by april" in note.body


def test_rejection_tells_the_requester_and_the_owner_how_it_ended(lab, people, requester, approver):
    kill_request = filed(requester)
    services.reject(kill_request.pk, approver, "ask alice first")
    plan_for_event(kill_request.pk, Action.REJECTED)
    assert Notification.objects.get(event=Event.REJECTED).recipient_name == "Rick"
    ended = Notification.objects.get(event=Event.KILL_ENDED)
    assert ended.recipient_name == "Alice"
    assert "Rejected" in ended.body and "ask alice first" in ended.body


def test_expiry_tells_the_requester_it_finished_and_the_owner(lab, people, requester):
    kill_request = filed(requester)
    services.sweep(kill_request.pending_expires_at)
    plan_for_event(kill_request.pk, Action.EXPIRED)
    finished = Notification.objects.get(event=Event.FINISHED)
    assert "ended: expired" in finished.subject
    assert Notification.objects.get(event=Event.KILL_ENDED).recipient_name == "Alice"


def test_a_requester_who_cancels_is_not_told_what_they_did(lab, people, requester):
    kill_request = filed(requester)
    services.cancel(kill_request.pk, requester, "wrong host")
    plan_for_event(kill_request.pk, Action.CANCELLED)
    assert not Notification.objects.filter(event=Event.FINISHED).exists()
    assert Notification.objects.filter(event=Event.KILL_ENDED).count() == 1


def test_steps_of_the_agent_notify_nobody(lab, people, requester):
    kill_request = filed(requester)
    assert plan_for_event(kill_request.pk, Action.SIGNAL_SENT) == []
    assert plan_for_event(kill_request.pk, Action.DISPATCHED) == []


def test_a_redelivered_event_adds_nothing(lab, people, requester):
    kill_request = filed(requester)
    first = plan_for_event(kill_request.pk, Action.REQUESTED)
    again = plan_for_event(kill_request.pk, Action.REQUESTED)
    assert len(first) == 3 and set(again) == set(first)  # still queued, not doubled
    assert Notification.objects.count() == 3


def test_approvers_are_warned_once_before_a_request_expires(lab, people, requester, settings):
    settings.GPUADMIN_NOTIFY_EXPIRY_WARNING_SECONDS = 600
    kill_request = filed(requester)
    assert plan_expiry_warnings(timezone.now()) == []  # an hour left
    ten_minutes_before = kill_request.pending_expires_at - timezone.timedelta(seconds=599)
    warned = plan_expiry_warnings(ten_minutes_before)
    assert len(warned) == 2  # April's email and webhook
    assert "expires at" in Notification.objects.get(pk=warned[0]).subject
    assert plan_expiry_warnings(ten_minutes_before) == []


@pytest.mark.usefixtures("lab", "people")
def test_the_event_is_queued_only_after_the_change_commits(requester, monkeypatch,
                                                           django_capture_on_commit_callbacks):
    from gpuadmin.celery import app

    queued = []
    monkeypatch.setattr(app, "send_task", lambda name, args=None, **options: queued.append((name, args)))
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        kill_request = filed(requester)
    assert queued == []  # nothing leaves before the commit
    for callback in callbacks:
        callback()
    assert ("gpuadmin.notify.kill_event", [kill_request.pk, "requested"]) in queued
