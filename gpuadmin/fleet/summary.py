"""One small row per host (``HostSummary``) that the fleet page, its filters and its attention strip read.

Only this module writes them: ``refresh_host_summaries`` recomputes hosts' summaries from what is
stored (their present GPUs, live process lives, open findings) in statements compiled once, an
insert of an empty row when there is none and UPDATEs of correlated subqueries, whose answers
nobody waits for: inside ingest's pipeline they cost no round trip of their own. Everything that
changes those calls it in the same transaction:

- a full snapshot (``fleet.intake.ingest.ingest_document``): GPU figures, orphans, the biggest holder,
  findings drawn; a batch of snapshot updates (``fleet.intake.updates``) recomputes only what an update
  can move (``refresh_updated_figures``: ``UPDATE_COLUMNS``, from the same expressions), the top
  holder only where the memory it moved may have changed it (``top_holder_may_change``);
- findings opened or closed outside ingest: the kills app's (``kills.services.findings``) and the
  rejected-messages finding (``fleet.intake.trust``).

Recomputed, not patched: whichever path changed something, the summary says what the rows say. A host
without one (stored before the summaries existed, and silent since) gets it from ``fill_missing``, run
by the history maintenance beat. Online or offline is not stored: it depends on the clock, and is read
from ``last_seen_at``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models import (
    Aggregate,
    Case,
    Count,
    F,
    IntegerField,
    JSONField,
    OuterRef,
    QuerySet,
    Subquery,
    Sum,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Concat, Greatest, JSONArray
from django.utils import timezone

from gpuadmin.fleet.models import Finding, Gpu, Host, HostSummary, ProcessLife
from gpuadmin.fleet.storage.statements import AnyOf, Param, PreparedQuery, PreparedUpdate, RowInsert

# A GPU counts as free when this little memory is used on it (the driver's own share fits under it).
FREE_GPU_MAX_USED_BYTES = 1024**3
# Around each model in HostSummary.gpu_models: no model name holds a newline.
GPU_MODELS_SEPARATOR = "\n"

def _severity_rank() -> Case:
    """``Severity.rank`` in SQL (the severity is text: the database cannot order it by urgency)."""
    return Case(*[When(severity=severity.value, then=Value(severity.rank)) for severity in Finding.Severity],
                output_field=IntegerField())


class _JsonRows(Aggregate):
    """The rows' JSON values as one JSON array (SQLite's json_group_array, PostgreSQL's jsonb_agg)."""

    function = "JSON_GROUP_ARRAY"
    output_field = JSONField()
    allow_distinct = True

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, function="JSONB_AGG", **extra)


class _Lines(Aggregate):
    """The rows' texts, each after a GPU_MODELS_SEPARATOR (repeats kept: a filter matches either way)."""

    function = "GROUP_CONCAT"
    template = "%(function)s(%(distinct)s%(expressions)s, '')"  # joined with nothing between
    output_field = TextField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, function="STRING_AGG", **extra)


def _of_outer_host(queryset: QuerySet[Any], value: Any, default: Any) -> Coalesce:
    """``value`` aggregated over ``queryset``'s rows of the outer query's host, as a subquery."""
    grouped = queryset.filter(host=OuterRef("host")).order_by().values("host")
    return Coalesce(Subquery(grouped.annotate(v=value).values("v")), default)


def _summary_columns() -> dict[str, Any]:
    """Each column of a summary as computed from the rows: the one home of what a summary says."""
    gpus = Gpu.objects.filter(present=True)
    live = ProcessLife.objects.filter(gone_at__isnull=True)
    open_findings = Finding.objects.open()
    worst = (open_findings.filter(host=OuterRef("host")).annotate(rank=_severity_rank())
             .order_by("rank", "first_seen_at", "kind", "key"))
    unattributed = Greatest(F("memory_used_bytes") - F("memory_attributed_bytes"), 0)
    # The open life holding the most GPU memory (ties: the lowest pid); top_holder_may_change's order.
    top = (live.filter(host=OuterRef("host"), last_gpu_memory_bytes__gt=0)
           .order_by("-last_gpu_memory_bytes", "pid"))
    return dict(
        gpus=_of_outer_host(gpus, _JsonRows(JSONArray("index", "memory_total_bytes", "memory_used_bytes",
                                                      "memory_attributed_bytes", "utilization_percent")),
                            Value([], output_field=JSONField())),
        gpu_count=_of_outer_host(gpus, Count("pk"), 0),
        free_gpu_count=_of_outer_host(gpus.filter(memory_used_bytes__lte=FREE_GPU_MAX_USED_BYTES),
                                      Count("pk"), 0),
        memory_total_bytes=_of_outer_host(gpus, Sum("memory_total_bytes"), 0),
        memory_used_bytes=_of_outer_host(gpus, Sum("memory_used_bytes"), 0),
        memory_unattributed_bytes=_of_outer_host(gpus, Sum(unattributed), 0),
        gpu_models=Concat(
            _of_outer_host(gpus.exclude(name=""),
                           _Lines(Concat(Value(GPU_MODELS_SEPARATOR), "name", output_field=TextField())),
                           Value("", output_field=TextField())),
            Value(GPU_MODELS_SEPARATOR), output_field=TextField()),
        orphan_count=_of_outer_host(live.filter(was_orphaned=True), Count("pk"), 0),
        top_holder_life_id=Subquery(top.values("pk")[:1]),
        worst_finding_rank=Coalesce(Subquery(worst.values("rank")[:1]), len(Finding.Severity)),
        worst_finding_severity=Coalesce(Subquery(worst.values("severity")[:1]), Value("")),
        worst_finding_title=Coalesce(Subquery(worst.values("title")[:1]), Value("")),
        **{f"findings_{severity.value}_count":
           _of_outer_host(open_findings.filter(severity=severity.value), Count("pk"), 0)
           for severity in Finding.Severity},
    )


def _top_holder_details() -> dict[str, Any]:
    """The top holder's user and memory, read from its life (``top_holder_life_id`` as the row holds
    it): by a statement after the one that computed the life, a key lookup each where a subquery of the
    host's open lives each would read them all."""
    life = ProcessLife.objects.filter(pk=OuterRef("top_holder_life_id"))
    return dict(top_holder_user=Coalesce(Subquery(life.values("user")[:1]), Value("")),
                top_holder_memory_bytes=Coalesce(Subquery(life.values("last_gpu_memory_bytes")[:1]), 0))


# What a snapshot update can move: its GPUs' figures, and its processes' memory, so the top holder
# (recomputed only where it may have changed: ``refresh_updated_figures``). Which GPUs and processes
# there are, their models and owners, and the findings change only with a full snapshot or outside ingest.
UPDATE_COLUMNS = ("gpus", "free_gpu_count", "memory_used_bytes", "memory_unattributed_bytes")


class TopHolder(NamedTuple):
    """A summary's top holder as a batch of updates compares with it: its life (None: no process holds
    GPU memory) and that life's memory."""

    life_id: int | None
    memory_bytes: int


def _summary_update(computed: dict[str, Any], columns: Sequence[str] | None = None, *, one_host: bool = False,
                    rechecked: Sequence[str] = ()) -> PreparedUpdate:
    """The hosts' summaries recomputed in one UPDATE of correlated subqueries, ``computed``'s columns
    (``columns``: those only): nothing read back, so it rides in ingest's pipeline
    (``statements.pipelined``) without a round trip of its own. ``one_host``: for the run parameter
    ``host``, not a list ``hosts``: every full snapshot refreshes one host, and PostgreSQL would plan a
    list's statement (``AnyOf``) anew at every run, which for the whole row's some fifteen subqueries
    cost more than running it (tests/fleet/test_summary.py).
    ``rechecked``: columns recomputed only for the hosts of the run parameter ``recheck``, the others'
    kept as they are (a CASE: the database runs the subquery of those hosts' alone)."""
    hosts = (HostSummary.objects.filter(host=Param(HostSummary, "host")) if one_host
             else HostSummary.objects.filter(AnyOf(HostSummary, "host", key="hosts")))
    recheck = AnyOf(HostSummary, "host", key="recheck")
    return PreparedUpdate(
        hosts,
        **{name: computed[name] for name in (columns or computed)},
        **{name: Case(When(recheck, then=computed[name]), default=F(name)) for name in rechecked},
        updated_at=Param(HostSummary, "updated_at"),
    )


# A host's first summary is an empty row, then filled as every later one (nothing to do when it is there).
_EMPTY = {field.name: field.get_default() for field in HostSummary._meta.concrete_fields
          if not field.primary_key and field.name != "updated_at"}
_SUMMARY_ROW = RowInsert(HostSummary, ["host", *_EMPTY, "updated_at"], conflict=["host"])
# The whole row, then its top holder's details from the life it names. The whole row's statement must
# stay within what psycopg keeps parsed (4,096 characters, 50 parameters): past it, psycopg parses it
# again at every full snapshot (tests/fleet/test_summary.py).
_SUMMARY_UPDATE = _summary_update(_summary_columns())
_ONE_SUMMARY_UPDATE = _summary_update(_summary_columns(), one_host=True)
_DETAILS_UPDATE = _summary_update(_top_holder_details())
_ONE_DETAILS_UPDATE = _summary_update(_top_holder_details(), one_host=True)
_FIGURES_UPDATE = _summary_update(_summary_columns(), UPDATE_COLUMNS, rechecked=["top_holder_life_id"])
_TOP_HOLDERS = PreparedQuery(
    HostSummary.objects.filter(AnyOf(HostSummary, "host", key="hosts")).order_by()
    .values_list("host", "top_holder_life_id", "top_holder_memory_bytes")
)


def refresh_host_summary(host_id: int, *, now: datetime | None = None) -> None:
    """Recompute the host's ``HostSummary`` (``refresh_host_summaries``)."""
    refresh_host_summaries([host_id], now=now)


def refresh_host_summaries(host_ids: Sequence[int], *, now: datetime | None = None) -> None:
    """Recompute the hosts' ``HostSummary`` rows from their stored GPUs, process lives and open findings:
    three statements, whatever the number of hosts, whose answers nobody waits for."""
    if not host_ids:
        return
    now = now or timezone.now()
    _SUMMARY_ROW.run([(host_id, *_EMPTY.values(), now) for host_id in host_ids], returning=False)
    if len(host_ids) == 1:
        _ONE_SUMMARY_UPDATE.run(host=host_ids[0], updated_at=now)
        _ONE_DETAILS_UPDATE.run(host=host_ids[0], updated_at=now)
    else:
        _SUMMARY_UPDATE.run(hosts=host_ids, updated_at=now)
        _DETAILS_UPDATE.run(hosts=host_ids, updated_at=now)


def refresh_updated_figures(host_ids: Sequence[int], *, now: datetime, recheck: Collection[int]) -> None:
    """Recompute what snapshot updates can move of the hosts' summaries: one statement, fewer
    subqueries than the whole row's. ``UPDATE_COLUMNS`` for every host; the top holder only for the
    hosts in ``recheck``, those whose top holder may have changed (``top_holder_may_change``): reading
    a host's open lives to find it was most of the statement (then a second statement, its details). An
    update applies only on top of a full snapshot, whose ingest wrote the whole summary; a host with
    none yet (stored before summaries existed) gets it at its next full snapshot, or from
    ``fill_missing``."""
    if host_ids:
        _FIGURES_UPDATE.run(hosts=list(host_ids), recheck=list(recheck), updated_at=now)
    if recheck:
        _DETAILS_UPDATE.run(hosts=list(recheck), updated_at=now)


def start_reading_top_holders(host_ids: Sequence[int]) -> Callable[[], dict[int, TopHolder]]:
    """The hosts' summaries' top holders, by host (a host without a summary left out): the query is
    sent now (inside ``statements.pipelined`` it waits for no answer), its rows read by the function
    returned."""
    rows = _TOP_HOLDERS.start(hosts=list(host_ids))
    return lambda: {host_id: TopHolder(life_id, memory) for host_id, life_id, memory in rows.rows()}


def top_holder_may_change(top: TopHolder | None, moved: Iterable[tuple[int, int]]) -> bool:
    """Whether a host's top holder may differ from its summary's ``top`` once the open lives in
    ``moved`` (life id, GPU memory bytes now) hold that memory. The top holder is the open life holding
    the most (ties: the lowest pid), and between full snapshots only an update's named lives' memory
    moves (which lives are open changes only at a full snapshot, which recomputes the whole summary):
    the top stays unless its own memory moved, or another life now holds at least as much (an equal
    one may have the lower pid)."""
    if top is None:
        return False  # no summary to keep: the whole of it is written at the next full snapshot
    return any(life_id == top.life_id or (memory_bytes > 0 and memory_bytes >= top.memory_bytes)
               for life_id, memory_bytes in moved)


def fill_missing(*, now: datetime | None = None, limit: int = 1000) -> int:
    """Summaries for up to ``limit`` hosts that have none: a host stored before the summaries existed
    gets one at its next snapshot, but an offline one would have none to show until it came back.
    Each in its own transaction, under the host's row lock as at ingest. The number filled."""
    filled = 0
    for host_id in Host.objects.filter(summary__isnull=True).values_list("pk", flat=True)[:limit]:
        with transaction.atomic():
            if Host.objects.select_for_update().filter(pk=host_id).exists():
                refresh_host_summary(host_id, now=now)
                filled += 1
    return filled


def gpu_models_contain(model: str) -> str:
    """The text a summary's ``gpu_models`` contains when the host has a GPU of ``model``."""
    return f"{GPU_MODELS_SEPARATOR}{model}{GPU_MODELS_SEPARATOR}"


def distinct_gpu_models(field: str) -> Aggregate:
    """The distinct ``gpu_models`` texts of the summaries aggregated over (``field``, the path to the
    column), as one JSON array: the fleet's models in the same pass as its other figures
    (``gpu_models_in`` reads it)."""
    return _JsonRows(field, distinct=True)


def gpu_models_in(texts: Iterable[str | None] | None) -> list[str]:
    """The models the summaries' ``gpu_models`` texts name (``distinct_gpu_models``), sorted, once each;
    a host without a summary aggregates as null (SQLite keeps it in the array)."""
    return sorted({model for text in texts or () if text
                   for model in text.split(GPU_MODELS_SEPARATOR) if model})
