"""The two-person rule holds against a superuser: an account whose credentials someone else changed
cannot approve for a day (gpuadmin/accounts/credential_changes.py), whoever approves and however."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django_otp.plugins.otp_totp.models import TOTPDevice
from knox.models import AuthToken

from gpuadmin.accounts.audit_trail import acting
from gpuadmin.accounts.models import CREDENTIAL_CHANGE_HOLD_SECONDS, CredentialChange
from gpuadmin.accounts.roles import Role
from gpuadmin.kills import services
from gpuadmin.kills.services.errors import NotAllowed
from gpuadmin.kills.states import Status
from tests.accounts.helpers import logged_in
from tests.kills.helpers import file, refreshed
from tests.people import PASSWORD

pytestmark = [pytest.mark.django_db, pytest.mark.account_audit]

NEW_PASSWORD = "violet stapler meadow"


@pytest.fixture
def boss() -> User:
    return User.objects.create_superuser("boss", password=PASSWORD)


def set_password_in_the_admin(admin: Client, user: User, password: str = NEW_PASSWORD) -> None:
    response = admin.post(reverse("admin:auth_user_password_change", args=[user.pk]),
                          {"password1": password, "password2": password, "usable_password": "true"})
    assert response.status_code == 302, response.content.decode()[:2000]


def changes_of(user: User) -> list[tuple[str, str, str]]:
    return [(c.kind, c.changed_by_name, c.detail) for c in CredentialChange.objects.filter(user=user)]


def test_a_superuser_who_sets_an_approvers_password_cannot_approve_their_own_request_as_them(
        lab, boss, second_approver, sent):
    """The review's attack: boss files, sets abe's password in /admin/, logs in as abe and approves."""
    kill_request = file(boss, 4600)
    set_password_in_the_admin(logged_in("boss"), second_approver)
    as_abe = logged_in("abe", NEW_PASSWORD)

    page = as_abe.post(reverse("kill_request_approve", args=[kill_request.pk]), follow=True)
    text = page.content.decode().replace("&#x27;", "'")
    assert "boss changed the password of this account at" in text
    assert "Another approver must approve." in text
    api = as_abe.post(f"/api/v1/kill-requests/{kill_request.pk}/approve", {}, content_type="application/json")
    assert api.status_code == 403
    assert "cannot approve for 24 hours" in api.json()["error"]
    assert refreshed(kill_request).status == Status.PENDING
    assert sent.orders() == []


def test_the_hold_ends_after_a_day_and_binds_only_the_changed_account(
        lab, boss, approver, second_approver, sent):
    kill_request = file(boss, 4600)
    set_password_in_the_admin(logged_in("boss"), second_approver)
    with pytest.raises(NotAllowed):
        services.approve(kill_request.pk, second_approver)
    CredentialChange.objects.update(changed_at=(CredentialChange.objects.get().changed_at
                                                - timedelta(seconds=CREDENTIAL_CHANGE_HOLD_SECONDS + 1)))
    services.approve(kill_request.pk, second_approver)
    assert refreshed(kill_request).status == Status.APPROVED
    # april's credentials nobody touched: another request, she approves at once.
    other = file(boss, 4300)
    services.approve(other.pk, approver)
    assert refreshed(other).status == Status.APPROVED


def test_roles_totp_devices_tokens_and_new_accounts_given_by_someone_else_are_held(boss, stranger):
    admin = logged_in("boss")
    approvers = Group.objects.get(name=Role.APPROVER)
    # Roles through the admin's change form, as the audit trail's own test does.
    response = admin.post(reverse("admin:auth_user_change", args=[stranger.pk]), {
        "username": "sam", "is_active": "on", "is_staff": "on", "groups": [approvers.pk],
        "date_joined_0": "2026-01-01", "date_joined_1": "00:00:00",
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    created = admin.post(reverse("admin:auth_user_add"), {
        "username": "newbie", "password1": NEW_PASSWORD, "password2": NEW_PASSWORD, "usable_password": "true",
    })
    assert created.status_code == 302, created.content.decode()[:2000]
    with acting(boss, via="web test"):
        TOTPDevice.objects.create(user=stranger, name="phone", confirmed=True)
        token, _ = AuthToken.objects.create(user=stranger)
    assert sorted(changes_of(stranger)) == [
        ("api_token", "boss", f"created {token.token_key}"),
        ("roles", "boss", "added: approver"),
        ("roles", "boss", "is_staff: True"),
        ("totp_device", "boss", "added phone"),
    ]
    assert changes_of(User.objects.get(username="newbie")) == [("created", "boss", "")]
    said = {c.kind: c.done_to("this account") for c in CredentialChange.objects.all()}
    assert said["created"] == "created this account"
    assert said["totp_device"] == "changed the TOTP device (added phone) of this account"


def test_changes_by_the_holder_or_by_a_command_are_not_held(boss, approver, monkeypatch, capsys):
    # The admin's own password, changed on the admin's page for it.
    own = logged_in("boss").post(reverse("admin:password_change"), {
        "old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert own.status_code == 302, own.content.decode()[:2000]
    with acting(approver, via="web test"):
        approver.set_password("another good password")
        approver.save()
    # At the server's shell (whoever can run manage.py holds the database and the signing key).
    monkeypatch.setenv("APRIL_PASSWORD", NEW_PASSWORD)
    call_command("createuser", "april", "--update", "--role", "approver", "--role", "requester",
                 "--password-env", "APRIL_PASSWORD")
    call_command("totp_device", "april")
    assert changes_of(boss) == changes_of(approver) == []
    # Someone else, the same change: held.
    with acting(boss, via="web test"):
        approver.set_password("a third good password")
        approver.save()
    assert changes_of(approver) == [("password", "boss", "")]


def test_the_hold_is_judged_at_the_moment_of_the_approval(lab, boss, second_approver, sent):
    kill_request = file(boss, 4600)
    set_password_in_the_admin(logged_in("boss"), second_approver)
    with pytest.raises(NotAllowed) as refused:
        services.approve(kill_request.pk, second_approver)
    assert "boss changed the password of this account at" in str(refused.value)
    assert str(refused.value).endswith("Another approver must approve.")
    # A minute of the hold is left now; two minutes from now it is over.
    CredentialChange.objects.update(changed_at=(CredentialChange.objects.get().changed_at
                                                - timedelta(seconds=CREDENTIAL_CHANGE_HOLD_SECONDS - 60)))
    later = timezone.now() + timedelta(minutes=2)
    services.approve(kill_request.pk, second_approver, now=later)
    assert refreshed(kill_request).status == Status.APPROVED
    assert refreshed(kill_request).decided_at == later
