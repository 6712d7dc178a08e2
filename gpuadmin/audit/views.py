"""Audit history pages: the event list and the same events grouped by kill request, with
filters, pages, CSV export, whether the chain verifies, and one event's raw fields.

One partial (audit/_results.html) holds either view and is the region both
inside the full page and alone for an HTMX filter, page or view change; the
chain is verified on full page loads only, not on every filter change, and then
only past the prefix this process verified before (gpuadmin/audit/verified_prefix.py
says what that guarantees).
"""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_GET

from gpuadmin.accounts.permissions import role_required
from gpuadmin.accounts.roles import Role
from gpuadmin.audit.chain import GENESIS_HASH
from gpuadmin.audit.export import csv_lines
from gpuadmin.audit.filters import filtered_events
from gpuadmin.audit.models import AuditEvent
from gpuadmin.audit.sentences import described
from gpuadmin.audit.stories import request_groups, stories_for
from gpuadmin.audit.verified_prefix import verify_for_page
from gpuadmin.htmx import HtmxHttpRequest, vary_on_htmx, wants_fragment

EVENTS_PER_PAGE = 50
REQUESTS_PER_PAGE = 20
CSV_CHUNK_SIZE = 2000

# ?view=...: the flat event list (the default) or the stories of kill requests.
EVENTS_VIEW = "events"
REQUESTS_VIEW = "requests"


@require_GET
@vary_on_htmx()
@role_required(Role.VIEWER)
def audit_log(request: HtmxHttpRequest) -> HttpResponseBase:
    if request.GET.get("format") == "csv":
        return _csv_response(request)
    form, events = filtered_events(request.GET)
    view = REQUESTS_VIEW if request.GET.get("view") == REQUESTS_VIEW else EVENTS_VIEW
    context: dict = {"form": form, "view": view, "fragment": wants_fragment(request)}
    if view == REQUESTS_VIEW:
        page = Paginator(request_groups(events), REQUESTS_PER_PAGE).get_page(request.GET.get("page"))
        context.update(page=page, stories=stories_for(list(page.object_list), events))
    else:
        page = Paginator(events, EVENTS_PER_PAGE).get_page(request.GET.get("page"))
        context.update(page=page, events=described(page.object_list))
    if context["fragment"]:
        return render(request, "audit/_results.html", context)
    check = verify_for_page()
    context["verify"] = check.result
    context["verify_check"] = check
    return render(request, "audit/audit_log.html", context)


@require_GET
@role_required(Role.VIEWER)
def audit_event(request: HttpRequest, sequence: int) -> HttpResponse:
    """One event's evidence: every hashed field as stored, its hash, and whether it recomputes."""
    event = get_object_or_404(AuditEvent, sequence=sequence)
    described([event])
    neighbours = dict(
        AuditEvent.objects.filter(sequence__in=(sequence - 1, sequence + 1)).values_list("sequence", "hash")
    )
    previous_hash = neighbours.get(sequence - 1, GENESIS_HASH if sequence == 1 else None)
    return render(request, "audit/event.html", {
        "event": event,
        "previous_sequence": sequence - 1 if sequence - 1 in neighbours else None,
        "next_sequence": sequence + 1 if sequence + 1 in neighbours else None,
        "links_to_previous": previous_hash is not None and previous_hash == event.previous_hash,
    })


@require_GET
@role_required(Role.VIEWER)
def audit_export_csv(request: HttpRequest) -> StreamingHttpResponse:
    return _csv_response(request)


def _csv_response(request: HttpRequest) -> StreamingHttpResponse:
    # Invalid filter values are ignored here as on the page; the export streams
    # so a long log never sits in memory.
    _form, events = filtered_events(request.GET)
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response = StreamingHttpResponse(
        csv_lines(events.iterator(chunk_size=CSV_CHUNK_SIZE), batch_size=CSV_CHUNK_SIZE),
        content_type="text/csv; charset=utf-8",
    )
    response["Content-Disposition"] = f'attachment; filename="gpuadmin-audit-{stamp}.csv"'
    return response
