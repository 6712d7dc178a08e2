"""The fleet page at any fleet size: a summary, a filtered page of hosts, and polls that send only changes.

The view loads one page of hosts (``PAGE_ROWS``, ordered in SQL) and the
fleet's summary, in a fixed number of queries whatever the number of hosts.
Everything it sorts, filters, counts and shows of a host is the host's row and
its ``HostSummary`` (``gpuadmin.fleet.summary``: GPU figures, finding counts
and the worst one, orphans, the biggest holder), kept where those change, so
that 10,000 hosts cost one join, not a subquery per host into GPUs, process
lives and findings. Only the page's keys are read in the fleet's order; then
only the page's hosts with their summaries. Online or offline is the clock's
(``last_seen_at`` against the offline window), never stored.

At 10,000 hosts each pass over the hosts and their summaries is most of what a
page costs, so a page makes two: the summary's aggregate (with the strip's
count of hosts and, for the whole page, not a poll, the model filter's choices)
and the page's keys (with how many match); the strip's lists of names are cut
short by their order.

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

Above the table, the attention strip (``Attention``) names what needs someone
now: offline hosts, then critical findings, then kill requests waiting for an
approver. It rides with the summary (the summary's part of the version covers
both), so a poll re-sends it exactly when either changes.

The order is server-side and in the URL (``sort=``): by default online hosts
first, worst open finding first, then by name; an offline host's data is old,
so it sorts after the hosts whose data is current (the strip names it first).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from functools import cached_property, lru_cache
from typing import Any
from urllib.parse import urlencode

from django.core.paginator import Page, Paginator
from django.db.models import BooleanField, Case, Count, F, IntegerField, Q, Sum, Value, When, Window
from django.db.models.functions import Coalesce
from django.template.loader import render_to_string
from django.urls import get_script_prefix
from django.utils.safestring import SafeString

from gpuadmin.fleet.models import Finding, Host, HostQuerySet, HostSummary, awaiting_acceptance_q, online_q
from gpuadmin.fleet.summary import distinct_gpu_models, gpu_models_contain, gpu_models_in
from gpuadmin.kills.models import KillRequest
from gpuadmin.web.attention import AttentionCount
from gpuadmin.web.host_tables import page_param
from gpuadmin.web.templatetags.gpuadmin_format import memory_bar

PAGE_ROWS = 50
NAME_FILTER_MAX_CHARS = 253  # a host name's longest
STATUS_ONLINE = "online"
STATUS_OFFLINE = "offline"
STATUSES = {STATUS_ONLINE: "Online", STATUS_OFFLINE: "Offline"}
# The table's orders (``sort=``); "attention" is the default: online first, worst finding first, by name.
SORT_ATTENTION = "attention"
SORTS = {
    SORT_ATTENTION: "Needs attention first",
    "name": "Name",
    "free": "Most free GPUs",
    "zombies": "Most zombies",
    "orphans": "Most orphans",
}
FREE_GPUS_MAX = 64  # the largest "at least N free GPUs" the filter takes
GPU_MODEL_MAX_CHARS = 256  # Gpu.name's longest
# How many offline hosts and critical findings the attention strip names (the rest as "and N more").
ATTENTION_NAMED_MAX = 8
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
    """The page's filters, order and page number, from the query string (so a filtered view is a link)."""

    name: str = ""
    status: str = ""
    kind: str = ""
    needs_attention: bool = False
    model: str = ""
    free_gpus: int = 0
    sort: str = SORT_ATTENTION
    page: int = 1

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> FleetQuery:
        status = params.get("status", "")
        kind = params.get("kind", "")
        sort = params.get("sort", "")
        free = params.get("free", "")
        return cls(
            name=params.get("name", "").strip()[:NAME_FILTER_MAX_CHARS],
            status=status if status in STATUSES else "",
            kind=kind if kind in Finding.Kind.values else "",
            needs_attention=params.get("attention", "") == "1",
            model=params.get("model", "")[:GPU_MODEL_MAX_CHARS],
            free_gpus=min(int(free), FREE_GPUS_MAX) if free.isdigit() else 0,
            sort=sort if sort in SORTS else SORT_ATTENTION,
            page=page_param(params.get("page", "")),
        )

    @property
    def is_filtered(self) -> bool:
        return bool(self.name or self.status or self.kind or self.needs_attention or self.model
                    or self.free_gpus)

    def params(self, *, page: int | None = None, sort: str | None = None) -> dict[str, str]:
        page = self.page if page is None else page
        sort = self.sort if sort is None else sort
        values = {"name": self.name, "status": self.status, "kind": self.kind,
                  "attention": "1" if self.needs_attention else "", "model": self.model,
                  "free": str(self.free_gpus) if self.free_gpus else "",
                  "sort": sort if sort != SORT_ATTENTION else "",
                  "page": str(page) if page != 1 else ""}
        return {k: v for k, v in values.items() if v}

    def query_string(self, *, page: int | None = None) -> str:
        return urlencode(self.params(page=page))

    def sorted_by(self, sort: str) -> str:
        """The link to this view in another order, from its first page."""
        return f"?{urlencode(self.params(page=1, sort=sort))}"

    def page_of_hosts(self, now: datetime) -> Page:
        """The asked page of the keys of the hosts that match, in the page's order (past the end: the
        last; the fleet may have shrunk). The number that match is counted by the query that reads the
        page (a window over the rows it is cut from), not by a COUNT of its own: at 10,000 hosts each
        pass over the hosts and their summaries is a good part of the page."""
        keys = self.hosts(now)
        first = (self.page - 1) * PAGE_ROWS
        rows = list(keys.annotate(matching=Window(Count("pk"))).values_list("pk", "matching")
                    [first:first + PAGE_ROWS])
        if not rows:  # past the end, or nothing matches: counted apart, then the last page
            return Paginator(keys.values_list("pk", flat=True), PAGE_ROWS).get_page(self.page)
        paginator = _CountedPaginator(keys, PAGE_ROWS, count=rows[0][1])
        return Page([pk for pk, _ in rows], self.page, paginator)

    def hosts(self, now: datetime) -> HostQuerySet:
        """The hosts that match, in the page's order: read from the hosts and their summaries
        (``HostSummary``), one row each, never their GPUs, process lives or findings (but for the
        finding-kind filter, a semi-join on the open findings)."""
        hosts = Host.objects.fleet().annotate(
            # 1 for offline (never seen included): old data sorts after current data.
            offline_rank=Case(When(online_q(now), then=Value(0)), default=Value(1),
                              output_field=IntegerField()),
            # A host without a summary yet (stored before summaries existed) sorts as one with nothing.
            worst_finding_rank=Coalesce(F("summary__worst_finding_rank"), len(Finding.Severity)),
        )
        if self.name:
            hosts = hosts.filter(name__icontains=self.name)
        if self.status == STATUS_ONLINE:
            hosts = hosts.filter(offline_rank=0)
        elif self.status == STATUS_OFFLINE:
            hosts = hosts.filter(offline_rank=1)
        if self.kind:
            hosts = hosts.with_open_finding(self.kind)
        if self.needs_attention:
            # Offline, or a critical or warning finding open, or zombies: what the strip would name.
            hosts = hosts.filter(Q(offline_rank=1) | Q(summary__findings_critical_count__gt=0)
                                 | Q(summary__findings_warning_count__gt=0) | Q(zombie_count__gt=0))
        if self.model:
            hosts = hosts.filter(summary__gpu_models__contains=gpu_models_contain(self.model))
        if self.free_gpus or self.sort == "free":
            hosts = hosts.annotate(free_gpus=Coalesce(F("summary__free_gpu_count"), 0))
        if self.free_gpus:
            hosts = hosts.filter(free_gpus__gte=self.free_gpus)
        if self.sort == "orphans":
            hosts = hosts.annotate(orphans=Coalesce(F("summary__orphan_count"), 0))
        order = {
            SORT_ATTENTION: ("offline_rank", "worst_finding_rank", "name"),
            "name": ("name",),
            "free": ("offline_rank", "-free_gpus", "name"),
            "zombies": ("-zombie_count", "name"),
            "orphans": ("-orphans", "name"),
        }[self.sort]
        return hosts.order_by(*order)


class _CountedPaginator(Paginator):
    """A paginator told how many there are (``FleetQuery.page_of_hosts`` counts with the page's rows)."""

    def __init__(self, object_list: Any, per_page: int, *, count: int) -> None:
        super().__init__(object_list, per_page)
        self.counted = count

    @cached_property
    def count(self) -> int:
        return self.counted


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
    orphan_count: int = 0
    utilizations: tuple[int | None, ...] = ()  # per present GPU, by index, as ``bars``
    worst_finding_severity: str = ""
    worst_finding_title: str = ""
    top_holder_user: str = ""  # whose process holds the most GPU memory on the host

    @classmethod
    def of(cls, host: Host, now: datetime) -> FleetRow:
        """``host`` with its summary (``_rows``); a host without one yet shows no GPU or finding."""
        online = host.last_seen_at is not None and now - host.last_seen_at <= Host.offline_after()
        summary = getattr(host, "summary", None) or HostSummary(host=host)
        gpus = [_PackedGpu(*gpu) for gpu in sorted(summary.gpus)]  # by index
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
            findings_critical=summary.findings_critical_count,
            findings_warning=summary.findings_warning_count,
            findings_info=summary.findings_info_count,
            orphan_count=summary.orphan_count,
            utilizations=tuple(g.utilization_percent for g in gpus),
            worst_finding_severity=summary.worst_finding_severity,
            worst_finding_title=summary.worst_finding_title,
            top_holder_user=summary.top_holder_user,
        )

    @property
    def gpu_bars(self) -> list[dict[str, str]]:
        return [dict(bar) for bar in self.bars]

    @property
    def gpu_cells(self) -> list[tuple[dict[str, str], int | None]]:
        """Each present GPU's bar figures with its utilisation (the table's small cell per GPU)."""
        return [(dict(bar), busy) for bar, busy in zip(self.bars, self.utilizations, strict=False)]

    @property
    def has_findings(self) -> bool:
        return bool(self.findings_critical or self.findings_warning or self.findings_info)

    @property
    def findings_count_text(self) -> str:
        """"1 critical, 2 warning": every open finding, counted (the cell names only the worst)."""
        counts = ((self.findings_critical, "critical"), (self.findings_warning, "warning"),
                  (self.findings_info, "info"))
        return ", ".join(f"{n} {severity}" for n, severity in counts if n)

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
    critical_hosts: int  # hosts with a critical finding open (the strip's "on N hosts")
    # The fleet's GPU models, sorted: the model filter's choices, read for the whole page only
    # (``of_fleet(gpu_models=True)``) and not in the version: a poll's summary does not show them.
    gpu_models: tuple[str, ...] = ()

    @classmethod
    def of_fleet(cls, now: datetime, *, gpu_models: bool = False) -> FleetSummary:
        """Two queries, whatever the fleet's size: the hosts with their summaries, summed (and the
        strip's count of hosts, and with ``gpu_models`` the filter's models, in the same pass: at 10,000
        hosts each pass over the hosts and their summaries is most of the page); the pending kill
        requests."""
        def total(name: str) -> Coalesce:
            return Coalesce(Sum(f"summary__{name}"), 0)

        # Grouped by whether the host awaits acceptance (at most two rows): the condition is read once a
        # host, not once an aggregate (a FILTER each); of the awaiting hosts only their number is used.
        grouped = (Host.objects.annotate(awaiting=Case(When(awaiting_acceptance_q(), then=Value(True)),
                                                       default=Value(False), output_field=BooleanField()))
                   .order_by().values("awaiting").annotate(
                       hosts=Count("pk"),
                       online=Count("pk", filter=online_q(now)),
                       gpus=total("gpu_count"),
                       total=total("memory_total_bytes"),
                       used=total("memory_used_bytes"),
                       unattributed=total("memory_unattributed_bytes"),
                       **{severity.value: total(f"findings_{severity.value}_count")
                          for severity in Finding.Severity},
                       critical_hosts=Count("pk", filter=Q(summary__findings_critical_count__gt=0)),
                       **({"models": distinct_gpu_models("summary__gpu_models")} if gpu_models else {}),
                   ))
        rows = {row["awaiting"]: row for row in grouped}
        fleet, awaiting = rows.get(False, {}), rows.get(True, {})

        def figure(name: str) -> int:
            """A figure of the fleet's row (none without hosts); int(): PostgreSQL sums bigints as
            numeric, which arrives as a Decimal."""
            return int(fleet.get(name) or 0)

        return cls(
            hosts_online=figure("online"),
            hosts_offline=figure("hosts") - figure("online"),
            hosts_awaiting=int(awaiting.get("hosts") or 0),
            gpus=figure("gpus"),
            memory_total_bytes=figure("total"),
            memory_used_bytes=figure("used"),
            memory_unattributed_bytes=figure("unattributed"),
            findings_critical=figure(Finding.Severity.CRITICAL.value),
            findings_warning=figure(Finding.Severity.WARNING.value),
            findings_info=figure(Finding.Severity.INFO.value),
            kill_requests_pending=KillRequest.objects.pending().count(),
            critical_hosts=figure("critical_hosts"),
            gpu_models=tuple(gpu_models_in(fleet.get("models"))),
        )

    @property
    def version(self) -> str:
        return _fields_version(replace(self, gpu_models=()))

    @property
    def attention_count(self) -> AttentionCount:
        """The nav's count, from these figures (the same definitions as ``AttentionCount.of_fleet``)."""
        return AttentionCount(offline_hosts=self.hosts_offline, critical_findings=self.findings_critical,
                              pending_approvals=self.kill_requests_pending)


@dataclass(frozen=True)
class Attention:
    """The strip above the table: offline hosts, then critical findings, then requests waiting for approval.

    Names the first few of each (``ATTENTION_NAMED_MAX``); the counts are the summary's. A list is read
    only when its count is not zero, so a quiet fleet costs no query here.
    """

    offline_count: int
    offline: tuple[tuple[str, datetime | None], ...]  # (host, last seen), the most recently gone first
    critical_count: int
    critical_hosts_count: int
    critical: tuple[str, ...]  # hosts with a critical finding open, by name
    pending_count: int
    pending: tuple[tuple[int, str], ...]  # (request, host), the oldest first

    @classmethod
    def of_fleet(cls, summary: FleetSummary, now: datetime) -> Attention:
        fleet = Host.objects.fleet()
        offline: tuple[tuple[str, datetime | None], ...] = ()
        critical: tuple[str, ...] = ()
        pending: tuple[tuple[int, str], ...] = ()
        if summary.hosts_offline:
            offline = tuple(fleet.offline(now).order_by(F("last_seen_at").desc(nulls_last=True), "name")
                            .values_list("name", "last_seen_at")[:ATTENTION_NAMED_MAX])
        if summary.findings_critical:
            # By host, not by finding: one host's five findings are one place to go.
            critical = tuple(fleet.filter(summary__findings_critical_count__gt=0).order_by("name")
                             .values_list("name", flat=True)[:ATTENTION_NAMED_MAX])
        if summary.kill_requests_pending:
            pending = tuple(KillRequest.objects.pending().order_by("pk").values_list("pk", "host__name")
                            [:ATTENTION_NAMED_MAX])
        return cls(summary.hosts_offline, offline, summary.findings_critical, summary.critical_hosts,
                   critical, summary.kill_requests_pending, pending)

    @property
    def alarming(self) -> bool:
        """Something is wrong (an alert for a screen reader), not only waiting (a status)."""
        return bool(self.offline_count or self.critical_count)

    @property
    def offline_more(self) -> int:
        return self.offline_count - len(self.offline)

    @property
    def critical_more(self) -> int:
        return self.critical_hosts_count - len(self.critical)

    @property
    def pending_more(self) -> int:
        return self.pending_count - len(self.pending)

    @property
    def version(self) -> str:
        return _fields_version(self)


@dataclass
class FleetPage:
    query: FleetQuery
    summary: FleetSummary
    page: Page
    rows: list[FleetRow] = field(default_factory=list)
    attention: Attention | None = None

    @classmethod
    def load(cls, query: FleetQuery, now: datetime, *, gpu_models: bool = False) -> FleetPage:
        """The summary and the asked page (past the end: the last; the fleet may have shrunk); with
        ``gpu_models``, the whole page's, the model filter's choices too."""
        page = query.page_of_hosts(now)
        summary = FleetSummary.of_fleet(now, gpu_models=gpu_models)
        return cls(query, summary, page, _rows(list(page), now), Attention.of_fleet(summary, now))

    @property
    def summary_version(self) -> str:
        """The summary's and the strip's: a poll sends both again when either changed."""
        attention = self.attention.version if self.attention else ""
        return _version((self.summary.version, attention))

    @property
    def sort_links(self) -> dict[str, str]:
        return {key: self.query.sorted_by(key) for key in SORTS}

    @property
    def layout_version(self) -> str:
        return _version(([row.pk for row in self.rows], self.page.number, self.page.paginator.num_pages,
                         self.page.paginator.count))

    @property
    def version(self) -> str:
        parts = [self.summary_version, self.layout_version, *(row.version for row in self.rows)]
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


@dataclass(frozen=True, slots=True)
class _PackedGpu:
    """A GPU as its host's summary keeps it (``HostSummary.gpus``): what ``memory_bar`` reads."""

    index: int
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    memory_attributed_bytes: int
    utilization_percent: int | None


def _rows(host_ids: list[int], now: datetime) -> list[FleetRow]:
    """The rows of these hosts, in this order: one query (the hosts with their summaries)."""
    if not host_ids:
        return []
    hosts = {host.pk: host for host in Host.objects.filter(pk__in=host_ids).select_related("summary")
             .only(*_ROW_HOST_FIELDS, *(f"summary__{name}" for name in _ROW_SUMMARY_FIELDS)).order_by()}
    # A host forgotten between the two reads is left out; the next poll's layout says so.
    return [FleetRow.of(hosts[pk], now) for pk in host_ids if pk in hosts]


# What a row reads of its host and its summary (FleetRow.of): the rest of the host's columns stay behind.
_ROW_HOST_FIELDS = ("name", "last_seen_at", "last_error", "gpu_backend_available", "gpu_process_count",
                    "zombie_count")
_ROW_SUMMARY_FIELDS = ("gpus", "orphan_count", "top_holder_user", "worst_finding_severity",
                       "worst_finding_title", "findings_critical_count", "findings_warning_count",
                       "findings_info_count")


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
    return Changes(summary=parts[0] != page.summary_version, rows=changed)
