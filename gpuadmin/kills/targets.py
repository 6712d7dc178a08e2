"""Which processes a kill request may name, resolved from the host's latest
snapshot, and the rules that refuse the rest.

Pure functions over a snapshot document: no database, no signals. Central
applies these rules when a request is filed; the agent applies its own
(PID 1, kernel threads, itself and its ancestors) again right before each
signal, because a snapshot may be seconds old.
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings

from gpuadmin.fleet.process_tree import (
    ProcessRow,
    Workload,
    parse_workload_key,
    process_rows,
    workload_members,
)
from gpuadmin.fleet.taken_at import document_taken_at


@dataclass(frozen=True)
class Excluded:
    """A process the rules keep out of a request, and why (shown to the requester)."""

    pid: int
    name: str
    user: str | None
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "name": self.name, "user": self.user, "why": self.why}


@dataclass(frozen=True)
class ParentOffer:
    """For a zombie target: the parent that could reap it, offered instead."""

    pid: int
    start_time_ticks: int | None
    name: str
    user: str | None
    command_line: str
    state: str
    zombie_count: int
    # Set when the parent itself may not be targeted (PID 1, protected...) or is unknown.
    refused_because: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "start_time_ticks": self.start_time_ticks,
            "name": self.name,
            "user": self.user,
            "command_line": self.command_line,
            "state": self.state,
            "zombie_count": self.zombie_count,
            "refused_because": self.refused_because,
        }


@dataclass
class Preview:
    """What a request would do: shown before filing, stored when filed."""

    host_name: str
    snapshot_taken_at: datetime | None
    boot_id: str
    seed: ProcessRow | None = None
    # The seed first, then its descendants (when asked for), parents before children.
    targets: list[ProcessRow] = field(default_factory=list)
    excluded: list[Excluded] = field(default_factory=list)
    # Why the request cannot be filed at all (the seed itself is refused).
    refusal: str | None = None
    parent_offer: ParentOffer | None = None
    warnings: list[str] = field(default_factory=list)
    # Targets there because they descend from the seed (not those named beside it).
    descendant_pids: set[int] = field(default_factory=set)
    # The snapshot document it was resolved from (the digests come from there).
    document: dict[str, Any] | None = field(default=None, repr=False)
    # Set for "every process of job J / container C / pod P on this host" (resolve_workload).
    workload: Workload | None = None

    @property
    def ok(self) -> bool:
        return self.refusal is None and bool(self.targets)


@dataclass(frozen=True)
class Protection:
    """The lab's protected list (settings) plus what the snapshot says about the agent."""

    users: frozenset[str]
    uids: frozenset[int]
    patterns: tuple[str, ...]
    agent_pid: int | None
    agent_ancestors: frozenset[int]

    @classmethod
    def for_document(cls, document: dict[str, Any], rows: dict[int, ProcessRow]) -> Protection:
        agent_pid = document.get("host", {}).get("agent_pid")
        return cls(
            users=frozenset(settings.GPUADMIN_PROTECTED_USERS),
            uids=frozenset(settings.GPUADMIN_PROTECTED_UIDS),
            patterns=tuple(settings.GPUADMIN_PROTECTED_COMMAND_PATTERNS),
            agent_pid=agent_pid,
            agent_ancestors=frozenset(ancestors(agent_pid, rows)) if agent_pid else frozenset(),
        )


def ancestors(pid: int, rows: dict[int, ProcessRow]) -> list[int]:
    """The parent chain of ``pid`` as far as the snapshot shows it (PID 1 included when listed)."""
    chain: list[int] = []
    seen = {pid}
    row = rows.get(pid)
    while row is not None and row.ppid and row.ppid not in seen:
        chain.append(row.ppid)
        seen.add(row.ppid)
        row = rows.get(row.ppid)
    return chain


def descendants(pid: int, rows: dict[int, ProcessRow]) -> list[ProcessRow]:
    """Every descendant of ``pid`` in the snapshot, breadth first (parents before children)."""
    children: dict[int, list[ProcessRow]] = defaultdict(list)
    for row in rows.values():
        children[row.ppid].append(row)
    found: list[ProcessRow] = []
    seen = {pid}
    queue = deque([pid])
    while queue:
        for child in sorted(children.get(queue.popleft(), ()), key=lambda r: r.pid):
            if child.pid not in seen:
                seen.add(child.pid)
                found.append(child)
                queue.append(child.pid)
    return found


def refusal_reason(row: ProcessRow, protection: Protection) -> str | None:
    """Why this process may not be signalled (the first rule that applies), or None.

    Zombies are handled by the caller: they are refused with an offer of their parent.
    """
    return next(_refusals(row, protection), None)


def _refusals(row: ProcessRow, protection: Protection) -> Iterator[str]:
    if row.pid == 1:
        yield "PID 1 is the init process (in a container, that is the whole container)"
    if row.kernel_thread:
        yield "it is a kernel thread"
    if protection.agent_pid is not None and row.pid == protection.agent_pid:
        yield "it is the gpuadmin agent itself"
    if row.pid in protection.agent_ancestors:
        yield "it is an ancestor of the gpuadmin agent (signalling it would stop the agent)"
    if row.user is not None and row.user in protection.users:
        yield f"user {row.user!r} is protected (GPUADMIN_PROTECTED_USERS)"
    if row.uid is not None and row.uid in protection.uids:
        yield f"uid {row.uid} is protected (GPUADMIN_PROTECTED_UIDS)"
    command_line = " ".join(row.cmdline) if row.cmdline else row.name
    for pattern in protection.patterns:
        try:
            in_command_line = re.search(pattern, command_line)
            in_executable = row.exe is not None and re.search(pattern, row.exe)
        except re.error as exc:
            # Fail closed: a broken protection rule must not let everything through.
            yield f"protected command pattern {pattern!r} is not a valid regular expression ({exc})"
            continue
        if in_command_line:
            yield f"its command line matches the protected pattern {pattern!r}"
        if in_executable:
            yield f"its executable {row.exe} matches the protected pattern {pattern!r}"
    if row.uid is None:
        yield "its owner (uid) is unknown, so the agent could not verify it"


def _zombie_why(row: ProcessRow) -> str:
    return (
        f"it is a zombie: it has already exited and holds no memory; only its parent "
        f"(PID {row.ppid}) can reap it"
    )


def parent_offer(zombie: ProcessRow, rows: dict[int, ProcessRow], protection: Protection) -> ParentOffer:
    zombie_count = sum(1 for r in rows.values() if r.is_zombie and r.ppid == zombie.ppid)
    parent = rows.get(zombie.ppid)
    if parent is None:
        return ParentOffer(
            pid=zombie.ppid, start_time_ticks=None, name="", user=None, command_line="", state="",
            zombie_count=zombie_count,
            refused_because=f"its parent, PID {zombie.ppid}, is not in the latest snapshot",
        )
    refused = refusal_reason(parent, protection)
    if parent.pid == 1:
        refused = (
            "its parent is PID 1 (init), which reaps zombies itself; if they stay, init is stuck "
            "(in a container: restart the container)"
        )
    elif parent.is_zombie:
        refused = "its parent is itself a zombie; look at the grandparent"
    return ParentOffer(
        pid=parent.pid, start_time_ticks=parent.start_time_ticks, name=parent.name, user=parent.user,
        command_line=parent.command_line, state=parent.state, zombie_count=zombie_count,
        refused_because=refused,
    )


def _warnings_for(row: ProcessRow) -> list[str]:
    if row.is_uninterruptible:
        return [
            f"PID {row.pid} ({row.name}) is in uninterruptible sleep (state D): signals wait until its "
            "kernel call returns, and it may end as unkillable"
        ]
    return []


def resolve(document: dict[str, Any], pid: int, start_time_ticks: int, *,
            include_descendants: bool = False, also: Iterable[tuple[int, int]] = ()) -> Preview:
    """The targets a request for (pid, start) would have, from one snapshot document.

    ``also`` names more processes, each by (pid, start), to signal in the same
    request (the orphans of one dead launcher); each passes the same rules as
    the first, and one that does not is left out with the reason.
    """
    rows = process_rows(document)
    taken_at = document_taken_at(document)
    preview = Preview(
        host_name=document.get("host", {}).get("name", ""),
        snapshot_taken_at=taken_at,
        boot_id=document.get("host", {}).get("boot_id", ""),
        document=document,
    )
    when = f"taken at {taken_at:%Y-%m-%d %H:%M:%S} UTC" if taken_at else "of this host"
    seed = rows.get(pid)
    if seed is None:
        preview.refusal = f"PID {pid} is not in the latest snapshot ({when})"
        return preview
    if seed.start_time_ticks != start_time_ticks:
        preview.refusal = (
            f"PID {pid} in the latest snapshot ({when}) started at tick {seed.start_time_ticks}, "
            f"not {start_time_ticks}: it is a different process (the PID was reused)"
        )
        return preview
    preview.seed = seed
    protection = Protection.for_document(document, rows)
    if seed.is_zombie:
        preview.refusal = _zombie_why(seed)
        preview.parent_offer = parent_offer(seed, rows, protection)
        return preview
    why = refusal_reason(seed, protection)
    if why:
        preview.refusal = why
        return preview
    preview.targets.append(seed)
    preview.warnings.extend(_warnings_for(seed))
    if include_descendants:
        for row in descendants(seed.pid, rows):
            if row.is_zombie:
                why = "a zombie: it has already exited; it is reaped when its parent exits"
            else:
                why = refusal_reason(row, protection)
            if why:
                preview.excluded.append(Excluded(pid=row.pid, name=row.name, user=row.user, why=why))
                continue
            preview.targets.append(row)
            preview.descendant_pids.add(row.pid)
            preview.warnings.extend(_warnings_for(row))
    _add_also(preview, rows, protection, also)
    return preview


def _add_also(preview: Preview, rows: dict[int, ProcessRow], protection: Protection,
              also: Iterable[tuple[int, int]]) -> None:
    """More targets named by (pid, start), each under the same rules as the first."""
    for pid, start in also:
        if any(t.pid == pid for t in preview.targets):
            continue
        row = rows.get(pid)
        if row is None or row.start_time_ticks != start:
            preview.excluded.append(Excluded(
                pid=pid, name=row.name if row else "", user=row.user if row else None,
                why="not in the latest snapshot (it exited, or the PID was reused)",
            ))
            continue
        why = _zombie_why(row) if row.is_zombie else refusal_reason(row, protection)
        if why:
            preview.excluded.append(Excluded(pid=row.pid, name=row.name, user=row.user, why=why))
            continue
        preview.targets.append(row)
        preview.warnings.extend(_warnings_for(row))


def resolve_workload(document: dict[str, Any], workload_key: str) -> Preview:
    """Every process of one Slurm job, container or pod in the snapshot, each an exact target.

    The same rules as for one process apply to each member: a refused member (PID 1 of the
    container, a protected user, the agent) or a zombie is listed as excluded, and the rest are
    targets. Children outside the workload are not added: the cgroup, not the process tree,
    says what belongs to it.
    """
    rows = process_rows(document)
    taken_at = document_taken_at(document)
    preview = Preview(
        host_name=document.get("host", {}).get("name", ""),
        snapshot_taken_at=taken_at,
        boot_id=document.get("host", {}).get("boot_id", ""),
        document=document,
    )
    when = f"taken at {taken_at:%Y-%m-%d %H:%M:%S} UTC" if taken_at else "of this host"
    if parse_workload_key(workload_key) is None:
        preview.refusal = f"{workload_key!r} names no job, container or pod"
        return preview
    members = workload_members(rows, workload_key)
    if not members:
        preview.refusal = f"no process of {workload_key} is in the latest snapshot ({when})"
        return preview
    preview.workload = members[0].workload
    protection = Protection.for_document(document, rows)
    for row in members:
        why = _zombie_why(row) if row.is_zombie else refusal_reason(row, protection)
        if why:
            preview.excluded.append(Excluded(pid=row.pid, name=row.name, user=row.user, why=why))
            continue
        preview.targets.append(row)
        preview.warnings.extend(_warnings_for(row))
    if not preview.targets:
        assert preview.workload is not None
        preview.refusal = f"every process of {preview.workload.label} is refused (see the excluded list)"
    else:
        preview.seed = preview.targets[0]
    return preview
