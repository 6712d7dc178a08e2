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


def forged_login(password: str, *, peer: str, forwarded_for: str):
    """A login with X-Forwarded-For as given, from ``peer`` ("" is gunicorn's Unix socket)."""
    return Client(REMOTE_ADDR=peer).post(
        reverse("login"), {"username": "vera", "password": password},
        HTTP_X_FORWARDED_FOR=forwarded_for, HTTP_X_FORWARDED_PROTO="https")


@pytest.fixture
def behind_https(settings):
    """GPUADMIN_HTTPS=1's proxy header, and the default trusted proxy: the Unix socket only."""
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert settings.GPUADMIN_TRUSTED_PROXIES == ["unix"]
    return settings


def test_behind_the_proxy_the_address_the_proxy_saw_counts_not_the_one_the_client_claims(
    viewer, behind_https,
):
    for claimed in range(5):  # a new made-up address each time does not dodge the lock
        forged_login("wrong", peer="", forwarded_for=f"192.0.2.{claimed}, 10.0.0.7")
    assert forged_login(PASSWORD, peer="", forwarded_for="192.0.2.99, 10.0.0.7").status_code == 429
    # The address nginx saw is what is locked, not the socket's (empty) one.
    assert forged_login(PASSWORD, peer="", forwarded_for="10.0.0.8").status_code == 302


def test_a_forged_forwarded_for_from_a_peer_that_is_not_the_proxy_counts_the_peer(viewer, behind_https):
    """Issue 30: a local user talking to gunicorn directly, a new made-up address each guess."""
    for claimed in range(5):
        forged_login("wrong", peer="127.0.0.1", forwarded_for=f"192.0.2.{claimed}")
    assert forged_login(PASSWORD, peer="127.0.0.1", forwarded_for="192.0.2.99").status_code == 429
    assert ("login_locked_out", {"user": "vera", "address": "127.0.0.1"}) in [
        (action, details) for action, _, details in account_events()]


def test_proxies_named_by_network_are_skipped_from_the_right(viewer, behind_https):
    behind_https.GPUADMIN_TRUSTED_PROXIES = ["10.1.0.0/16", "unix"]
    # client → edge proxy 10.1.0.5 → this box's nginx (Unix socket): the client is the rightmost untrusted.
    for claimed in range(5):
        forged_login("wrong", peer="", forwarded_for=f"192.0.2.{claimed}, 10.0.0.7, 10.1.0.5")
    assert forged_login(PASSWORD, peer="", forwarded_for="10.0.0.7, 10.1.0.5").status_code == 429
    assert forged_login(PASSWORD, peer="", forwarded_for="10.0.0.8, 10.1.0.5").status_code == 302


@pytest.mark.parametrize("value", ["127.0.0.1,bogus", "10.0.0.0/33", "Unix"])
def test_a_trusted_proxy_that_is_no_address_stops_the_settings(value):
    from django.core.exceptions import ImproperlyConfigured

    from gpuadmin.accounts.throttling import parse_trusted_proxies

    with pytest.raises(ImproperlyConfigured, match="GPUADMIN_TRUSTED_PROXIES"):
        parse_trusted_proxies(value)
    parsed = parse_trusted_proxies(" 127.0.0.1, ::1 ,10.0.0.0/8,unix")
    assert parsed == ["127.0.0.1", "::1", "10.0.0.0/8", "unix"]


@pytest.mark.parametrize("password", ["password123", "iloveyou1", "qwertyuiop"])
def test_common_passwords_are_refused(password):
    with pytest.raises(ValidationError, match="too common"):
        validate_password(password)


def test_a_successful_login_starts_the_approval_window(viewer):
    client = Client()
    log_in(PASSWORD, client=client)
    assert sudo.recently_authenticated(client.get(reverse("fleet")).wsgi_request)
