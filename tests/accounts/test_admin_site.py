"""Every admin page needs the same recent re-authentication as approving (gpuadmin/accounts/admin_site.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from gpuadmin.accounts import sudo
from tests.accounts.helpers import SIXTEEN_MINUTES, age_the_login, logged_in
from tests.people import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def boss() -> User:
    return User.objects.create_superuser("boss", password=PASSWORD)


def stale_admin() -> Client:
    client = logged_in("boss")
    age_the_login(client, SIXTEEN_MINUTES)
    return client


def test_a_fresh_login_gets_the_admin(boss):
    assert logged_in("boss").get(reverse("admin:index")).status_code == 200


def test_a_stale_session_is_sent_to_reauthenticate_and_back(boss):
    client = stale_admin()
    page = reverse("admin:auth_user_change", args=[boss.pk])
    response = client.get(page)
    assert (response.status_code, response["Location"]) == (302, sudo.reauth_url(page))
    back = client.post(reverse("reauthenticate"), {"password": PASSWORD, "next": page})
    assert (back.status_code, back["Location"]) == (302, page)
    assert client.get(page).status_code == 200


def test_a_stale_session_changes_nobodys_password(boss, approver):
    url = reverse("admin:auth_user_password_change", args=[approver.pk])
    response = stale_admin().post(url, {"password1": "violet stapler meadow",
                                        "password2": "violet stapler meadow", "usable_password": "true"})
    assert response["Location"] == sudo.reauth_url(url)
    approver.refresh_from_db()
    assert approver.check_password(PASSWORD)


def test_with_totp_required_only_a_reauthentication_with_a_code_counts(boss, settings):
    settings.GPUADMIN_REQUIRE_TOTP_FOR_APPROVAL = True
    response = logged_in("boss").get(reverse("admin:index"))
    assert response["Location"] == sudo.reauth_url(reverse("admin:index"))


def test_logging_out_never_asks(boss):
    client = stale_admin()
    response = client.post(reverse("admin:logout"))
    assert not response["Location"].startswith(reverse("reauthenticate"))
    assert "_auth_user_id" not in client.session


def test_people_without_admin_access_are_still_sent_to_log_in(approver):
    response = logged_in("april").get(reverse("admin:index"))
    assert response["Location"].startswith(reverse("admin:login"))
