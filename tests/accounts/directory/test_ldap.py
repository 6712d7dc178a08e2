"""LDAP sign-in against a real slapd (conftest.py): StartTLS and LDAPS with the CA verified, search
and direct bind, groups as roles (a group removed takes the role, and a token's use of it, at the
next sign-in), a disabled account, a wrong certificate, and the password again for approving."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.urls import reverse
from knox.models import AuthToken

from gpuadmin.accounts import sudo
from gpuadmin.accounts.models import DirectoryIdentity
from gpuadmin.accounts.roles import role_names
from gpuadmin.audit.models import Action, AuditEvent
from tests.accounts.directory.fixtures import GROUP, PEOPLE, as_root, ldap
from tests.accounts.helpers import SIXTEEN_MINUTES, age_the_login
from tests.fleet.helpers import store_busy_host
from tests.services import make_tls_files

pytestmark = pytest.mark.django_db


def sign_in(username: str, password: str) -> tuple[Client, object]:
    client = Client()
    response = client.post(reverse("login"), {"username": username, "password": password})
    return client, response


@pytest.mark.account_audit
def test_a_directory_person_signs_in_over_starttls_with_the_roles_of_their_groups(use_ldap):
    use_ldap()
    client, response = sign_in("alice", "alice-pw")
    assert response.status_code == 302, response.content.decode()[:400]
    alice = User.objects.get(username="alice")
    assert role_names(alice) == {"viewer", "requester", "approver"}
    assert (alice.email, alice.first_name) == ("alice@lab.example", "Alice")
    assert not alice.has_usable_password()
    identity = alice.directory_identity
    assert (identity.source, identity.subject, identity.unix_name, identity.unix_uid) == (
        DirectoryIdentity.Source.LDAP, f"uid=alice,{PEOPLE}", "alice", 2001)
    changes = AuditEvent.objects.filter(action=Action.ROLES_CHANGED)
    assert [(e.details["user"], e.details["via"], e.details["added"]) for e in changes] == [
        ("alice", "LDAP sign-in", ["approver", "requester"])]
    # A sign-in counts for approving, as a local one does.
    assert client.get(reverse("kill_requests")).status_code == 200
    assert sudo.SESSION_KEY in client.session


def test_ldaps_and_a_direct_bind_sign_in_too(use_ldap, slapd):
    use_ldap(GPUADMIN_LDAP_SERVER_URI=slapd.ldaps_url, GPUADMIN_LDAP_START_TLS=None,
             GPUADMIN_LDAP_USER_DN_TEMPLATE=f"uid=%(user)s,{PEOPLE}", GPUADMIN_LDAP_BIND_DN=None,
             GPUADMIN_LDAP_BIND_PASSWORD=None)
    _, response = sign_in("bob", "bob-pw")
    assert response.status_code == 302
    assert role_names(User.objects.get(username="bob")) == {"viewer"}
    _, wrong = sign_in("bob", "not-bob")
    assert wrong.status_code == 200
    assert "did not match" in wrong.content.decode()


@pytest.mark.account_audit
def test_a_group_removed_in_the_directory_is_a_role_gone_at_the_next_sign_in_token_included(
        use_ldap, ldap_directory, capsys):
    use_ldap()
    store_busy_host("gpu01")
    sign_in("bob", "bob-pw")
    bob = User.objects.get(username="bob")
    _, key = AuthToken.objects.create(user=bob)
    api = Client(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get(reverse("api_hosts")).status_code == 200

    ldap_directory.modify_s(GROUP["viewer"], [(ldap.MOD_DELETE, "member", [f"uid=bob,{PEOPLE}".encode()])])
    _, response = sign_in("bob", "bob-pw")
    assert response.status_code == 302  # still a person of the lab, with no role now
    assert role_names(User.objects.get(username="bob")) == set()
    assert api.get(reverse("api_hosts")).status_code == 403
    changes = AuditEvent.objects.filter(action=Action.ROLES_CHANGED).order_by("sequence")
    assert [(e.details.get("added"), e.details.get("removed"), e.details["via"]) for e in changes] == [
        (["viewer"], None, "LDAP sign-in"), (None, ["viewer"], "LDAP sign-in")]


def test_a_disabled_account_cannot_sign_in(use_ldap):
    use_ldap()
    _, response = sign_in("carol", "carol-pw")
    assert response.status_code == 200
    assert "did not match" in response.content.decode()
    assert not User.objects.filter(username="carol").exists()


@pytest.mark.parametrize("over", ["starttls", "ldaps"])
def test_a_certificate_the_ca_did_not_sign_is_refused_with_a_clear_error(use_ldap, slapd, tmp_path, caplog,
                                                                         over):
    other_ca, _, _ = make_tls_files(tmp_path, "localhost")
    env = {"GPUADMIN_LDAP_CA_FILE": str(other_ca)}
    if over == "ldaps":
        env.update(GPUADMIN_LDAP_SERVER_URI=slapd.ldaps_url, GPUADMIN_LDAP_START_TLS=None)
    use_ldap(**env)
    with caplog.at_level(logging.ERROR, logger="gpuadmin.accounts.directory.ldap"):
        _, response = sign_in("alice", "alice-pw")
    assert response.status_code == 200
    page = response.content.decode()
    assert "its TLS certificate was not accepted" in page
    assert "did not match" not in page
    assert any("GPUADMIN_LDAP_CA_FILE" in r.getMessage() for r in caplog.records)
    assert not User.objects.filter(username="alice").exists()


def test_loading_the_apps_leaves_the_ldap_libraries_unimported_until_the_backend_is_made():
    # Every worker, page server and management command loads the apps; the LDAP libraries are needed only
    # where LDAP signs people in, and the backend connects the error receiver above when it is made.
    program = ("import sys, django; django.setup(); "
               "print('ldap' in sys.modules or 'django_auth_ldap' in sys.modules); "
               "from django_auth_ldap.backend import ldap_error; print(bool(ldap_error.receivers)); "
               "from gpuadmin.accounts.directory.ldap import DirectoryLDAPBackend; DirectoryLDAPBackend(); "
               "print(bool(ldap_error.receivers))")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "DJANGO_SETTINGS_MODULE": "gpuadmin.settings"}, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "True"]


def test_plain_ldap_is_refused_unless_the_network_is_said_to_be_trusted(use_ldap, slapd):
    with pytest.raises(ImproperlyConfigured, match="would send passwords in clear"):
        use_ldap(GPUADMIN_LDAP_START_TLS=None)
    assert use_ldap(GPUADMIN_LDAP_START_TLS=None, GPUADMIN_LDAP_ALLOW_PLAINTEXT="1")


def test_a_local_account_of_the_same_name_is_not_taken_over(use_ldap, caplog):
    use_ldap()
    User.objects.create_user("alice", password="local-password")
    _, response = sign_in("alice", "alice-pw")
    assert response.status_code == 200
    assert role_names(User.objects.get(username="alice")) == set()
    assert not DirectoryIdentity.objects.exists()
    assert "a local account of that name exists" in caplog.text


def test_approving_asks_the_directory_password_again(use_ldap):
    use_ldap()
    client, _ = sign_in("alice", "alice-pw")
    age_the_login(client, SIXTEEN_MINUTES)
    url = reverse("reauthenticate") + "?next=/kills/"
    wrong = client.post(url, {"password": "not-alice", "next": "/kills/"})
    assert wrong.status_code == 400
    right = client.post(url, {"password": "alice-pw", "next": "/kills/"})
    assert right.status_code == 302
    seconds = sudo.seconds_since_authentication(right.wsgi_request)
    assert seconds is not None and seconds < 60


def test_the_lab_fixture_is_what_the_tests_say(slapd):
    # Guards the tests above: carol is in the directory (so her refusal is the filter's doing).
    found = as_root(slapd).search_s(PEOPLE, ldap.SCOPE_ONELEVEL, "(uid=carol)", ["loginShell"])
    assert found[0][1]["loginShell"] == [b"/usr/sbin/nologin"]
