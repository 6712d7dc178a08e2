"""Audit history page: filters, pages of 50, CSV export, and whether the chain verifies.

One partial (audit/_events.html) is the table both inside the full page and
alone for an HTMX filter or page change; the chain is verified on full page
loads only, not on every filter change, and then only past the prefix this
process verified before (gpuadmin/audit/verified_prefix.py says what that
guarantees).
"""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from gpuadmin.accounts.permissions import role_required
from gpuadmin.accounts.roles import Role
from gpuadmin.audit.export import csv_lines
from gpuadmin.audit.filters import filtered_events
from gpuadmin.audit.verified_prefix import verify_for_page
from gpuadmin.web.htmx import vary_on_htmx, wants_fragment

EVENTS_PER_PAGE = 50
CSV_CHUNK_SIZE = 2000


@require_GET
@vary_on_htmx()
@role_required(Role.VIEWER)
def audit_log(request: HttpRequest) -> HttpResponse:
    if request.GET.get("format") == "csv":
        return _csv_response(request)
    form, events = filtered_events(request.GET)
    page = Paginator(events, EVENTS_PER_PAGE).get_page(request.GET.get("page"))
    context = {"form": form, "page": page, "events": page.object_list}
    if wants_fragment(request):
        return render(request, "audit/_events.html", context)
    check = verify_for_page()
    context["verify"] = check.result
    context["verify_check"] = check
    return render(request, "audit/audit_log.html", context)


@require_GET
@role_required(Role.VIEWER)
def audit_export_csv(request: HttpRequest) -> HttpResponse:
    return _csv_response(request)


def _csv_response(request: HttpRequest) -> StreamingHttpResponse:
    # Invalid filter values are ignored here as on the page; the export streams
    # so a long log never sits in memory.
    _form, events = filtered_events(request.GET)
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response = StreamingHttpResponse(
        csv_lines(events.iterator(chunk_size=CSV_CHUNK_SIZE)), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="gpuadmin-audit-{stamp}.csv"'
    return response
