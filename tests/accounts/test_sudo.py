"""Approving needs a recent authentication ("sudo mode", gpuadmin/accounts/sudo.py), TOTP when required."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

import pytest
from django.urls import reverse
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice
from knox.models import AuthToken
from rest_framework.test import APIClient

from gpuadmin.accounts import sudo
from gpuadmin.kills.states import Status
from tests.accounts.helpers import SIXTEEN_MINUTES, account_events, age_the_login, logged_in
from tests.kills.helpers import file, refreshed
from tests.people import PASSWORD

pytestmark = [pytest.mark.django_db, pytest.mark.account_audit]

HTMX = {"HTTP_HX_REQUEST": "true"}


def approve_url(pk: int) -> str:
    return reverse("kill_request_approve", args=[pk])


def reauth_url(pk: int) -> str:
    return sudo.reauth_url(reverse("kill_request_detail", args=[pk]))


def current_code(device: TOTPDevice) -> str:
    return f"{totp(device.bin_key, step=device.step, t0=device.t0, digits=device.digits):0{device.digits}d}"


def test_a_fresh_login_approves(lab, requester, approver, sent, django_capture_on_commit_callbacks):
    kill_request = file(requester, 4600)
    client = logged_in("april")
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(approve_url(kill_request.pk))
    assert response.status_code == 302
    assert response["Location"] == reverse("kill_request_detail", args=[kill_request.pk])
    assert refreshed(kill_request).status == Status.APPROVED


def test_an_old_login_is_sent_to_reauthenticate_and_back_to_the_request(lab, requester, approver, sent):
    kill_request = file(requester, 4600)
    client = logged_in("april")
    age_the_login(client, SIXTEEN_MINUTES)
    response = client.post(approve_url(kill_request.pk))
    assert response.status_code == 302
    assert response["Location"].startswith(reauth_url(kill_request.pk) + "&intent=")
    assert refreshed(kill_request).status == Status.PENDING
    # htmx (the inline button on the list) is told to load the page instead of swapping a row.
    inline = client.post(approve_url(kill_request.pk), **HTMX)
    assert inline["HX-Redirect"].startswith(reauth_url(kill_request.pk) + "&intent=")
    assert refreshed(kill_request).status == Status.PENDING


def test_reauthenticating_returns_to_the_request(
        lab, requester, approver, sent, django_capture_on_commit_callbacks):
    kill_request = file(requester, 4600)
    client = logged_in("april")
    age_the_login(client, SIXTEEN_MINUTES)
    page = client.get(reauth_url(kill_request.pk))
    assert "Approving a kill, accepting a host's key and the admin site need your password again" in (
        page.content.decode().replace("&#x27;", "'"))
    next_url = f"/kills/{kill_request.pk}/"
    wrong = client.post(reverse("reauthenticate"), {"password": "not it", "next": next_url})
    assert wrong.status_code == 400
    assert "That password is not right." in wrong.content.decode()
    right = client.post(reverse("reauthenticate"), {"password": PASSWORD, "next": next_url})
    assert (right.status_code, right["Location"]) == (302, f"/kills/{kill_request.pk}/")
    with django_capture_on_commit_callbacks(execute=True):
        client.post(approve_url(kill_request.pk))
    assert refreshed(kill_request).status == Status.APPROVED
    assert ("reauthenticated", "april") in [(a, actor) for a, actor, _ in account_events()]


def intent_of(response) -> str:
    """The intent token the approve POST's redirect to the re-authentication page carries."""
    return parse_qs(urlsplit(response["Location"]).query)["intent"][0]


def test_the_password_finishes_the_approval_it_interrupted(
        lab, requester, approver, sent, django_capture_on_commit_callbacks):
    kill_request = file(requester, 4600)
    client = logged_in("april")
    age_the_login(client, SIXTEEN_MINUTES)
    sent_away = client.post(approve_url(kill_request.pk))
    token = intent_of(sent_away)
    page = client.get(sent_away["Location"]).content.decode()
    # The page names what the password will finish: the request, its target, its host.
    assert f"Approve kill request #{kill_request.pk} on gpu01 (PID 4600 " in page
    assert f'name="intent" value="{token}"' in page
    assert refreshed(kill_request).status == Status.PENDING  # a GET does nothing
    with django_capture_on_commit_callbacks(execute=True):
        done = client.post(reverse("reauthenticate"),
                           {"password": PASSWORD, "next": f"/kills/{kill_request.pk}/", "intent": token},
                           follow=True)
    assert refreshed(kill_request).status == Status.APPROVED
    assert refreshed(kill_request).approved_by == approver
    assert done.redirect_chain[-1][0] == f"/kills/{kill_request.pk}/"
    assert f"Request #{kill_request.pk} approved." in done.content.decode()
    # Finished once: the same POST again finds no intent and approves nothing twice.
    again = client.post(reverse("reauthenticate"),
                        {"password": PASSWORD, "next": f"/kills/{kill_request.pk}/", "intent": token})
    assert again["Location"] == f"/kills/{kill_request.pk}/"
    assert [a for a, _, _ in account_events()].count("approved") <= 1


def test_the_password_finishes_nothing_without_the_token_or_after_the_intent_is_stale(
        lab, requester, approver, sent):
    kill_request = file(requester, 4600)
    client = logged_in("april")
    age_the_login(client, SIXTEEN_MINUTES)
    token = intent_of(client.post(approve_url(kill_request.pk)))
    for other in ("", "not-the-token"):
        client.post(reverse("reauthenticate"), {"password": PASSWORD, "intent": other})
        assert refreshed(kill_request).status == Status.PENDING
    age_the_login(client, SIXTEEN_MINUTES)
    token = intent_of(client.post(approve_url(kill_request.pk)))
    session = client.session
    session[sudo.INTENT_SESSION_KEY]["at"] -= sudo.INTENT_MAX_AGE_SECONDS + 1
    session.save()
    client.post(reverse("reauthenticate"), {"password": PASSWORD, "intent": token})
    assert refreshed(kill_request).status == Status.PENDING


def test_the_finished_approval_still_checks_what_changed(lab, requester, approver, sent):
    from tests.kills.helpers import lab_snapshot, store_snapshot

    kill_request = file(requester, 4600)
    client = logged_in("april")
    age_the_login(client, SIXTEEN_MINUTES)
    token = intent_of(client.post(approve_url(kill_request.pk)))
    store_snapshot(lab_snapshot(drop=(4600,)))  # the target exits while the approver types
    done = client.post(reverse("reauthenticate"), {"password": PASSWORD, "intent": token}, follow=True)
    assert refreshed(kill_request).status == Status.PENDING
    assert "Something changed since this page was shown" in done.content.decode()


def test_reauthentication_never_sends_the_browser_to_another_site(approver):
    client = logged_in("april")
    response = client.post(reverse("reauthenticate"), {"password": PASSWORD, "next": "https://evil.example/"})
    assert response["Location"] == reverse("kill_requests")


def test_the_session_api_asks_for_reauthentication_too(lab, requester, approver, sent):
    kill_request = file(requester, 4600)
    client = logged_in("april")
    age_the_login(client, SIXTEEN_MINUTES)
    url = f"/api/v1/kill-requests/{kill_request.pk}/approve"
    response = client.post(url, {}, content_type="application/json")
    assert response.status_code == 403
    assert response.json()["reauth_url"] == reauth_url(kill_request.pk)
    assert refreshed(kill_request).status == Status.PENDING


# --- TOTP -------------------------------------------------------------------------------


@pytest.fixture
def totp_required(settings) -> None:
    settings.GPUADMIN_REQUIRE_TOTP_FOR_APPROVAL = True


def test_with_totp_required_a_login_alone_does_not_approve(totp_required, lab, requester, approver, sent):
    kill_request = file(requester, 4600)
    response = logged_in("april").post(approve_url(kill_request.pk))
    assert response["Location"].startswith(reauth_url(kill_request.pk) + "&intent=")


@pytest.mark.usefixtures("totp_required", "lab", "sent")
def test_with_totp_required_reauthentication_needs_a_current_code(
        requester, approver, capsys, django_capture_on_commit_callbacks):
    from django.core.management import call_command

    call_command("totp_device", "april")
    assert capsys.readouterr().out.startswith("otpauth://totp/gpuadmin%3Aapril?secret=")
    device = TOTPDevice.objects.get(user=approver)
    kill_request = file(requester, 4600)
    client = logged_in("april")
    next_url = f"/kills/{kill_request.pk}/"
    without = client.post(reverse("reauthenticate"), {"password": PASSWORD, "next": next_url})
    assert "That code is not right" in without.content.decode()
    # (A wrong code would hold the device back for a second: django-otp's throttling.)
    right = client.post(reverse("reauthenticate"),
                        {"password": PASSWORD, "totp": current_code(device), "next": next_url})
    assert right["Location"] == next_url
    with django_capture_on_commit_callbacks(execute=True):
        client.post(approve_url(kill_request.pk))
    assert refreshed(kill_request).status == Status.APPROVED
    assert [a for a, _, _ in account_events() if a.startswith("totp")] == ["totp_device_added"]


def test_a_wrong_code_does_not_count(totp_required, approver, capsys):
    from django.core.management import call_command

    call_command("totp_device", "april")
    device = TOTPDevice.objects.get(user=approver)
    wrong = "000000" if current_code(device) != "000000" else "111111"
    client = logged_in("april")
    page = client.post(reverse("reauthenticate"), {"password": PASSWORD, "totp": wrong, "next": "/kills/"})
    assert page.status_code == 400
    assert "That code is not right" in page.content.decode()
    assert not sudo.recently_authenticated(client.get("/kills/").wsgi_request)


def test_with_totp_required_an_account_without_a_device_is_told_how_to_get_one(totp_required, approver):
    client = logged_in("april")
    page = client.post(reverse("reauthenticate"), {"password": PASSWORD, "totp": "123456", "next": "/kills/"})
    text = page.content.decode()
    assert "Approving needs a TOTP device, and this account has none." in text
    assert "python manage.py totp_device april" in text


def test_token_approvals_need_a_totp_code_in_the_body_when_totp_is_required(
        totp_required, lab, requester, approver, sent):
    TOTPDevice.objects.create(user=approver, name="authenticator", confirmed=True)
    device = TOTPDevice.objects.get(user=approver)
    kill_request = file(requester, 4600)
    client = APIClient()
    _, key = AuthToken.objects.create(user=approver)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    url = f"/api/v1/kill-requests/{kill_request.pk}/approve"
    refused = client.post(url, {}, format="json")
    assert refused.status_code == 403
    assert "TOTP code" in refused.json()["error"]
    accepted = client.post(url, {"totp": current_code(device)}, format="json")
    assert accepted.status_code == 200, accepted.json()
    assert refreshed(kill_request).status == Status.APPROVED


def test_a_login_counts_for_fifteen_minutes(approver, settings):
    client = logged_in("april")
    request = client.get(reverse("kill_requests")).wsgi_request
    assert sudo.recently_authenticated(request)
    age_the_login(client, settings.GPUADMIN_REAUTH_MAX_AGE_SECONDS + 1)
    request = client.get(reverse("kill_requests")).wsgi_request
    assert not sudo.recently_authenticated(request)
    assert sudo.seconds_since_authentication(request) < time.time()
