"""People and their Unix accounts from the lab's directory, so a process's uid names its person.

Each posixAccount the LDAP user filter lets in (``uid``, ``uidNumber``) becomes a ``Person`` with a
fleet-wide Unix ``Account`` (that user on every host), linked to the panel account of the same
person when they signed in. People signed in through OpenID Connect get theirs when the provider
sends the Unix claims (GPUADMIN_OIDC_UNIX_NAME_CLAIM, _UID_CLAIM). What ``import_people``'s CSV says
for one host still wins there (``notify.directory``: a host's own mapping before a fleet-wide one),
so the CSV keeps the exceptions. Nothing is deleted: a person who left keeps their accounts, to
name the processes they left behind; their panel roles are gone (``accounts.directory.ldap``).

``manage.py sync_people`` and the beat task ``notify.sync_people`` (hourly) run ``sync_people``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from gpuadmin.accounts.models import DirectoryIdentity
from gpuadmin.notify.models import Account, Person


@dataclass
class SyncCounts:
    people_added: int = 0
    accounts_added: int = 0
    accounts_changed: int = 0
    roles_refreshed: int = 0
    roles_taken: int = 0

    def __str__(self) -> str:
        return (f"{self.people_added} people and {self.accounts_added} Unix accounts added, "
                f"{self.accounts_changed} accounts changed; roles read again for {self.roles_refreshed} "
                f"people, taken from {self.roles_taken} the directory no longer has")


def ldap_configured() -> bool:
    return bool(getattr(settings, "AUTH_LDAP_SERVER_URI", ""))


def sync_people() -> SyncCounts:
    """Refresh people, Unix accounts and roles from the directory; nothing to do without one."""
    counts = SyncCounts()
    if ldap_configured():
        from gpuadmin.accounts.directory import ldap

        counts.roles_refreshed, counts.roles_taken = ldap.refresh_signed_in_people()
        users = {i.subject.lower(): i.user for i in DirectoryIdentity.objects.select_related("user")
                 .filter(source=DirectoryIdentity.Source.LDAP)}
        for entry in ldap.posix_people():
            with transaction.atomic():
                _one(counts, name=entry.name, email=entry.email, unix_name=entry.unix_name,
                     unix_uid=entry.unix_uid, user=users.get(entry.dn.lower()))
    for identity in (DirectoryIdentity.objects.select_related("user")
                     .filter(source=DirectoryIdentity.Source.OIDC).exclude(unix_name="", unix_uid=None)):
        user = identity.user
        with transaction.atomic():
            _one(counts, name=user.get_full_name() or user.get_username(), email=user.email,
                 unix_name=identity.unix_name, unix_uid=identity.unix_uid, user=user)
    return counts


def _one(counts: SyncCounts, *, name: str, email: str, unix_name: str, unix_uid: int | None,
         user: Any) -> None:
    if not unix_name and unix_uid is None:
        return
    person = Person.objects.filter(user=user).first() if user is not None else None
    if person is None and email:
        person = Person.objects.filter(email__iexact=email).first()
    if person is None:
        person = Person.objects.create(name=name or unix_name, email=email)
        counts.people_added += 1
    if user is not None and person.user_id is None:
        person.user = user
        person.save(update_fields=["user"])
    fleet_wide = Account.objects.filter(person=person, kind=Account.Kind.UNIX, host__isnull=True)
    account = fleet_wide.filter(name=unix_name).first() if unix_name else None
    if account is None and unix_uid is not None:
        account = fleet_wide.filter(uid=unix_uid).first()
    if account is None:
        Account.objects.create(person=person, kind=Account.Kind.UNIX, host=None, name=unix_name, uid=unix_uid)
        counts.accounts_added += 1
    elif (account.name, account.uid) != (unix_name, unix_uid):
        account.name, account.uid = unix_name, unix_uid
        account.save(update_fields=["name", "uid"])
        counts.accounts_changed += 1
