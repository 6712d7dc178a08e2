"""What a policy's condition finds in the fleet's live state right now (never the usage ledger).

Idle holders come from the GPUs' ``idle_since`` (kept by ingest, the same rule as the "idle
holder" finding: visible processes hold memory at 0% utilisation); orphans and zombie trees from
the findings' own readings of a snapshot (``process_tree.orphans`` / ``zombie_trees``, which
``fleet/findings/rules.py`` reports); how long an orphan has held memory from its process life.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpuadmin.fairuse.models import Policy
from gpuadmin.fleet.findings.rules import describe
from gpuadmin.fleet.models import Gpu, Host, LatestSnapshot, ProcessLife
from gpuadmin.fleet.process_tree import ProcessRow, orphans, process_rows, zombie_trees
from gpuadmin.notify.directory import Directory
from gpuadmin.notify.models import Person
from gpuadmin.text import human_bytes

PersonOf = Callable[[ProcessRow], Person | None]
InScope = Callable[[ProcessRow], bool]


@dataclass(frozen=True)
class Candidate:
    """One thing a policy's condition holds for now; ``since``: since when, when the fleet knows."""

    key: str
    host: Host
    person: Person | None
    summary: str
    targets: list[list[int]]
    held_bytes: int
    since: datetime | None


def _one_process(host: Host, row: ProcessRow, person: PersonOf, *, summary: str, held_bytes: int,
                 since: datetime | None) -> Candidate:
    """A candidate about one process, which is its only target."""
    return Candidate(key=_key(host, row), host=host, person=person(row), summary=summary,
                     targets=[[row.pid, row.start_time_ticks]], held_bytes=held_bytes, since=since)


def hosts_in_view(policy: Policy, now: datetime) -> list[Host]:
    """The policy's hosts that are online: an offline host's newest snapshot is stale, so what it
    shows is neither acted on nor called resolved until the host is back."""
    hosts = Host.objects.fleet().online(now)
    if policy.scope == Policy.Scope.HOSTS:
        hosts = hosts.filter(pk__in=policy.hosts.values("pk"))
    return list(hosts)


def _key(host: Host, row: ProcessRow) -> str:
    return f"{host.name}:{row.pid}:{row.start_time_ticks}"


def find(policy: Policy, now: datetime) -> list[Candidate]:
    """Every candidate of ``policy`` in the hosts' newest snapshots, in scope."""
    hosts = hosts_in_view(policy, now)
    documents = LatestSnapshot.objects.documents_by_host_id({h.pk for h in hosts})
    people = set(policy.people.values_list("pk", flat=True)) if policy.scope == Policy.Scope.PEOPLE else None
    directories = Directory.for_hosts(hosts)
    idle = _idle_gpus(policy, now) if policy.condition == Policy.Condition.IDLE_HOLDER else {}
    found: list[Candidate] = []
    per_person: dict[int, list[tuple[Host, ProcessRow, Person]]] = defaultdict(list)
    for host in hosts:
        document = documents.get(host.pk)
        if document is None:
            continue
        rows = process_rows(document)
        directory = directories[host.pk]

        def person(row: ProcessRow, directory: Directory = directory) -> Person | None:
            return directory.person_for(uid=row.uid, user=row.user, owner=row.owner)

        def in_scope(row: ProcessRow) -> bool:
            who = person(row)
            return people is None or (who is not None and who.pk in people)

        if policy.condition == Policy.Condition.IDLE_HOLDER:
            found += _idle_holders(host, idle.get(host.pk, []), rows, person=person, in_scope=in_scope)
        elif policy.condition == Policy.Condition.ORPHAN_OR_ZOMBIE:
            found += _orphans_and_zombie_trees(host, rows, person=person, in_scope=in_scope)
        else:
            for row in rows.values():
                who = person(row)
                if who is not None and row.total_gpu_memory_bytes > 0 and in_scope(row):
                    per_person[who.pk].append((host, row, who))
    if policy.condition == Policy.Condition.TOO_MANY_GPUS:
        found += _too_many(policy, per_person)
    return found


def _idle_gpus(policy: Policy, now: datetime) -> dict[int, list[Gpu]]:
    """The fleet's GPUs idle for the policy's minutes, by host: one query, however many hosts."""
    idle: dict[int, list[Gpu]] = defaultdict(list)
    idle_long_enough = Gpu.objects.filter(present=True, idle_since__isnull=False,
                                          idle_since__lte=now - timedelta(minutes=policy.minutes))
    for gpu in idle_long_enough.order_by("host", "index"):
        idle[gpu.host_id].append(gpu)
    return idle


def _idle_holders(
    host: Host,
    idle_gpus: list[Gpu],
    rows: dict[int, ProcessRow],
    *,
    person: PersonOf,
    in_scope: InScope,
) -> list[Candidate]:
    found = []
    for gpu in idle_gpus:
        for row in rows.values():
            held = row.gpu_memory_bytes.get(gpu.uuid) or 0
            if held <= 0 or not in_scope(row):
                continue
            found.append(
                _one_process(host, row, person, held_bytes=held, since=gpu.idle_since,
                             summary=f"{describe(row)} holds {human_bytes(held)} on {host.name} "
                             f"GPU {gpu.index} at 0% utilisation")
            )
    return found


def _orphans_and_zombie_trees(
    host: Host, rows: dict[int, ProcessRow], *, person: PersonOf, in_scope: InScope
) -> list[Candidate]:
    found = []
    for row in orphans(rows):
        if row.total_gpu_memory_bytes <= 0 or not in_scope(row):
            continue
        life = ProcessLife.objects.identified(host, row.pid, row.start_time_ticks)
        since = (life.launcher_exited_before or life.first_seen_at) if life is not None else None
        found.append(
            _one_process(host, row, person, held_bytes=row.total_gpu_memory_bytes, since=since,
                         summary=f"orphan {describe(row)} holds {human_bytes(row.total_gpu_memory_bytes)} "
                         f"on {host.name}")
        )
    for tree in zombie_trees(rows):
        parent = tree.parent
        if parent is None or parent.total_gpu_memory_bytes <= 0 or not in_scope(parent):
            continue
        found.append(
            _one_process(host, parent, person, held_bytes=parent.total_gpu_memory_bytes, since=None,
                         summary=f"{describe(parent)} holds {human_bytes(parent.total_gpu_memory_bytes)} "
                         f"on {host.name} with {len(tree.zombies)} zombie(s) it does not reap")
        )
    return found


def _too_many(
    policy: Policy, per_person: dict[int, list[tuple[Host, ProcessRow, Person]]]
) -> list[Candidate]:
    found = []
    for held in per_person.values():
        gpus: dict[tuple[int, str], list[tuple[Host, ProcessRow]]] = defaultdict(list)
        for host, row, _who in held:
            for uuid, used in row.gpu_memory_bytes.items():
                if used:
                    gpus[(host.pk, uuid)].append((host, row))
        if len(gpus) <= policy.max_gpus:
            continue
        who = held[0][2]
        # The newest holdings are the excess: the GPUs taken last are the ones asked back.
        newest_first = sorted(
            gpus.values(), key=lambda holders: min(r.elapsed_seconds or 0 for _h, r in holders)
        )
        excess = newest_first[: len(gpus) - policy.max_gpus]
        host = excess[0][0][0]
        rows = {r.pid: r for holders in excess for h, r in holders if h.pk == host.pk}
        found.append(
            Candidate(
                key=f"person:{who.pk}",
                host=host,
                person=who,
                summary=f"{who.name} holds {len(gpus)} GPUs, over the {policy.max_gpus} allowed",
                targets=[[r.pid, r.start_time_ticks] for r in sorted(rows.values(), key=lambda r: r.pid)],
                held_bytes=sum(r.total_gpu_memory_bytes for r in rows.values()),
                since=None,
            )
        )
    return found
