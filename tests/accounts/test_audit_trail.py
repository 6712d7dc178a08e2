"""Changes to accounts and roles made anywhere (here: the admin site) are audit events, with who made them."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from gpuadmin.accounts.roles import Role
from tests.accounts.helpers import account_events

pytestmark = [pytest.mark.django_db, pytest.mark.account_audit]


@pytest.fixture
def admin_client_as_boss() -> Client:
    boss = User.objects.create_superuser("boss", password="violet stapler meadow")
    client = Client()
    client.force_login(boss)
    return client


def test_a_role_given_in_the_admin_names_the_admin_as_actor(admin_client_as_boss, viewer):
    approvers = Group.objects.get(name=Role.APPROVER)
    response = admin_client_as_boss.post(reverse("admin:auth_user_change", args=[viewer.pk]), {
        "username": "vera", "is_active": "on", "groups": [viewer.groups.get().pk, approvers.pk],
        "date_joined_0": "2026-01-01", "date_joined_1": "00:00:00",
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    action, actor, details = account_events()[-1]
    assert (action, actor) == ("roles_changed", "boss")
    assert details["user"] == "vera"
    assert details["added"] == ["approver"]
    assert details["via"] == f"web {reverse('admin:auth_user_change', args=[viewer.pk])}"


def test_roles_changed_from_the_group_side_are_recorded_per_user(viewer, requester):
    before = len(account_events())
    Group.objects.get(name=Role.APPROVER).user_set.add(viewer, requester)
    changed = sorted((d["user"], d["added"], d["roles"]) for _, _, d in account_events()[before:])
    assert changed == [("rick", ["approver"], ["approver", "requester"]),
                       ("vera", ["approver"], ["approver", "viewer"])]


def test_clearing_roles_says_which_went(viewer):
    viewer.groups.clear()
    assert account_events()[-1][2] | {"via": None} == {"user": "vera", "removed": ["viewer"], "roles": [],
                                                       "via": None}


def test_deactivating_and_deleting_an_account(viewer):
    viewer.is_active = False
    viewer.save()
    viewer.delete()
    assert [(a, d.get("changed"), d.get("now")) for a, _, d in account_events()[-2:]] == [
        ("user_changed", ["is_active"], {"is_active": False}),
        ("user_deleted", None, None),
    ]


def test_a_login_is_not_an_account_change(viewer):
    before = len(account_events())
    response = Client().post(reverse("login"), {"username": "vera", "password": "correct horse battery"})
    assert response.status_code == 302
    assert len(account_events()) == before
