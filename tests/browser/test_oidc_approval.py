"""An approver who signs in through the lab's OpenID Connect provider approves a kill request in a
real browser: the panel's login page leads to the provider's (a real one, under node:
tests/accounts/directory/fixtures.py), and Approve, once the sign-in is older than the
re-authentication window, sends them back to the provider, which asks again (prompt=login) even
though its own session is still open; only then does Approve go through."""

from __future__ import annotations

import copy
import re

import pytest
from django.conf import settings
from django.contrib.sessions.backends.db import SessionStore

from gpuadmin.accounts import sudo
from gpuadmin.accounts.roles import Role
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.states import Status
from tests.kills.helpers import file, lab, sent  # noqa: F401 - lab, sent: fixtures
from tests.people import make_person

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


def provider_signs_in(page, username: str, password: str) -> None:
    page.wait_for_selector("#sign-in")
    assert page.url.startswith("http://127.0.0.1:"), page.url  # the provider's page, not the panel's
    page.fill("#login", username)
    page.fill("#password", password)
    page.click("#sign-in")


def age_sign_in(context, seconds: float) -> None:
    key = next(c["value"] for c in context.cookies() if c["name"] == settings.SESSION_COOKIE_NAME)
    session = SessionStore(session_key=key)
    session[sudo.SESSION_KEY] = {**session[sudo.SESSION_KEY], "at": session[sudo.SESSION_KEY]["at"] - seconds}
    session.save()


def test_sign_in_through_the_provider_and_approve_after_it_asks_again(  # noqa: PLR0917 - fixtures
        live_server, guarded_page, use_oidc, lab, sent, settings):  # noqa: F811
    page, guard = guarded_page
    # As gpuadmin/settings.py does for a configured provider: forms may lead there (re-authentication).
    policy = copy.deepcopy(settings.CONTENT_SECURITY_POLICY)
    policy["DIRECTIVES"]["form-action"] = [*policy["DIRECTIVES"]["form-action"], use_oidc.issuer]
    settings.CONTENT_SECURITY_POLICY = policy
    kill_request = file(make_person("rick", Role.REQUESTER), 4120)

    page.goto(f"{live_server.url}/login/")
    page.click("#oidc-sign-in")
    provider_signs_in(page, "alice", "alice-pw")
    page.wait_for_url(re.compile(re.escape(live_server.url) + "/"))
    age_sign_in(page.context, 16 * 60)

    page.goto(f"{live_server.url}/kills/{kill_request.pk}/")
    page.click("form[action$='/approve/'] button")
    provider_signs_in(page, "alice", "alice-pw")  # asked again, though the provider's session is open
    page.wait_for_url(f"{live_server.url}/kills/{kill_request.pk}/")
    # Nothing was done behind her back: she approves, now that it counts.
    assert KillRequest.objects.get(pk=kill_request.pk).status == Status.PENDING
    page.click("form[action$='/approve/'] button")
    page.wait_for_load_state("networkidle")
    approved = KillRequest.objects.get(pk=kill_request.pk)
    assert approved.status != Status.PENDING and approved.approved_by.username == "alice"
    guard.assert_clean()
