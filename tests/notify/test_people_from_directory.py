"""People and Unix accounts from the lab's directory (a real slapd: tests/accounts/directory/fixtures.py),
``manage.py sync_people`` and its beat task; the CSV's per-host mapping still wins on its host."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from knox.models import AuthToken

from gpuadmin.accounts.roles import role_names
from gpuadmin.celery import app
from gpuadmin.fleet.models import Host
from gpuadmin.notify.directory import Directory
from gpuadmin.notify.models import Account, Person
from gpuadmin.notify.tasks import sync_people
from gpuadmin.wire.task_names import SYNC_PEOPLE
from tests.accounts.directory.fixtures import GROUP, PEOPLE, ldap
from tests.fleet.helpers import store_busy_host

pytestmark = pytest.mark.django_db


def test_every_posix_account_becomes_a_person_with_their_unix_user_on_every_host(use_ldap, capsys):
    use_ldap()
    call_command("sync_people")
    assert "2 people and 2 Unix accounts added" in capsys.readouterr().out  # carol's shell keeps her out
    accounts = {(a.person.name, a.person.email, a.name, a.uid, a.host_id)
                for a in Account.objects.select_related("person")}
    assert accounts == {("Alice Liddell", "alice@lab.example", "alice", 2001, None),
                        ("Bob Liddell", "bob@lab.example", "bob", 2002, None)}
    assert Directory.for_host(None).person_for(uid=2002, user=None).name == "Bob Liddell"
    call_command("sync_people")
    assert "0 people and 0 Unix accounts added, 0 accounts changed" in capsys.readouterr().out


def test_a_person_who_signed_in_is_linked_and_the_csv_still_wins_on_its_host(use_ldap):
    use_ldap()
    Client().post(reverse("login"), {"username": "alice", "password": "alice-pw"})
    store_busy_host("gpu07")
    someone_else = Person.objects.create(name="Lab guest")
    Account.objects.create(person=someone_else, host=Host.objects.get(name="gpu07"), uid=2001)
    call_command("sync_people")
    alice = Person.objects.get(email="alice@lab.example")
    assert alice.user == User.objects.get(username="alice")
    assert Directory.for_host(Host.objects.get(name="gpu07")).person_for(uid=2001, user=None) == someone_else
    assert Directory.for_host(None).person_for(uid=2001, user=None) == alice


def test_the_sync_takes_roles_from_who_the_directory_no_longer_lets_in_and_their_tokens_stop(
        use_ldap, ldap_directory):
    use_ldap()
    store_busy_host("gpu01")
    Client().post(reverse("login"), {"username": "bob", "password": "bob-pw"})
    bob = User.objects.get(username="bob")
    _, key = AuthToken.objects.create(user=bob)
    api = Client(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get(reverse("api_hosts")).status_code == 200
    # Never signs in again; the directory disables him.
    ldap_directory.modify_s(f"uid=bob,{PEOPLE}", [(ldap.MOD_REPLACE, "loginShell", [b"/usr/sbin/nologin"])])
    try:
        assert "roles" in sync_people()  # the beat task, run here
    finally:
        ldap_directory.modify_s(f"uid=bob,{PEOPLE}", [(ldap.MOD_REPLACE, "loginShell", [b"/bin/bash"])])
    assert role_names(User.objects.get(username="bob")) == set()
    assert api.get(reverse("api_hosts")).status_code == 403


def test_the_sync_reads_roles_again_for_who_is_still_there(use_ldap, ldap_directory):
    use_ldap()
    Client().post(reverse("login"), {"username": "alice", "password": "alice-pw"})
    alice_dn = f"uid=alice,{PEOPLE}".encode()
    ldap_directory.modify_s(GROUP["approver"], [(ldap.MOD_DELETE, "member", [alice_dn])])
    call_command("sync_people")
    assert role_names(User.objects.get(username="alice")) == {"viewer", "requester"}


def test_beat_runs_it_hourly_and_it_needs_a_search_base(use_ldap, slapd):
    assert app.conf.beat_schedule["sync-people"]["task"] == SYNC_PEOPLE
    assert app.conf.beat_schedule["sync-people"]["schedule"] == 3600.0
    use_ldap(GPUADMIN_LDAP_USER_DN_TEMPLATE=f"uid=%(user)s,{PEOPLE}", GPUADMIN_LDAP_USER_SEARCH_BASE=None)
    with pytest.raises(CommandError, match="GPUADMIN_LDAP_USER_SEARCH_BASE"):
        call_command("sync_people")


def test_without_a_directory_there_is_nothing_to_do(capsys):
    call_command("sync_people")
    assert "0 people" in capsys.readouterr().out
    assert not Person.objects.exists()
