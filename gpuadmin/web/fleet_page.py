"""The fleet page at any fleet size: a summary, a filtered page of hosts, and polls that send only changes.

The view loads one page of hosts (``PAGE_ROWS``, ordered by worst open finding
then name in SQL: ``Host.objects.worst_finding_first``) and the fleet's
summary, in a fixed number of queries whatever the number of hosts. Only the
page's keys are read in the fleet's order; then only the page's hosts, with
their open-finding counts, and their present GPUs' figures (no model
instances: 400 GPUs' worth of them cost more than all the page's queries).

Every row is a ``FleetRow``: the values the row template shows and nothing
else, so a row's ``version`` (a short hash of those values) changes exactly
when what the row shows changes. The page's ``version`` strings together the
summary's version, a version of the page's layout (which hosts, in which
order, how many pages) and each row's version. The poll sends that string
back (``?seen=``), and ``changes`` compares:

- nothing changed: the view answers 204 and htmx swaps nothing;
- some rows or the summary changed: only those, as out-of-band swaps by their
  stable ids (``host-row-<pk>``), so an unchanged row (and a focused link in
  it) is never replaced;
- the layout changed (a host came, went or moved, the page count changed): the
  whole table region.

An online host's row shows no "last seen" time: it would change with every
snapshot and make every row "changed" at every poll; "online" says it was seen
within the offline window. An offline host's row shows when it was last seen.

A row's HTML is a function of its ``FleetRow`` (compared by value, not by its
short version), so each process keeps the HTML of the rows it rendered last
(``row_html``): an unchanged row is rendered once, not at every page load and
every poll. Offline rows are always rendered: they say how long ago the host
was seen, which changes with the clock, not with the row.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from functools import lru_cache
from typing import Any
from urllib.parse import urlencode

from django.core.paginator import Page, Paginator
from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Greatest
from django.template.loader import render_to_string
from django.urls import get_script_prefix
from django.utils.safestring import SafeString

from gpuadmin.fleet.models import Finding, Gpu, Host, awaiting_acceptance_q
from gpuadmin.kills.models import KillRequest
from gpuadmin.web.host_tables import page_param
from gpuadmin.web.templatetags.gpuadmin_format import memory_bar

PAGE_ROWS = 50
NAME_FILTER_MAX_CHARS = 253  # a host name's longest
STATUS_ONLINE = "online"
STATUS_OFFLINE = "offline"
STATUSES = {STATUS_ONLINE: "Online", STATUS_OFFLINE: "Offline"}
# Parts of a version string; a version never contains it otherwise (hex digits only).
VERSION_SEPARATOR = "."
# Rendered rows kept per process (row_html): every row of a 1,000-host fleet, in both forms
# (in the table, and out of band in a poll's answer), at a few KiB each.
ROW_HTML_CACHE_SIZE = 2048
ROW_TEMPLATE = "web/_fleet_row.html"


def offline_seconds() -> int:
    """After how long without a snapshot a host is offline (what an online row says)."""
    return int(Host.offline_after().total_seconds())


def _version(values: object) -> str:
    """A short fingerprint of ``values`` (their repr): 8 hex digits, to tell "changed" from "same"."""
    return hashlib.blake2b(repr(values).encode(), digest_size=4).hexdigest()


def _fields_version(record: object) -> str:
    """The version of a dataclass's fields (not dataclasses.astuple, which deep-copies every value)."""
    return _version(tuple(getattr(record, f.name) for f in fields(record)))  # type: ignore[arg-type]


@dataclass(frozen=True)
class FleetQuery:
    """The page's filters and page number, from the query string (so a filtered view is a link)."""

    name: str = ""
    status: str = ""
    kind: str = ""
    page: int = 1

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> FleetQuery:
        status = params.get("status", "")
        kind = params.get("kind", "")
        return cls(
            name=params.get("name", "").strip()[:NAME_FILTER_MAX_CHARS],
            status=status if status in STATUSES else "",
            kind=kind if kind in Finding.Kind.values else "",
            page=page_param(params.get("page", "")),
        )

    @property
    def is_filtered(self) -> bool:
        return bool(self.name or self.status or self.kind)

    def params(self, *, page: int | None = None) -> dict[str, str]:
        page = self.page if page is None else page
        values = {"name": self.name, "status": self.status, "kind": self.kind,
                  "page": str(page) if page != 1 else ""}
        return {k: v for k, v in values.items() if v}

    def query_string(self, *, page: int | None = None) -> str:
        return urlencode(self.params(page=page))

    def hosts(self, now: datetime) -> Paginator:
        """The keys of the hosts that match, in the page's order, paged."""
        hosts = Host.objects.worst_finding_first()
        if self.name:
            hosts = hosts.filter(name__icontains=self.name)
        if self.status == STATUS_ONLINE:
            hosts = hosts.online(now)
        elif self.status == STATUS_OFFLINE:
            hosts = hosts.offline(now)
        if self.kind:
            hosts = hosts.with_open_finding(self.kind)
        return Paginator(hosts.values_list("pk", flat=True), PAGE_ROWS)


@dataclass(frozen=True)
class FleetRow:
    """What one host's row shows (templates/web/_fleet_row.html reads only this)."""

    pk: int
    name: str
    online: bool
    last_seen_at: datetime | None  # only when offline (see the module's docstring)
    never_seen: bool
    last_error: str
    gpu_data_available: bool
    bars: tuple[tuple[tuple[str, str], ...], ...]  # memory_bar's items per present GPU, by index
    gpu_process_count: int
    zombie_count: int
    findings_critical: int
    findings_warning: int
    findings_info: int

    @classmethod
    def of(cls, host: Host, gpus: list[Any], now: datetime) -> FleetRow:
        """``host`` with ``with_open_finding_counts``; ``gpus``: its present GPUs' figures, by index."""
        online = host.last_seen_at is not None and now - host.last_seen_at <= Host.offline_after()
        return cls(
            pk=host.pk,
            name=host.name,
            online=online,
            last_seen_at=None if online else host.last_seen_at,
            never_seen=host.last_seen_at is None,
            last_error=host.last_error,
            gpu_data_available=host.gpu_backend_available,
            bars=tuple(tuple(memory_bar(g).items()) for g in gpus),
            gpu_process_count=host.gpu_process_count,
            zombie_count=host.zombie_count,
            findings_critical=host.open_findings_critical,
            findings_warning=host.open_findings_warning,
            findings_info=host.open_findings_info,
        )

    @property
    def gpu_bars(self) -> list[dict[str, str]]:
        return [dict(bar) for bar in self.bars]

    @property
    def has_findings(self) -> bool:
        return bool(self.findings_critical or self.findings_warning or self.findings_info)

    @property
    def version(self) -> str:
        return _fields_version(self)

    @property
    def html(self) -> SafeString:
        """The row in the table (``row_html``)."""
        return row_html(self)

    @property
    def oob_html(self) -> SafeString:
        """The row swapped alone, out of band, by a poll's answer (``row_html``)."""
        return row_html(self, oob=True)


def row_html(row: FleetRow, *, oob: bool = False) -> SafeString:
    """The row's HTML (templates/web/_fleet_row.html), rendered once per process while it shows the same.

    The key is everything the template reads: the row, ``oob``, the offline window it
    names, and the script prefix its link starts with. An offline row names a time
    relative to now (naturaltime), so it is rendered each time.
    """
    if not row.online:
        return _render_row(row, oob, offline_seconds())
    return _cached_row_html(row, oob, offline_seconds(), get_script_prefix())


def _render_row(row: FleetRow, oob: bool, offline_after_seconds: int) -> SafeString:
    return SafeString(render_to_string(ROW_TEMPLATE, {"row": row, "oob": oob,
                                                      "offline_seconds": offline_after_seconds}))


@lru_cache(maxsize=ROW_HTML_CACHE_SIZE)
def _cached_row_html(row: FleetRow, oob: bool, offline_after_seconds: int, script_prefix: str) -> SafeString:
    del script_prefix  # only a part of the key: reverse() reads it for the row's link
    return _render_row(row, oob, offline_after_seconds)


@dataclass(frozen=True)
class FleetSummary:
    """The numbers above the table: the whole fleet's, whatever the filters."""

    hosts_online: int
    hosts_offline: int
    hosts_awaiting: int
    gpus: int
    memory_total_bytes: int
    memory_used_bytes: int
    memory_unattributed_bytes: int
    findings_critical: int
    findings_warning: int
    findings_info: int
    kill_requests_pending: int

    @classmethod
    def of_fleet(cls, now: datetime) -> FleetSummary:
        """Four queries, whatever the fleet's size."""
        online_since = now - Host.offline_after()
        fleet = Host.objects.fleet()
        awaiting = awaiting_acceptance_q()
        hosts = Host.objects.aggregate(
            online=Count("pk", filter=~awaiting & Q(last_seen_at__gte=online_since)),
            fleet=Count("pk", filter=~awaiting),
            awaiting=Count("pk", filter=awaiting),
        )
        gpus = Gpu.objects.filter(present=True, host__in=fleet).aggregate(
            count=Count("pk"),
            total=Sum("memory_total_bytes"),
            used=Sum("memory_used_bytes"),
            # Gpu.memory_unattributed_bytes in SQL: used - attributed, never below 0.
            unattributed=Sum(Greatest(F("memory_used_bytes") - F("memory_attributed_bytes"), 0)),
        )
        severities = dict(
            Finding.objects.open().filter(host__in=fleet).order_by()
            .values_list("severity").annotate(n=Count("pk")).values_list("severity", "n")
        )
        return cls(
            hosts_online=hosts["online"],
            hosts_offline=hosts["fleet"] - hosts["online"],
            hosts_awaiting=hosts["awaiting"],
            gpus=gpus["count"],
            # int(): PostgreSQL sums bigints as numeric, which arrives as a Decimal.
            memory_total_bytes=int(gpus["total"] or 0),
            memory_used_bytes=int(gpus["used"] or 0),
            memory_unattributed_bytes=int(gpus["unattributed"] or 0),
            findings_critical=severities.get(Finding.Severity.CRITICAL, 0),
            findings_warning=severities.get(Finding.Severity.WARNING, 0),
            findings_info=severities.get(Finding.Severity.INFO, 0),
            kill_requests_pending=KillRequest.objects.pending().count(),
        )

    @property
    def version(self) -> str:
        return _fields_version(self)


@dataclass
class FleetPage:
    query: FleetQuery
    summary: FleetSummary
    page: Page
    rows: list[FleetRow] = field(default_factory=list)

    @classmethod
    def load(cls, query: FleetQuery, now: datetime) -> FleetPage:
        """The summary and the asked page (past the end: the last; the fleet may have shrunk)."""
        page = query.hosts(now).get_page(query.page)
        return cls(query, FleetSummary.of_fleet(now), page, _rows(list(page), now))

    @property
    def layout_version(self) -> str:
        return _version(([row.pk for row in self.rows], self.page.number, self.page.paginator.num_pages,
                         self.page.paginator.count))

    @property
    def version(self) -> str:
        parts = [self.summary.version, self.layout_version, *(row.version for row in self.rows)]
        return VERSION_SEPARATOR.join(parts)

    @property
    def poll_query_string(self) -> str:
        """What the poll asks for: this very page, and what the client has of it."""
        return urlencode({**self.query.params(page=self.page.number), "seen": self.version})

    @property
    def previous_page_link(self) -> str | None:
        if not self.page.has_previous():
            return None
        return f"?{self.query.query_string(page=self.page.previous_page_number())}"

    @property
    def next_page_link(self) -> str | None:
        if not self.page.has_next():
            return None
        return f"?{self.query.query_string(page=self.page.next_page_number())}"


# What memory_bar reads of a GPU, read as tuples (values_list(named=True)), not as models.
_GPU_FIGURES = ("host_id", "index", "memory_total_bytes", "memory_used_bytes", "memory_attributed_bytes",
                "utilization_percent")


def _rows(host_ids: list[int], now: datetime) -> list[FleetRow]:
    """The rows of these hosts, in this order: two queries (hosts with counts, present GPUs)."""
    if not host_ids:
        return []
    hosts = {host.pk: host for host in
             Host.objects.filter(pk__in=host_ids).with_open_finding_counts().order_by()}
    gpus: dict[int, list[Any]] = defaultdict(list)
    present = Gpu.objects.filter(present=True, host_id__in=host_ids).order_by("host_id", "index")
    for gpu in present.values_list(*_GPU_FIGURES, named=True):
        gpus[gpu.host_id].append(gpu)
    # A host forgotten between the two reads is left out; the next poll's layout says so.
    return [FleetRow.of(hosts[pk], gpus[pk], now) for pk in host_ids if pk in hosts]


@dataclass(frozen=True)
class Changes:
    """What a poll must send: nothing, the whole table region, or only some rows and the summary."""

    region: bool = False
    summary: bool = False
    rows: tuple[FleetRow, ...] = ()

    @property
    def nothing(self) -> bool:
        return not (self.region or self.summary or self.rows)


def changes(page: FleetPage, seen: str) -> Changes:
    """Compare the page now with the version the client says it shows (``seen``; "" for nothing)."""
    parts = seen.split(VERSION_SEPARATOR)
    if len(parts) < 2 or parts[1] != page.layout_version or len(parts) != 2 + len(page.rows):
        return Changes(region=True, summary=True)
    changed = tuple(row for row, was in zip(page.rows, parts[2:], strict=True) if row.version != was)
    return Changes(summary=parts[0] != page.summary.version, rows=changed)
