"""What a policy's condition finds in the fleet's live state right now (never the usage ledger).

Idle holders come from the GPUs' ``idle_since`` (kept by ingest, the same rule as the "idle
holder" finding: visible processes hold memory at 0% utilisation); orphans and zombie trees from
the findings' own readings of a snapshot (``process_tree.orphans`` / ``zombie_trees``, which
``fleet/findings/rules.py`` reports); how long an orphan has held memory from its process life.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from gpuadmin.fairuse.models import Policy
from gpuadmin.fleet.findings.rules import describe
from gpuadmin.fleet.models import Gpu, Host, LatestSnapshot, ProcessLife
from gpuadmin.fleet.process_tree import ProcessRow, orphans, zombie_trees
from gpuadmin.notify.directory import Directory
from gpuadmin.notify.models import Person
from gpuadmin.text import human_bytes


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


@dataclass(frozen=True)
class _Who:
    """Who a host's processes belong to (its people directory) and whether the policy covers them
    (``people``: the policy's people by pk; None: everyone)."""

    directory: Directory
    people: set[int] | None

    def person(self, row: ProcessRow) -> Person | None:
        return self.directory.person_for(uid=row.uid, user=row.user, owner=row.owner)

    def covers(self, who: Person | None) -> bool:
        return self.people is None or (who is not None and who.pk in self.people)

    def covered(self, candidates: list[Candidate]) -> list[Candidate]:
        """Those whose person the policy covers."""
        return [candidate for candidate in candidates if self.covers(candidate.person)]


class Holding(NamedTuple):
    """What too many GPUs keeps of a process holding GPU memory until the whole fleet is read: its
    identity and memory, not the whole row."""

    pid: int
    start_time_ticks: int
    gpu_memory_bytes: dict[str, int | None]
    total_gpu_memory_bytes: int
    elapsed_seconds: float | None

    @classmethod
    def of(cls, row: ProcessRow) -> Holding:
        return cls(row.pid, row.start_time_ticks, row.gpu_memory_bytes, row.total_gpu_memory_bytes,
                   row.elapsed_seconds)


def _one_process(host: Host, row: ProcessRow, who: _Who, *, summary: str, held_bytes: int,
                 since: datetime | None) -> Candidate:
    """A candidate about one process, which is its only target, with whom it belongs to."""
    return Candidate(key=_key(host, row), host=host, person=who.person(row), summary=summary,
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


def find(policy: Policy, now: datetime, *, hosts: list[Host] | None = None) -> list[Candidate]:
    """Every candidate of ``policy`` in the hosts' newest snapshots, in scope (``hosts``: its
    ``hosts_in_view``, when the caller has them).

    Beat runs this every minute for each live policy, over up to every host of the fleet: only the
    hosts where the condition can hold are looked at (idle holders: those with a GPU idle long enough;
    ``_may_hold``), their processes read as rows straight from the stored texts, a batch of hosts at
    a time (``LatestSnapshot.objects.process_rows_of``), and an orphan's life is looked up with all the
    others' (``_orphaned_since``)."""
    hosts = hosts_in_view(policy, now) if hosts is None else hosts
    idle = _idle_gpus(policy, now) if policy.condition == Policy.Condition.IDLE_HOLDER else {}
    if policy.condition == Policy.Condition.IDLE_HOLDER:
        hosts = [host for host in hosts if host.pk in idle]  # no GPU idle long enough: nobody to find
    people = set(policy.people.values_list("pk", flat=True)) if policy.scope == Policy.Scope.PEOPLE else None
    directories = Directory.for_hosts(hosts)
    found: list[Candidate] = []
    per_person: dict[int, list[tuple[Host, Holding, Person]]] = defaultdict(list)
    orphans_and_trees: list[tuple[Host, dict[int, ProcessRow], _Who]] = []
    for host, rows in LatestSnapshot.objects.process_rows_of(hosts):
        if not _may_hold(policy, rows):
            continue
        who = _Who(directories[host.pk], people)
        if policy.condition == Policy.Condition.IDLE_HOLDER:
            found += _idle_holders(host, idle.get(host.pk, []), rows, who)
        elif policy.condition == Policy.Condition.ORPHAN_OR_ZOMBIE:
            orphans_and_trees.append((host, rows, who))
        else:
            for row in rows.values():
                person = who.person(row) if row.total_gpu_memory_bytes > 0 else None
                if person is not None and who.covers(person):
                    per_person[person.pk].append((host, Holding.of(row), person))
    if orphans_and_trees:
        since = _orphaned_since([(host, row) for host, rows, _ in orphans_and_trees
                                 for row in orphans(rows) if row.total_gpu_memory_bytes > 0])
        for host, rows, who in orphans_and_trees:
            found += _orphans_and_zombie_trees(host, rows, who, since=since)
    if policy.condition == Policy.Condition.TOO_MANY_GPUS:
        found += _too_many(policy, per_person)
    return found


def _may_hold(policy: Policy, rows: dict[int, ProcessRow]) -> bool:
    """Whether the condition can hold among these processes: an orphan or a zombie for the one; the
    others look at every host they are given (idle holders: only hosts with an idle GPU are)."""
    if policy.condition != Policy.Condition.ORPHAN_OR_ZOMBIE:
        return True
    return any(row.orphaned or row.is_zombie for row in rows.values())


def _idle_gpus(policy: Policy, now: datetime) -> dict[int, list[Gpu]]:
    """The fleet's GPUs idle for the policy's minutes, by host: one query, however many hosts."""
    idle: dict[int, list[Gpu]] = defaultdict(list)
    idle_long_enough = Gpu.objects.filter(present=True, idle_since__isnull=False,
                                          idle_since__lte=now - timedelta(minutes=policy.minutes))
    for gpu in idle_long_enough.order_by("host", "index"):
        idle[gpu.host_id].append(gpu)
    return idle


def _idle_holders(host: Host, idle_gpus: list[Gpu], rows: dict[int, ProcessRow],
                  who: _Who) -> list[Candidate]:
    found = []
    for gpu in idle_gpus:
        for row in rows.values():
            held = row.gpu_memory_bytes.get(gpu.uuid) or 0
            if held <= 0:
                continue
            found.append(
                _one_process(host, row, who, held_bytes=held, since=gpu.idle_since,
                             summary=f"{describe(row)} holds {human_bytes(held)} on {host.name} "
                             f"GPU {gpu.index} at 0% utilisation")
            )
    return who.covered(found)


def _orphaned_since(orphaned: list[tuple[Host, ProcessRow]]) -> dict[tuple[int, int, int], datetime]:
    """Since when each orphan has held on, by (host id, pid, start ticks), from its process life (as
    ``ProcessLife.objects.identified`` finds it: the newest of that identity) when history has one:
    since its launcher exited, else since it was first seen. A few queries for all of them."""
    wanted = {(host.pk, row.pid, row.start_time_ticks) for host, row in orphaned}
    host_ids = sorted({key[0] for key in wanted})
    newest: dict[tuple[int, int, int], tuple[datetime, datetime]] = {}
    for start in range(0, len(host_ids), _HOSTS_PER_QUERY):
        chunk = host_ids[start : start + _HOSTS_PER_QUERY]
        in_chunk = set(chunk)
        pids = {pid for host_id, pid, _ in wanted if host_id in in_chunk}
        lives = ProcessLife.objects.filter(host_id__in=chunk, pid__in=pids).values_list(
            "host_id", "pid", "start_time_ticks", "last_seen_at", "launcher_exited_before", "first_seen_at")
        for host_id, pid, ticks, last_seen_at, exited_before, first_seen_at in lives:
            key = (host_id, pid, ticks)
            if key in wanted and (key not in newest or last_seen_at > newest[key][0]):
                newest[key] = (last_seen_at, exited_before or first_seen_at)
    return {key: since for key, (_, since) in newest.items()}


_HOSTS_PER_QUERY = 500


def _orphans_and_zombie_trees(host: Host, rows: dict[int, ProcessRow], who: _Who, *,
                              since: dict[tuple[int, int, int], datetime]) -> list[Candidate]:
    found = []
    for row in orphans(rows):
        if row.total_gpu_memory_bytes <= 0:
            continue
        found.append(
            _one_process(host, row, who, held_bytes=row.total_gpu_memory_bytes,
                         since=since.get((host.pk, row.pid, row.start_time_ticks)),
                         summary=f"orphan {describe(row)} holds {human_bytes(row.total_gpu_memory_bytes)} "
                         f"on {host.name}")
        )
    for tree in zombie_trees(rows):
        parent = tree.parent
        if parent is None or parent.total_gpu_memory_bytes <= 0:
            continue
        found.append(
            _one_process(host, parent, who, held_bytes=parent.total_gpu_memory_bytes, since=None,
                         summary=f"{describe(parent)} holds {human_bytes(parent.total_gpu_memory_bytes)} "
                         f"on {host.name} with {len(tree.zombies)} zombie(s) it does not reap")
        )
    return who.covered(found)


def _too_many(
    policy: Policy, per_person: dict[int, list[tuple[Host, Holding, Person]]]
) -> list[Candidate]:
    found = []
    for held in per_person.values():
        gpus: dict[tuple[int, str], list[tuple[Host, Holding]]] = defaultdict(list)
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
