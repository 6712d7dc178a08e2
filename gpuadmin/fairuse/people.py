"""Who a panel user is in the directory, and which processes of the fleet are theirs.

The directory (``gpuadmin/notify/directory.py``) is the one home of "who is uid 1000 on
gpu07"; this module asks it per host for self-service ("My GPUs") and for the policies. A
process is a person's by its own uid or user name, never a Slurm job's: the agent checks the
process's uid before it signals a self-service order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuadmin.fleet.models import Gpu, Host, LatestSnapshot
from gpuadmin.fleet.process_tree import ProcessRow, process_rows
from gpuadmin.notify.directory import Directory
from gpuadmin.notify.models import Person


def person_of(user: Any) -> Person | None:
    """The directory's person linked to a panel account (None for none, or for no one signed in)."""
    if user is None or not user.is_authenticated:
        return None
    return Person.objects.filter(user_id=user.pk).first()


def owns(directory: Directory, person: Person, row: ProcessRow) -> bool:
    if row.uid is None:
        return False
    owner = directory.person_for(uid=row.uid, user=row.user, owner=None)
    return owner is not None and owner.pk == person.pk


def own_uids(person: Person, host: Host) -> frozenset[int]:
    """The uids that are ``person``'s on ``host``: mapped by uid, or by name as the newest snapshot shows."""
    directory = Directory.for_host(host)
    uids = {
        a.uid
        for a in directory.accounts
        if a.person_id == person.pk and a.kind == a.Kind.UNIX and a.uid is not None
    }
    document = LatestSnapshot.objects.document_for(host)
    if document is not None:
        uids |= {
            row.uid
            for row in process_rows(document).values()
            if row.uid is not None and owns(directory, person, row)
        }
    # A uid the directory gives someone else on this host (a host-specific mapping wins) is not theirs.
    return frozenset(
        uid
        for uid in uids
        if (owner := directory.person_for(uid=uid, user=None)) is None or owner.pk == person.pk
    )


@dataclass(frozen=True)
class Held:
    """One GPU process of a person, as "My GPUs" shows it."""

    host: Host
    row: ProcessRow
    gpu_indexes: tuple[int, ...]
    idle_seconds: float | None  # how long its GPUs have been held at 0% (None: busy or unknown)


def processes_of(person: Person, now: Any, *, others: bool = False) -> list[Held]:
    """Every GPU-holding process of ``person`` across the fleet's newest snapshots (``others``:
    everyone else's that the directory names, for a nudge)."""
    held: list[Held] = []
    hosts = list(Host.objects.fleet())
    directories = Directory.for_hosts(hosts)
    gpus: dict[tuple[int, str], Gpu] = {(g.host_id, g.uuid): g for g in Gpu.objects.filter(present=True)}
    for host, rows in LatestSnapshot.objects.process_rows_of(hosts):
        directory = directories[host.pk]
        for row in rows.values():
            if not row.gpu_memory_bytes or owns(directory, person, row) == others:
                continue
            if others and directory.person_for(uid=row.uid, user=row.user, owner=row.owner) is None:
                continue
            mine = [
                gpus[(host.pk, uuid)]
                for uuid, used in row.gpu_memory_bytes.items()
                if used and (host.pk, uuid) in gpus
            ]
            idle = [g.idle_since for g in mine if g.idle_since is not None]
            held.append(
                Held(
                    host=host,
                    row=row,
                    gpu_indexes=tuple(sorted(g.index for g in mine)),
                    idle_seconds=(now - max(idle)).total_seconds()
                    if idle and len(idle) == len(mine)
                    else None,
                )
            )
    return sorted(held, key=lambda h: (h.host.name, h.row.pid))
