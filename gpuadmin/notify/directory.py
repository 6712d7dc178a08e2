"""Who is uid 1000 on gpu07: unix and Slurm accounts resolved to people, for one host at a time.

``Directory.for_host(host)`` loads the host's accounts and the fleet-wide ones in one query
(``for_hosts``: any number of hosts' in one);
``person_for`` then answers for any number of processes without another. A host's own
mapping wins over a fleet-wide one, and for a process of a Slurm job a Slurm account wins
over a unix one (clusters whose Slurm and unix names differ map both).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Q

from gpuadmin.fleet.models import Host
from gpuadmin.fleet.process_tree import ProcessRow
from gpuadmin.notify.models import Account, Person
from gpuadmin.probe.owners import SLURM_JOB


class Directory:
    def __init__(self, accounts: Iterable[Account]) -> None:
        self.accounts = tuple(accounts)
        # (kind, host-specific?, "uid"/"name", value) -> the first such account's person: a lookup
        # per process, however many accounts the lab has.
        self._index: dict[tuple[str, bool, str, object], Person] = {}
        for account in self.accounts:
            specific = account.host_id is not None
            if account.uid is not None:
                self._index.setdefault((account.kind, specific, "uid", account.uid), account.person)
            if account.name:
                self._index.setdefault((account.kind, specific, "name", account.name), account.person)

    @classmethod
    def for_host(cls, host: Host | None) -> Directory:
        where = Q(host__isnull=True) | Q(host=host) if host is not None else Q(host__isnull=True)
        return cls(Account.objects.filter(where).select_related("person").order_by("pk"))

    @classmethod
    def for_hosts(cls, hosts: Iterable[Host]) -> dict[int, Directory]:
        """``for_host`` of each of ``hosts`` (by pk), from one query: the fleet-wide accounts indexed
        once and shared by every host without accounts of its own (fair use reads the whole fleet
        every minute)."""
        accounts = list(Account.objects.select_related("person").order_by("pk"))
        fleet_wide = [account for account in accounts if account.host_id is None]
        own: dict[int, list[Account]] = {}
        for account in accounts:
            if account.host_id is not None:
                own.setdefault(account.host_id, []).append(account)
        shared = cls(fleet_wide)
        return {host.pk: cls(sorted([*fleet_wide, *own[host.pk]], key=lambda a: a.pk)) if host.pk in own
                else shared for host in hosts}

    def person_for(self, *, uid: int | None, user: str | None, owner: dict[str, Any] | None = None
                   ) -> Person | None:
        """The person behind a process's uid / user name (the Slurm job's uid when its cgroup names one)."""
        in_job = owner is not None and owner.get("kind") == SLURM_JOB
        if owner is not None and in_job and owner.get("uid") is not None:
            uid = owner["uid"]
        kinds = (Account.Kind.SLURM, Account.Kind.UNIX) if in_job else (Account.Kind.UNIX,)
        for kind in kinds:
            for specific in (True, False):
                for field, value in (("uid", uid), ("name", user)):
                    if value is None or value == "":
                        continue
                    person = self._index.get((kind, specific, field, value))
                    if person is not None:
                        return person
        return None

    def person_of_row(self, row: ProcessRow) -> Person | None:
        return self.person_for(uid=row.uid, user=row.user, owner=row.owner)

    def name_of_row(self, row: ProcessRow) -> str:
        """The person's name for the host page's tables ("" when nobody is mapped)."""
        person = self.person_of_row(row)
        return person.name if person else ""

    def people_for(self, processes: Iterable[Any]) -> dict[int, list[Any]]:
        """Person pk -> the processes (anything with uid, user, owner) that are theirs."""
        found: dict[int, list[Any]] = {}
        for process in processes:
            person = self.person_for(uid=process.uid, user=process.user, owner=process.owner)
            if person is not None:
                found.setdefault(person.pk, []).append(process)
        return found
