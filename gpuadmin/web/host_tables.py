"""The tables of the host page, built from the latest snapshot document.

Pure functions over the document and the host's GPU rows: the view only
loads, calls ``host_tables`` and renders. The process table's filter and
sort come from query parameters (``ProcessQuery``) so a filtered view is a
link that can be shared, and the HTMX refresh asks for the same thing again.
The table is paged (``PROCESS_PAGE_ROWS``, Django's ``Paginator``) after
filtering and sorting: a host with thousands of holders would otherwise
re-render and resend all of them on every poll. With ``group=workload`` the
processes of one Slurm job, container or pod collapse into one row that
carries its members and their summed memory (``ProcessTableRow.members``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.core.paginator import Page, Paginator

from gpuadmin.fleet.findings.memory_explained import MemoryExplained, memory_explained
from gpuadmin.fleet.models import Gpu, ProcessLife
from gpuadmin.fleet.process_tree import (
    ProcessRow,
    Workload,
    ZombieTree,
    gpu_holders,
    process_rows,
    zombie_trees,
)
from gpuadmin.untrusted_text import visible_text
from gpuadmin.web.gpu_cards import HealthLine, health_lines

# Sort keys and whether their natural order is descending (biggest / oldest first).
SORT_DESCENDING_BY_DEFAULT = {"memory": True, "pid": False, "user": False, "age": True}
DEFAULT_SORT = "memory"
TEXT_FILTER_MAX_CHARS = 200
# A workload key is "<kind>:<id>"; ids are at most a few dozen characters (a 64-hex container id).
OWNER_FILTER_MAX_CHARS = 100
GROUP_BY_WORKLOAD = "workload"
# The "show" filter: orphans (re-parented after their launcher went), or zombies and their parents.
SHOW_ORPHANS = "orphans"
SHOW_ZOMBIES = "zombies"
SHOW_CHOICES = (SHOW_ORPHANS, SHOW_ZOMBIES)
PROCESS_PAGE_ROWS = 100
# Longer digit strings are out of range anyway, and int() of a huge one is slow or refused.
PAGE_PARAM_MAX_DIGITS = 9


@dataclass(frozen=True)
class GpuMemory:
    label: str  # "GPU 0", or the uuid when the GPU is not in the snapshot's list
    uuid: str
    memory_bytes: int | None


@dataclass(frozen=True)
class ProcessTableRow:
    """One process, or (``members`` not empty) a workload's processes collapsed into one row.

    A collapsed row shows its biggest member as ``process`` and the members' memory summed per GPU.
    """

    process: ProcessRow
    parent: ProcessRow | None
    gpu_memory: tuple[GpuMemory, ...]
    person: str = ""  # who the user is (gpuadmin.notify's directory), "" when nobody is mapped
    members: tuple[ProcessTableRow, ...] = ()
    expand_link: str = ""  # for a collapsed row: the query string listing its members one by one
    open_request_id: int | None = None  # an open kill request already targeting this process
    zombie_children: int = 0  # defunct children only this process can reap

    @property
    def workload(self) -> Workload | None:
        return self.process.workload

    @property
    def total_gpu_memory_bytes(self) -> int:
        return sum(m.memory_bytes for m in self.gpu_memory if m.memory_bytes)

    @property
    def is_group(self) -> bool:
        return bool(self.members)

    @property
    def member_pids(self) -> list[int]:
        return [m.process.pid for m in self.members]

    @property
    def member_states(self) -> str:
        """The members' distinct states, each once ("S", "R S"): never one letter per member."""
        return " ".join(sorted({m.process.state for m in self.members}))

    @property
    def member_users(self) -> list[str]:
        """The members' users as shown (a container may run processes of several)."""
        users = {visible_text(m.process.user) for m in self.members if m.process.user}
        return sorted(users, key=str.casefold)


@dataclass(frozen=True)
class ProcessQuery:
    """Filter, sort and page of the holders table. ``sort`` is a key, ``-key`` reverses its natural order.

    ``page`` is the page asked for (1-based); one past the end is clamped to the last page when the
    table is built, since the table may shrink between two polls.
    """

    user: str = ""  # as shown (untrusted_text.visible_text), so no raw control character reaches a page
    gpu: str = ""  # a GPU index, as text ("0"), or "" for all
    text: str = ""
    owner: str = ""  # a workload key (process_tree.Workload.key), or "" for all
    group: str = ""  # GROUP_BY_WORKLOAD collapses each workload into one row
    show: str = ""  # one of SHOW_CHOICES, or "" for every holder
    sort: str = DEFAULT_SORT
    page: int = 1

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> ProcessQuery:
        sort = params.get("sort", "") or DEFAULT_SORT
        if sort.removeprefix("-") not in SORT_DESCENDING_BY_DEFAULT:
            sort = DEFAULT_SORT
        gpu = params.get("gpu", "").strip()
        owner = params.get("owner", "").strip()
        return cls(
            user=params.get("user", "").strip(),
            gpu=gpu if gpu.isdigit() else "",
            text=params.get("q", "").strip()[:TEXT_FILTER_MAX_CHARS],
            # Compared with keys the probe's owners make; anything longer or odd matches nothing anyway.
            owner=owner if len(owner) <= OWNER_FILTER_MAX_CHARS and owner.isprintable() else "",
            group=GROUP_BY_WORKLOAD if params.get("group") == GROUP_BY_WORKLOAD else "",
            show=params.get("show", "") if params.get("show", "") in SHOW_CHOICES else "",
            sort=sort,
            page=page_param(params.get("page", "")),
        )

    @property
    def sort_key(self) -> str:
        return self.sort.removeprefix("-")

    @property
    def descending(self) -> bool:
        natural = SORT_DESCENDING_BY_DEFAULT[self.sort_key]
        return not natural if self.sort.startswith("-") else natural

    @property
    def is_filtered(self) -> bool:
        return bool(self.user or self.gpu or self.text or self.owner or self.show)

    def params(self) -> dict[str, str]:
        values = {
            "user": self.user, "gpu": self.gpu, "q": self.text, "owner": self.owner, "group": self.group,
            "show": self.show,
        }
        if self.sort != DEFAULT_SORT:
            values["sort"] = self.sort
        if self.page != 1:
            values["page"] = str(self.page)
        return {k: v for k, v in values.items() if v}

    def query_string(self) -> str:
        return urlencode(self.params())

    def sorted_by(self, key: str) -> str:
        """Query string that sorts by ``key``: its natural order first, reversed when clicked again.

        A new order starts again on the first page.
        """
        sort = f"-{key}" if self.sort == key else key
        return urlencode(replace(self, sort=sort, page=1).params())

    def on_page(self, number: int) -> str:
        """Query string of the same filter and sort on page ``number``."""
        return urlencode(replace(self, page=number).params())


def page_param(raw: str) -> int:
    """A ``?page=`` value as a page number (1 when not a number; huge ones mean the last page)."""
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()):
        return 1
    if len(raw) > PAGE_PARAM_MAX_DIGITS:
        return 10**PAGE_PARAM_MAX_DIGITS  # past any real table: the last page
    return max(1, int(raw))


def _page(rows: list[ProcessTableRow], query: ProcessQuery) -> Page:
    """The asked page of the filtered, sorted rows; past the end, the last page (the table may have
    shrunk since the link or the poll was made)."""
    return Paginator(rows, PROCESS_PAGE_ROWS).get_page(query.page)


@dataclass(frozen=True)
class MigInstanceRow:
    """One MIG device of a GPU card, as the snapshot reports it, with the processes on it."""

    uuid: str
    name: str
    gpu_instance_id: int
    compute_instance_id: int
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    process_count: int  # visible and unmatched alike


@dataclass(frozen=True)
class HostTables:
    processes: list[ProcessTableRow]  # the rows of the asked page, after filter and sort
    page: Page  # Django's page of the filtered rows: number, start_index, end_index, paginator.count
    previous_page_link: str | None  # "?query" of the neighbouring page, None at either end
    next_page_link: str | None
    holder_count: int  # before filtering
    users: list[str]  # every user holding a GPU (as shown), for the filter's choices
    zombie_trees: list[ZombieTree]
    zombie_count: int
    orphans: list[ProcessTableRow]
    has_snapshot: bool
    mig_instances: dict[str, list[MigInstanceRow]] = field(default_factory=dict)  # GPU uuid -> MIG devices
    workloads: list[Workload] = field(default_factory=list)  # every job/container/pod holding a GPU
    # Rows that mattered but the agent left out to fit the size limit (gpuadmin/probe/budget.py).
    left_out_count: int = 0
    gpu_health: dict[str, list[HealthLine]] = field(default_factory=dict)  # GPU uuid -> its card's lines
    memory_explained: dict[str, MemoryExplained] = field(default_factory=dict)  # GPU uuid -> its memory


@dataclass(frozen=True)
class ExitedLauncher:
    """A launcher that went away leaving processes behind (``ProcessLife.launcher_*``): who it was
    as last seen, between which two snapshots it exited, and the pids of what it left."""

    pid: int
    name: str  # its command line as shown; "" when no snapshot had it
    user: str
    exited_after: datetime
    exited_before: datetime
    orphan_pids: tuple[int, ...]


def exited_launchers(lives: Iterable[ProcessLife]) -> list[ExitedLauncher]:
    """One line per launcher the lives (``ProcessLife.objects.left_by_launcher``) outlived, the most
    recent exit first."""
    by_launcher: dict[tuple[int, str, str, datetime, datetime], list[int]] = {}
    for life in lives:
        pid, after, before = life.launcher_pid, life.launcher_exited_after, life.launcher_exited_before
        if pid is None or after is None or before is None:
            continue
        key = (pid, life.launcher_name, life.launcher_user, after, before)
        by_launcher.setdefault(key, []).append(life.pid)
    launchers = [
        ExitedLauncher(pid, name, user, after, before, orphan_pids=tuple(sorted(pids)))
        for (pid, name, user, after, before), pids in by_launcher.items()
    ]
    return sorted(launchers, key=lambda launcher: (launcher.exited_before, launcher.pid), reverse=True)


def mig_instance_rows(document: dict[str, Any]) -> dict[str, list[MigInstanceRow]]:
    """The MIG devices of each GPU in MIG mode (snapshots before MIG support have none)."""
    counts: Counter[tuple[str, int, int]] = Counter()
    placed = [i for p in document["processes"] for i in p.get("mig_instances", ())]
    for entry in [*placed, *document["unmatched_gpu_processes"]]:
        if "gpu_instance_id" in entry:
            counts[(entry["gpu_uuid"], entry["gpu_instance_id"], entry["compute_instance_id"])] += 1
    return {
        gpu["uuid"]: [
            MigInstanceRow(
                uuid=m["uuid"], name=m["name"], gpu_instance_id=m["gpu_instance_id"],
                compute_instance_id=m["compute_instance_id"], memory_used_bytes=m["memory_used_bytes"],
                memory_total_bytes=m["memory_total_bytes"],
                process_count=counts[(gpu["uuid"], m["gpu_instance_id"], m["compute_instance_id"])],
            )
            for m in gpu["mig_instances"]
        ]
        for gpu in document["gpus"] if "mig_instances" in gpu
    }


def _gpu_labels(gpus: Iterable[Gpu]) -> dict[str, str]:
    return {g.uuid: f"GPU {g.index}" for g in gpus}


# Who a process's user is, for the "person" beside the user; "" when nobody is mapped.
PersonOf = Callable[[ProcessRow], str]


def _nobody(row: ProcessRow) -> str:
    return ""


def _gpu_memory(per_gpu: Mapping[str, int | None], labels: Mapping[str, str]) -> tuple[GpuMemory, ...]:
    return tuple(
        GpuMemory(label=labels.get(uuid, uuid), uuid=uuid, memory_bytes=used)
        for uuid, used in sorted(per_gpu.items(), key=lambda item: labels.get(item[0], item[0]))
    )


def _table_row(row: ProcessRow, rows: Mapping[int, ProcessRow], labels: Mapping[str, str],
               person_of: PersonOf = _nobody, *, open_request_id: int | None = None,
               zombie_children: int = 0) -> ProcessTableRow:
    return ProcessTableRow(
        process=row, parent=rows.get(row.ppid), gpu_memory=_gpu_memory(row.gpu_memory_bytes, labels),
        person=person_of(row), open_request_id=open_request_id, zombie_children=zombie_children,
    )


def group_by_workload(rows: list[ProcessTableRow], labels: Mapping[str, str],
                      query: ProcessQuery | None = None) -> list[ProcessTableRow]:
    """Each workload's rows as one row with their memory summed per GPU; rows without one stay alone.

    A workload with a single process stays a plain row: there is nothing to collapse.
    """
    by_key: dict[str, list[ProcessTableRow]] = {}
    for row in rows:
        workload = row.workload
        by_key.setdefault(workload.key if workload else f"pid:{row.process.pid}", []).append(row)
    grouped = []
    for members in by_key.values():
        workload = members[0].workload
        if len(members) == 1 or workload is None:
            grouped.append(members[0])
            continue
        per_gpu: Counter[str] = Counter()
        for member in members:
            for memory in member.gpu_memory:
                per_gpu[memory.uuid] += memory.memory_bytes or 0
        biggest = max(members, key=lambda m: (m.total_gpu_memory_bytes, -m.process.pid))
        grouped.append(replace(
            biggest, gpu_memory=_gpu_memory(per_gpu, labels),
            members=tuple(sorted(members, key=lambda m: m.process.pid)),
            expand_link=urlencode(replace(query or ProcessQuery(), owner=workload.key,
                                          group="", page=1).params()),
        ))
    return grouped


def _shown(row: ProcessTableRow, show: str) -> bool:
    if show == SHOW_ORPHANS:
        return row.process.orphaned
    return row.process.is_zombie or bool(row.zombie_children)  # SHOW_ZOMBIES


def _matches(row: ProcessTableRow, query: ProcessQuery, gpu_uuid: str | None) -> bool:
    process = row.process
    if query.user and visible_text(process.user) != query.user:
        return False
    if query.gpu and (gpu_uuid is None or gpu_uuid not in process.gpu_memory_bytes):
        return False
    if query.owner and (process.workload is None or process.workload.key != query.owner):
        return False
    if query.show and not _shown(row, query.show):
        return False
    if query.text:
        needle = query.text.casefold()
        # Searched as shown: a command line with an ESC in it is found by typing "\x1b".
        haystack = [
            process.command_line, process.name, process.user, str(process.pid),
            process.container_id, process.owner_label, row.person, *process.device_files,
        ]
        if not any(needle in visible_text(part).casefold() for part in haystack):
            return False
    return True


def _sort_value(row: ProcessTableRow, key: str) -> tuple[Any, ...]:
    process = row.process
    if key == "memory":
        return (row.total_gpu_memory_bytes,)
    if key == "user":
        return ((process.user or "").casefold(),)
    if key == "age":
        # Unknown ages sort as youngest.
        return (process.elapsed_seconds if process.elapsed_seconds is not None else -1.0,)
    return (process.pid,)


def filter_and_sort(
    rows: list[ProcessTableRow], query: ProcessQuery, gpus: Iterable[Gpu]
) -> list[ProcessTableRow]:
    gpus = list(gpus)
    gpu_uuid = next((g.uuid for g in gpus if str(g.index) == query.gpu), None) if query.gpu else None
    kept = [r for r in rows if _matches(r, query, gpu_uuid)]
    if query.group == GROUP_BY_WORKLOAD:
        # Filter first, then collapse: a group's total is the memory of the members shown.
        kept = group_by_workload(kept, _gpu_labels(gpus), query)
    # Stable sorts: pid first as the tie-breaker, then the chosen key.
    kept.sort(key=lambda r: r.process.pid)
    kept.sort(key=lambda r: _sort_value(r, query.sort_key), reverse=query.descending)
    return kept


def host_tables(document: dict[str, Any] | None, gpus: list[Gpu], query: ProcessQuery,
                person_of: PersonOf = _nobody,
                open_requests: Mapping[tuple[int, int], int] | None = None) -> HostTables:
    """``open_requests``: (pid, start) -> the open kill request targeting that process."""
    if document is None:
        return HostTables([], _page([], query), None, None, 0, [], [], 0, [], has_snapshot=False)
    rows = process_rows(document)
    labels = _gpu_labels(gpus)
    trees = zombie_trees(rows)
    defunct = {t.parent_pid: len(t.zombies) for t in trees}
    open_requests = open_requests or {}
    holders = [
        _table_row(r, rows, labels, person_of, open_request_id=open_requests.get((r.pid, r.start_time_ticks)),
                   zombie_children=defunct.get(r.pid, 0))
        for r in gpu_holders(rows)
    ]
    workloads = {r.workload.key: r.workload for r in holders if r.workload}
    matching = filter_and_sort(holders, query, gpus)
    page = _page(matching, query)
    return HostTables(
        processes=list(page.object_list),
        page=page,
        previous_page_link=f"?{query.on_page(page.previous_page_number())}" if page.has_previous() else None,
        next_page_link=f"?{query.on_page(page.next_page_number())}" if page.has_next() else None,
        holder_count=len(holders),
        users=sorted({visible_text(r.process.user) for r in holders if r.process.user}, key=str.casefold),
        zombie_trees=trees,
        zombie_count=sum(len(t.zombies) for t in trees),
        orphans=[r for r in holders if r.process.orphaned],
        has_snapshot=True,
        mig_instances=mig_instance_rows(document),
        workloads=sorted(workloads.values(), key=lambda w: (w.kind, w.label.casefold(), w.id)),
        left_out_count=document.get("left_out", {}).get("processes", 0),
        gpu_health=health_lines(document),
        memory_explained=memory_explained(
            document, rows, threshold_bytes=settings.GPUADMIN_UNATTRIBUTED_THRESHOLD_BYTES),
    )
