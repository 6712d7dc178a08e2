"""One small row per host (``HostSummary``) that the fleet page, its filters and its attention strip read.

``refresh_host_summary`` is the one writer: it recomputes a host's summary from what is stored (its
present GPUs, its live process lives, its open findings) in two reads and one upsert, statements
compiled once. Everything that changes those calls it in the same transaction:

- a full snapshot (``fleet.intake.ingest.ingest_document``) and a snapshot update
  (``fleet.intake.updates``): GPU figures, orphans, the biggest holder, findings drawn;
- findings opened or closed outside ingest: the kills app's (``kills.services.findings``) and the
  rejected-messages finding (``fleet.intake.trust``).

Recomputed, not patched: whichever path changed something, the summary says what the rows say, and a
summary that went missing (a host stored before the summaries existed) is whole again at its next
snapshot. Online or offline is not stored: it depends on the clock, and is read from ``last_seen_at``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Case, Count, IntegerField, OuterRef, QuerySet, Subquery, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from gpuadmin.fleet.models import Finding, Gpu, Host, HostSummary, ProcessLife
from gpuadmin.fleet.storage.statements import Param, PreparedQuery, RowInsert

# A GPU counts as free when this little memory is used on it (the driver's own share fits under it).
FREE_GPU_MAX_USED_BYTES = 1024**3
# Around each model in HostSummary.gpu_models: no model name holds a newline.
GPU_MODELS_SEPARATOR = "\n"

_PRESENT_GPUS = PreparedQuery(
    Gpu.objects.filter(host=Param(Gpu, "host"), present=True).order_by("index").values_list(
        "index", "name", "memory_total_bytes", "memory_used_bytes", "memory_attributed_bytes",
        "utilization_percent")
)


def most_severe_open_finding_of_outer_host() -> QuerySet[Finding]:
    """The outer query's host's open findings, most severe first, then oldest (``Severity.rank``)."""
    rank = Case(*[When(severity=severity.value, then=Value(severity.rank)) for severity in Finding.Severity],
                output_field=IntegerField())
    return (Finding.objects.open().filter(host=OuterRef("pk")).annotate(rank=rank)
            .order_by("rank", "first_seen_at", "kind", "key"))


def _count_of_outer_host(queryset: QuerySet[Any]) -> Coalesce:
    """How many rows of ``queryset`` (filtered on the outer query's host) there are, as a subquery."""
    counted = queryset.order_by().values("host").annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted), 0)


def _host_figures() -> PreparedQuery:
    worst = most_severe_open_finding_of_outer_host()
    live = ProcessLife.objects.filter(host=OuterRef("pk"), gone_at__isnull=True)
    open_findings = Finding.objects.open().filter(host=OuterRef("pk"))
    return PreparedQuery(
        Host.objects.filter(pk=Param(Host, "id")).order_by().annotate(
            orphans=_count_of_outer_host(live.filter(was_orphaned=True)),
            top_holder=Subquery(live.filter(last_gpu_memory_bytes__gt=0)
                                .order_by("-last_gpu_memory_bytes", "pid").values("user")[:1]),
            worst_rank=Subquery(worst.values("rank")[:1]),
            worst_severity=Subquery(worst.values("severity")[:1]),
            worst_title=Subquery(worst.values("title")[:1]),
            **{f"findings_{severity.value}":
               _count_of_outer_host(open_findings.filter(severity=severity.value))
               for severity in Finding.Severity},
        ).values_list("orphans", "top_holder", "worst_rank", "worst_severity", "worst_title",
                      *(f"findings_{severity.value}" for severity in Finding.Severity))
    )


_HOST_FIGURES = _host_figures()
_SUMMARY_FIELDS = ["gpus", "gpu_count", "free_gpu_count", "memory_total_bytes", "memory_used_bytes",
                   "memory_unattributed_bytes", "gpu_models", "orphan_count", "top_holder_user",
                   "worst_finding_rank", "worst_finding_severity", "worst_finding_title",
                   *(f"findings_{severity.value}_count" for severity in Finding.Severity), "updated_at"]
_SUMMARY_UPSERT = RowInsert(HostSummary, ["host", *_SUMMARY_FIELDS], conflict=["host"],
                            update=_SUMMARY_FIELDS)


def refresh_host_summary(host_id: int, *, now: datetime | None = None) -> None:
    """Recompute the host's ``HostSummary`` from its stored GPUs, process lives and open findings."""
    gpus = _PRESENT_GPUS.start(host=host_id)
    figures = _HOST_FIGURES.start(id=host_id)
    present = gpus.rows()
    rows = figures.rows()
    if not rows:
        return  # the host was forgotten meanwhile
    orphans, top_holder, worst_rank, worst_severity, worst_title, *counts = rows[0]
    models = sorted({name for _, name, *_ in present if name})
    packed = [[index, total, used, attributed, busy] for index, _, total, used, attributed, busy in present]
    free = sum(1 for *_, used, _, _ in present if (used or 0) <= FREE_GPU_MAX_USED_BYTES)
    gpu_models = "".join(f"{GPU_MODELS_SEPARATOR}{model}" for model in models)
    gpu_models += GPU_MODELS_SEPARATOR if models else ""
    _SUMMARY_UPSERT.run([(
        host_id, packed, len(present), free,
        sum(total or 0 for _, _, total, *_ in present), sum(used or 0 for *_, used, _, _ in present),
        # Gpu.memory_unattributed_bytes: used - attributed, never below 0.
        sum(max((used or 0) - (attributed or 0), 0) for *_, used, attributed, _ in present),
        gpu_models, orphans, top_holder or "",
        len(Finding.Severity) if worst_rank is None else worst_rank, worst_severity or "", worst_title or "",
        *counts, now or timezone.now(),
    )], returning=False)


def gpu_models_contain(model: str) -> str:
    """The text a summary's ``gpu_models`` contains when the host has a GPU of ``model``."""
    return f"{GPU_MODELS_SEPARATOR}{model}{GPU_MODELS_SEPARATOR}"


def gpu_models_of(text: str) -> list[str]:
    """The models a summary's ``gpu_models`` names."""
    return [model for model in text.split(GPU_MODELS_SEPARATOR) if model]
