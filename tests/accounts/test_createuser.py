"""manage.py createuser: refuses an existing name unless --update; --role sets exactly the roles; audited."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from gpuadmin.accounts.roles import role_names
from tests.accounts.helpers import account_events

pytestmark = [pytest.mark.django_db, pytest.mark.account_audit]

GOOD = "violet stapler meadow"


def createuser(*args: str, monkeypatch: pytest.MonkeyPatch, password: str = GOOD) -> None:
    monkeypatch.setenv("NEW_PASSWORD", password)
    call_command("createuser", *args, "--password-env", "NEW_PASSWORD")


def roles(name: str) -> set[str]:
    return role_names(User.objects.get(username=name))


def test_creates_an_account_with_its_roles_and_records_it(monkeypatch):
    createuser("alice", "--role", "requester", monkeypatch=monkeypatch)
    assert roles("alice") == {"viewer", "requester"}
    assert account_events() == [
        ("user_created", "", {"user": "alice", "via": "manage.py createuser", "is_active": True,
                              "is_superuser": False}),
        ("roles_changed", "", {"user": "alice", "via": "manage.py createuser", "added": ["requester"],
                               "roles": ["requester"]}),
    ]


def test_an_existing_name_is_refused_without_update_and_left_alone(monkeypatch):
    createuser("alice", "--role", "viewer", monkeypatch=monkeypatch)
    before = User.objects.get(username="alice").password
    with pytest.raises(CommandError, match="an account named 'alice' exists; add --update"):
        createuser("alice", "--role", "approver", monkeypatch=monkeypatch, password="another good phrase")
    assert roles("alice") == {"viewer"}
    assert User.objects.get(username="alice").password == before


def test_update_sets_exactly_the_roles_given_removing_the_others(monkeypatch):
    createuser("alice", "--role", "requester", "--role", "approver", monkeypatch=monkeypatch)
    call_command("createuser", "alice", "--role", "approver", "--update", "--keep-password")
    assert roles("alice") == {"viewer", "approver"}
    assert account_events()[-1] == (
        "roles_changed", "", {"user": "alice", "via": "manage.py createuser", "removed": ["requester"],
                              "roles": ["approver"]})


def test_update_of_a_password_is_recorded_without_the_password(monkeypatch):
    createuser("alice", "--role", "viewer", monkeypatch=monkeypatch)
    createuser("alice", "--role", "viewer", "--update", monkeypatch=monkeypatch,
               password="a brand new phrase")
    assert User.objects.get(username="alice").check_password("a brand new phrase")
    assert account_events()[-1] == (
        "user_changed", "",
        {"user": "alice", "via": "manage.py createuser", "changed": ["password"], "now": {}})


def test_update_of_a_missing_account_is_refused(monkeypatch):
    with pytest.raises(CommandError, match="no account named 'bob' to update"):
        createuser("bob", "--role", "viewer", "--update", monkeypatch=monkeypatch)
    assert not User.objects.exists()


@pytest.mark.parametrize("password", ["password123", "qwertyuiop", "short"])
def test_common_and_short_passwords_are_refused(monkeypatch, password):
    with pytest.raises(CommandError, match=r"too common|too short"):
        createuser("alice", "--role", "viewer", monkeypatch=monkeypatch, password=password)
    assert not User.objects.exists()
