"""manage.py api_token: a new token printed once, stored only as a hash, expiring; every change audited."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from knox.models import AuthToken

from tests.accounts.helpers import account_events

pytestmark = [pytest.mark.django_db, pytest.mark.account_audit]


def new_token(capsys, *args: str) -> str:
    call_command("api_token", "vera", *args)
    return capsys.readouterr().out.strip()


def api_status(token: str) -> int:
    return Client().get(reverse("api_hosts"), HTTP_AUTHORIZATION=f"Token {token}").status_code


def test_the_token_works_and_is_not_stored(viewer, capsys):
    token = new_token(capsys)
    assert api_status(token) == 200
    # Nothing in the database holds the token: only its SHA-512 and its first 15 characters.
    with connection.cursor() as cursor:
        cursor.execute("SELECT digest, token_key FROM knox_authtoken")
        (digest, token_key), = cursor.fetchall()
    assert token not in digest and len(token) == 64
    assert token_key == token[:15]


def test_each_call_prints_a_new_token_and_both_work(viewer, capsys):
    first, second = new_token(capsys), new_token(capsys)
    assert first != second
    assert (api_status(first), api_status(second)) == (200, 200)


def test_replace_revokes_the_old_tokens(viewer, capsys):
    old = new_token(capsys)
    new = new_token(capsys, "--replace")
    assert (api_status(old), api_status(new)) == (401, 200)


def test_revoke_leaves_none(viewer, capsys):
    token = new_token(capsys)
    call_command("api_token", "vera", "--revoke")
    assert capsys.readouterr().out == ""
    assert api_status(token) == 401


def test_a_token_expires(viewer, capsys):
    token = new_token(capsys, "--days", "30")
    stored = AuthToken.objects.get()
    assert timedelta(days=29, hours=23) < stored.expiry - timezone.now() <= timedelta(days=30)
    AuthToken.objects.filter(pk=stored.pk).update(expiry=timezone.now() - timedelta(seconds=1))
    assert api_status(token) == 401
    assert not AuthToken.objects.exists()  # knox removes it when it is presented
    assert account_events()[-1][0] == "token_revoked"
    assert account_events()[-1][2]["reason"] == "expired"


def test_creating_and_revoking_are_audit_events_that_name_the_token_not_its_secret(viewer, capsys):
    token = new_token(capsys)
    call_command("api_token", "vera", "--revoke")
    events = [e for e in account_events() if e[0].startswith("token_")]
    assert [(action, details["user"], details["token"], details["via"]) for action, _, details in events] == [
        ("token_created", "vera", token[:15], "manage.py api_token"),
        ("token_revoked", "vera", token[:15], "manage.py api_token"),
    ]
    assert events[1][2]["reason"] == "revoked"
    assert all(token not in str(details) for _, _, details in account_events())
