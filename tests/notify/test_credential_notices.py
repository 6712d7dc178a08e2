"""A change to someone else's credentials tells that person and the other approvers
(gpuadmin/accounts/credential_changes.py, notify.services.plan_for_credential_change)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.db import transaction
from django.urls import reverse

from gpuadmin.accounts.audit_trail import acting
from gpuadmin.celery import app
from gpuadmin.notify import services
from gpuadmin.notify.models import Notification
from gpuadmin.wire.task_names import DELIVER_NOTIFICATION
from tests.accounts.helpers import logged_in
from tests.notify.helpers import person
from tests.people import PASSWORD

pytestmark = [pytest.mark.django_db, pytest.mark.account_audit]

NEW_PASSWORD = "violet stapler meadow"


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    monkeypatch.setattr(app, "send_task", lambda name, args=None, **_: found.append((name, args)))
    return found


@pytest.fixture
def people(approver: User, second_approver: User, viewer: User) -> User:
    boss = User.objects.create_superuser("boss", password=PASSWORD)
    person("Boss", "boss@lab.example", user=boss)
    person("Abe", "abe@lab.example", user=second_approver)
    # A security notice is not a preference: april hears of it though she hears of no request.
    person("April", "april@lab.example", user=approver, notify_requests_to_approve=False)
    person("Vera", "vera@lab.example", user=viewer)
    return boss


def test_setting_an_approvers_password_tells_them_and_the_other_approvers(
        people, second_approver, queued, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = logged_in("boss").post(
            reverse("admin:auth_user_password_change", args=[second_approver.pk]),
            {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD, "usable_password": "true"})
    assert response.status_code == 302
    notices = list(Notification.objects.all())
    assert sorted((n.recipient_name, n.role, n.event) for n in notices) == [
        ("Abe", "account", "credentials"), ("April", "approver", "credentials")]
    assert sorted(args[0] for name, args in queued if name == DELIVER_NOTIFICATION) == sorted(
        n.pk for n in notices)
    for notice in notices:
        assert services.deliver(notice.pk)
    sent = {m.to[0]: m for m in mail.outbox}
    assert sent.keys() == {"abe@lab.example", "april@lab.example"}
    assert sent["abe@lab.example"].subject == "[gpuadmin] boss changed the password of your account"
    assert sent["april@lab.example"].subject == "[gpuadmin] boss changed the password of the account abe"
    assert "abe cannot approve kill requests" in sent["april@lab.example"].body


def test_a_change_rolled_back_tells_nobody(people, second_approver, queued,
                                           django_capture_on_commit_callbacks):
    with (django_capture_on_commit_callbacks(execute=True), pytest.raises(RuntimeError),
          transaction.atomic(), acting(people, via="web test")):
        second_approver.set_password(NEW_PASSWORD)
        second_approver.save()
        assert Notification.objects.count() == 2
        raise RuntimeError("the admin's form failed after the save")
    assert Notification.objects.count() == 0
    assert queued == []


def test_a_repeated_plan_adds_nothing(people, second_approver, queued):
    with acting(people, via="web test"):
        second_approver.set_password(NEW_PASSWORD)
        second_approver.save()
    change = second_approver.credential_changes.get()
    planned = sorted(Notification.objects.values_list("pk", flat=True))
    assert sorted(services.plan_for_credential_change(change)) == planned  # the same, still queued
    assert sorted(Notification.objects.values_list("pk", flat=True)) == planned
