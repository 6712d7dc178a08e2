"""OpenID Connect sign-in against a real provider (panva's oidc-provider under node, conftest.py):
the groups claim as roles, a group removed, re-authentication that makes the provider ask again,
and the ID token checks the library leaves to its user."""

from __future__ import annotations

import time

import pytest
import requests
from django.contrib.auth.models import User
from django.core.exceptions import SuspiciousOperation
from django.test import Client
from django.urls import reverse
from knox.models import AuthToken

from gpuadmin.accounts import sudo
from gpuadmin.accounts.directory import oidc
from gpuadmin.accounts.models import DirectoryIdentity
from gpuadmin.accounts.roles import role_names
from gpuadmin.audit.models import Action, AuditEvent
from tests.accounts.directory.fixtures import OIDC_PEOPLE
from tests.accounts.directory.provider_pages import Person
from tests.accounts.helpers import SIXTEEN_MINUTES, age_the_login
from tests.fleet.helpers import store_busy_host

pytestmark = pytest.mark.django_db


@pytest.mark.account_audit
def test_sign_in_through_the_provider_with_the_roles_of_the_groups_claim(use_oidc):
    page = Client().get(reverse("login")).content.decode()
    assert "Sign in with Test provider" in page
    alice = Person()
    response = alice.go(reverse("oidc_authentication_init"), "alice", "alice-pw")
    assert response.status_code == 302 and response["Location"] == "/", response
    user = User.objects.get(username="alice")
    assert role_names(user) == {"viewer", "requester", "approver"}
    assert (user.email, user.first_name, user.has_usable_password()) == ("alice@lab.example", "Alice", False)
    assert user.directory_identity.subject == f"{use_oidc.issuer} alice"
    assert user.directory_identity.source == DirectoryIdentity.Source.OIDC
    changes = AuditEvent.objects.filter(action=Action.ROLES_CHANGED)
    assert [(e.details["via"], e.details["added"]) for e in changes] == [
        ("OpenID Connect sign-in", ["approver", "requester"])]
    # The sign-in counts for approving from the provider's auth_time, which is just now.
    seconds = sudo.seconds_since_authentication(response.wsgi_request)
    assert seconds is not None and seconds < 60


def test_a_group_removed_at_the_provider_is_a_role_gone_at_the_next_sign_in_token_included(use_oidc):
    store_busy_host("gpu01")
    Person().go(reverse("oidc_authentication_init"), "bob", "bob-pw")
    bob = User.objects.get(username="bob")
    _, key = AuthToken.objects.create(user=bob)
    api = Client(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get(reverse("api_hosts")).status_code == 200
    use_oidc.set_people({**OIDC_PEOPLE, "bob": {**OIDC_PEOPLE["bob"], "groups": []}})
    Person().go(reverse("oidc_authentication_init"), "bob", "bob-pw")
    assert role_names(User.objects.get(username="bob")) == set()
    assert api.get(reverse("api_hosts")).status_code == 403


@pytest.mark.account_audit
def test_approving_sends_the_person_back_to_the_provider_which_asks_again(use_oidc):
    alice = Person()
    alice.go(reverse("oidc_authentication_init"), "alice", "alice-pw")
    assert alice.provider_asked == 1
    age_the_login(alice.client, SIXTEEN_MINUTES)
    # The password page is not for them: it sends them to the provider, with prompt=login and max_age=0.
    start = alice.client.get(reverse("reauthenticate") + "?next=/kills/")
    assert start.status_code == 302 and start["Location"].startswith(reverse("oidc_reauthenticate"))
    to_provider = alice.client.get(start["Location"])
    assert "prompt=login" in to_provider["Location"] and "max_age=0" in to_provider["Location"]
    back = alice.go(start["Location"], "alice", "alice-pw")
    assert alice.provider_asked == 2  # the provider's own session did not answer for her
    assert back.status_code == 302 and back["Location"] == "/kills/"
    seconds = sudo.seconds_since_authentication(back.wsgi_request)
    assert seconds is not None and seconds < 60
    assert [e.details["via"] for e in AuditEvent.objects.filter(action=Action.REAUTHENTICATED)] == [
        "OpenID Connect re-authentication"]


def test_a_re_authentication_the_provider_answered_without_asking_counts_for_nothing(use_oidc):
    alice = Person()
    alice.go(reverse("oidc_authentication_init"), "alice", "alice-pw")
    age_the_login(alice.client, SIXTEEN_MINUTES)
    to_provider = alice.client.get(reverse("oidc_reauthenticate") + "?next=/kills/")
    # As if the provider's auth_time were from before we asked (a provider that ignores prompt=login).
    session = alice.client.session
    session[oidc.REAUTH_SESSION_KEY]["at"] = time.time() + 3600
    session.save()
    back = alice.go_on(to_provider["Location"], "alice", "alice-pw")
    assert back.status_code == 302 and "directory_error" in back["Location"]
    assert not sudo.recently_authenticated(back.wsgi_request)


def test_someone_else_signing_in_at_the_provider_does_not_re_authenticate_this_session(use_oidc):
    alice = Person()
    alice.go(reverse("oidc_authentication_init"), "alice", "alice-pw")
    age_the_login(alice.client, SIXTEEN_MINUTES)
    alice.provider = requests.Session()  # the provider's session is over: whoever signs in there now
    back = alice.go(reverse("oidc_reauthenticate") + "?next=/kills/", "bob", "bob-pw")
    assert "directory_error" in back["Location"]
    assert back.wsgi_request.user.get_username() == "alice"
    assert not sudo.recently_authenticated(back.wsgi_request)


def test_a_local_account_of_the_same_name_is_not_taken_over(use_oidc):
    User.objects.create_user("alice", password="local-password")
    back = Person().go(reverse("oidc_authentication_init"), "alice", "alice-pw")
    assert "directory_error" in back["Location"]
    assert not DirectoryIdentity.objects.exists()
    assert role_names(User.objects.get(username="alice")) == set()


@pytest.mark.parametrize(("claims", "refusal"), [
    ({"iss": "https://elsewhere", "aud": "gpuadmin", "sub": "a"}, "issuer"),
    ({"iss": "https://sso", "aud": "another-client", "sub": "a"}, "audience"),
    ({"iss": "https://sso", "aud": ["gpuadmin", "another-client"], "azp": "another-client", "sub": "a"},
     "several audiences"),
    ({"iss": "https://sso", "aud": "gpuadmin"}, "subject"),
])
def test_an_id_token_for_another_client_or_from_another_issuer_is_refused(claims, refusal):
    with pytest.raises(SuspiciousOperation, match=refusal):
        oidc.check_id_token_claims(claims, issuer="https://sso", client_id="gpuadmin")
    oidc.check_id_token_claims({"iss": "https://sso", "aud": ["gpuadmin"], "sub": "a"}, issuer="https://sso",
                               client_id="gpuadmin")


def test_without_a_provider_there_is_no_button_and_no_sign_in_page(db):
    assert "Sign in with" not in Client().get(reverse("login")).content.decode()
    assert Client().get(reverse("oidc_authentication_init")).status_code == 404


def test_a_sign_in_the_provider_answered_from_its_session_counts_from_when_it_last_asked(use_oidc):
    alice = Person()
    alice.go(reverse("oidc_authentication_init"), "alice", "alice-pw")
    time.sleep(2.5)
    alice.client = Client()  # a new panel session; the provider's is still open and does not ask
    back = alice.go(reverse("oidc_authentication_init"), "alice", "alice-pw")
    assert alice.provider_asked == 1
    seconds = sudo.seconds_since_authentication(back.wsgi_request)
    assert seconds is not None and seconds >= 2


@pytest.mark.parametrize(("amr", "counts"), [(None, False), (["pwd", "otp"], True)])
def test_with_totp_required_a_re_authentication_counts_only_with_a_second_factor(use_oidc, settings, amr,
                                                                                 counts):
    settings.GPUADMIN_REQUIRE_TOTP_FOR_APPROVAL = True
    if amr:
        use_oidc.set_people({**OIDC_PEOPLE, "alice": {**OIDC_PEOPLE["alice"], "amr": amr}})
    alice = Person()
    alice.go(reverse("oidc_authentication_init"), "alice", "alice-pw")
    back = alice.go(reverse("oidc_reauthenticate") + "?next=/kills/", "alice", "alice-pw")
    assert alice.provider_asked == 2
    assert sudo.recently_authenticated(back.wsgi_request) is counts
