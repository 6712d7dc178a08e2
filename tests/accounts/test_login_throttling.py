"""Login throttling (django-axes): 5 failures lock that name from that address, with a clear message."""

from __future__ import annotations

import pytest
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from gpuadmin.accounts import sudo
from tests.accounts.helpers import account_events
from tests.people import PASSWORD

pytestmark = [pytest.mark.django_db, pytest.mark.account_audit]


def log_in(password: str, *, address: str = "10.0.0.7", username: str = "vera", client: Client | None = None):
    client = client or Client(REMOTE_ADDR=address)
    return client.post(reverse("login"), {"username": username, "password": password})


def fail(times: int, **kwargs) -> None:
    for _ in range(times):
        assert log_in("wrong password", **kwargs).status_code == 200  # the form again, with its error


def test_four_failures_do_not_lock(viewer):
    fail(4)
    assert log_in(PASSWORD).status_code == 302


def test_the_fifth_failure_locks_even_the_right_password_out_and_says_so(viewer):
    fail(4)
    locked = log_in("wrong password")
    assert locked.status_code == 429
    page = locked.content.decode()
    assert "Too many failed logins" in page
    assert "After 5 wrong passwords for <strong>vera</strong> from your address" in page
    assert "locked for 15 minutes after the last attempt" in page
    right = log_in(PASSWORD)
    assert right.status_code == 429
    assert "_auth_user_id" not in right.wsgi_request.session
    assert ("login_locked_out", {"user": "vera", "address": "10.0.0.7"}) in [
        (action, details) for action, _, details in account_events()]


def test_the_lock_is_for_that_name_from_that_address_only(viewer, requester):
    fail(4)
    assert log_in("wrong password").status_code == 429
    assert log_in(PASSWORD, address="10.0.0.8").status_code == 302
    assert log_in(PASSWORD, username="rick", address="10.0.0.7").status_code == 302


def test_wrong_passwords_at_reauthentication_count_too(viewer):
    client = Client(REMOTE_ADDR="10.0.0.7")
    assert log_in(PASSWORD, client=client).status_code == 302
    for _ in range(4):
        client.post(reverse("reauthenticate"), {"password": "wrong password", "next": "/"})
    locked = client.post(reverse("reauthenticate"), {"password": "wrong password", "next": "/"})
    assert locked.status_code == 429
    assert "Too many failed logins" in locked.content.decode()
    again = client.post(reverse("reauthenticate"), {"password": PASSWORD, "next": "/"})
    assert again.status_code == 429


def test_behind_the_proxy_the_address_the_proxy_saw_counts_not_the_one_the_client_claims(viewer, settings):
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    for claimed in range(5):  # a new made-up address each time does not dodge the lock
        Client(REMOTE_ADDR="127.0.0.1").post(
            reverse("login"), {"username": "vera", "password": "wrong"},
            HTTP_X_FORWARDED_FOR=f"192.0.2.{claimed}, 10.0.0.7", HTTP_X_FORWARDED_PROTO="https")
    locked = Client(REMOTE_ADDR="127.0.0.1").post(
        reverse("login"), {"username": "vera", "password": PASSWORD},
        HTTP_X_FORWARDED_FOR="192.0.2.99, 10.0.0.7", HTTP_X_FORWARDED_PROTO="https")
    assert locked.status_code == 429


@pytest.mark.parametrize("password", ["password123", "iloveyou1", "qwertyuiop"])
def test_common_passwords_are_refused(password):
    with pytest.raises(ValidationError, match="too common"):
        validate_password(password)


def test_a_successful_login_starts_the_approval_window(viewer):
    client = Client()
    log_in(PASSWORD, client=client)
    assert sudo.recently_authenticated(client.get(reverse("fleet")).wsgi_request)
