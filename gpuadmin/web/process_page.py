"""What the process page shows: one process, alive or gone, from its recorded life and the latest snapshot.

A process the panel recorded (``ProcessLife``: it held GPU memory or a device
file, was a zombie, in D state or an orphan) has a page for as long as its
history is kept, also after it is gone. A process that is merely in the latest
snapshot (the parent of zombies, a launcher) has one while it is there, without
history. Anything else is a 404.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q

from gpuadmin.fleet.findings.rules import mentions_process
from gpuadmin.fleet.history import series
from gpuadmin.fleet.models import Finding, Host, LatestSnapshot, ProcessLife
from gpuadmin.fleet.process_tree import ProcessRow, process_rows

# Parent chains stop here whatever the snapshot says (a cycle in junk data must not hang the page).
PARENT_CHAIN_MAX = 64
CHILDREN_SHOWN_MAX = 200
FINDINGS_SHOWN_MAX = 100


@dataclass(frozen=True)
class Relative:
    """A parent or child, as a link: pid and start ticks name its page (None: not known, no link)."""

    pid: int
    start_time_ticks: int | None
    name: str
    user: str
    state: str = ""  # its state letter when known ("Z": a defunct child its parent has not reaped)

    @property
    def defunct(self) -> bool:
        return self.state == "Z"


@dataclass
class ProcessPage:
    host: Host
    pid: int
    start_time_ticks: int
    life: ProcessLife | None
    row: ProcessRow | None  # in the latest snapshot: alive now
    parents: list[Relative] = field(default_factory=list)  # nearest first
    children: list[Relative] = field(default_factory=list)
    state_changes: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    kill_requests: list[Any] = field(default_factory=list)

    @property
    def csv_name(self) -> str:
        return f"{self.host.name}-process-{self.pid}-{self.start_time_ticks}.csv"

    @property
    def alive(self) -> bool:
        return self.row is not None

    @property
    def user(self) -> str:
        if self.row is not None:
            return self.row.user or (f"uid {self.row.uid}" if self.row.uid is not None else "")
        if self.life is not None:
            return self.life.user or (f"uid {self.life.uid}" if self.life.uid is not None else "")
        return ""

    @property
    def name(self) -> str:
        return self.row.name if self.row is not None else (self.life.name if self.life else "")

    @property
    def command_line(self) -> str:
        if self.row is not None:
            return self.row.command_line
        assert self.life is not None
        return " ".join(self.life.cmdline) if self.life.cmdline else f"[{self.life.name}]"

    @property
    def state(self) -> str:
        return self.row.state if self.row is not None else (self.life.last_state if self.life else "")

    @property
    def orphaned(self) -> bool:
        """Re-parented after the process that started it went away (now, or as recorded)."""
        if self.row is not None:
            return self.row.orphaned
        return bool(self.life and self.life.was_orphaned)

    @property
    def zombie(self) -> bool:
        return self.state == "Z"

    @property
    def defunct_children(self) -> int:
        return sum(1 for child in self.children if child.defunct)

    @property
    def may_be_asked_to_reap(self) -> bool:
        """Alive with defunct children, and not PID 1 (init reaps on its own; it is never signalled)."""
        return self.alive and self.pid != 1 and self.defunct_children > 0

    @property
    def device_files(self) -> tuple[str, ...]:
        return self.row.device_files if self.row is not None else ()

    @property
    def gpu_memory(self) -> dict[str, int | None]:
        return self.row.gpu_memory_bytes if self.row is not None else {}


def process_page(host: Host, pid: int, start_time_ticks: int) -> ProcessPage | None:
    """Everything the page shows, or None when the panel knows no such process."""
    life = ProcessLife.objects.identified(host, pid, start_time_ticks)
    document = LatestSnapshot.objects.document_for(host)
    rows = process_rows(document) if document else {}
    row = rows.get(pid)
    if row is not None and row.start_time_ticks != start_time_ticks:
        row = None
    if life is not None and row is not None and document and life.boot_id != document["host"]["boot_id"]:
        row = None  # same pid and ticks, but a new boot: another process
    if life is None and row is None:
        return None
    page = ProcessPage(host=host, pid=pid, start_time_ticks=start_time_ticks, life=life, row=row)
    if row is not None:
        page.parents = _parents_from_snapshot(row, rows)
        page.children = [_relative(r) for r in sorted(rows.values(), key=lambda r: r.pid) if r.ppid == pid][
            :CHILDREN_SHOWN_MAX
        ]
    elif life is not None:
        page.parents, page.children = _relatives_from_history(life)
    if life is not None:
        page.state_changes = series.state_changes(series.process_points(life))
        page.kill_requests = list(
            host.kill_requests.filter(
                targets__pid=pid, targets__start_time_ticks=start_time_ticks, targets__boot_id=life.boot_id
            )
            .distinct()
            .order_by("requested_at")
        )
    elif document:
        page.kill_requests = list(
            host.kill_requests.filter(
                targets__pid=pid,
                targets__start_time_ticks=start_time_ticks,
                targets__boot_id=document["host"]["boot_id"],
            )
            .distinct()
            .order_by("requested_at")
        )
    page.findings = _findings_of(host, pid, start_time_ticks, since=life.first_seen_at if life else None)
    return page


def _relative(row: ProcessRow) -> Relative:
    return Relative(pid=row.pid, start_time_ticks=row.start_time_ticks, name=row.name, user=row.user or "",
                    state=row.state)


def _parents_from_snapshot(row: ProcessRow, rows: dict[int, ProcessRow]) -> list[Relative]:
    chain: list[Relative] = []
    seen = {row.pid}
    ppid = row.ppid
    while ppid and ppid not in seen and len(chain) < PARENT_CHAIN_MAX:
        seen.add(ppid)
        parent = rows.get(ppid)
        if parent is None:
            chain.append(Relative(pid=ppid, start_time_ticks=None, name="", user=""))
            break
        chain.append(_relative(parent))
        ppid = parent.ppid
    return chain


def _relatives_from_history(life: ProcessLife) -> tuple[list[Relative], list[Relative]]:
    """A gone process: its parent and children as far as recorded lives of the same boot tell."""
    during = Q(first_seen_at__lte=life.last_seen_at) & (
        Q(gone_at__isnull=True) | Q(gone_at__gte=life.first_seen_at)
    )
    same_boot = ProcessLife.objects.filter(host_id=life.host_id, boot_id=life.boot_id)
    parent = same_boot.filter(during, pid=life.ppid).order_by("-last_seen_at").first()
    parents = (
        [
            Relative(
                pid=parent.pid, start_time_ticks=parent.start_time_ticks, name=parent.name, user=parent.user
            )
            if parent is not None
            else Relative(pid=life.ppid, start_time_ticks=None, name="", user="")
        ]
        if life.ppid
        else []
    )
    children = [
        Relative(pid=c.pid, start_time_ticks=c.start_time_ticks, name=c.name, user=c.user, state=c.last_state)
        for c in same_boot.filter(during, ppid=life.pid).order_by("pid")[:CHILDREN_SHOWN_MAX]
    ]
    return parents, children


def _findings_of(host: Host, pid: int, start_time_ticks: int, *, since: datetime | None) -> list[Finding]:
    findings = host.findings.all()
    if since is not None:
        findings = findings.filter(Q(resolved_at__isnull=True) | Q(resolved_at__gte=since))
    return [
        f
        for f in findings.order_by("-first_seen_at")[:1000]
        if mentions_process(f.details, pid, start_time_ticks)
    ][:FINDINGS_SHOWN_MAX]
