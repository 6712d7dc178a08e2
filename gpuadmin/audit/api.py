"""Audit JSON API: GET /api/v1/audit/ (filtered, paginated) and GET /api/v1/audit/verify.

Same filters as the page (see filters.py); the viewer role, as on the page.
Non-ASCII is written as \\uXXXX, as in the rest of the API: names and target
summaries come from processes and must not reorder a terminal showing them.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuadmin.accounts.permissions import IsViewer
from gpuadmin.api_json import AsciiJSONRenderer
from gpuadmin.api_schema import BAD_INPUT, COMMON_ERRORS, query, ref
from gpuadmin.audit.anchors import check_newest
from gpuadmin.audit.export import event_as_dict
from gpuadmin.audit.filters import filtered_events
from gpuadmin.audit.models import Action
from gpuadmin.audit.sentences import described
from gpuadmin.audit.verified_prefix import verify_for_page


class AuditPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class AuditEventList(APIView):
    permission_classes = [IsViewer]
    renderer_classes = [AsciiJSONRenderer]

    @extend_schema(summary="Audit events, newest first, filtered as on the page", tags=["audit"], parameters=[
        query("host", "host name"), query("requester", "who filed"), query("approver", "who approved"),
        query("process_user", "owner of a target process"),
        query("action", "one action", enum=list(Action.values)),
        query("kill_request", "request number", kind=int), query("from", "first day (YYYY-MM-DD, UTC)"),
        query("to", "last day (YYYY-MM-DD, UTC)"), query("page", "page number", kind=int),
        query("page_size", "events per page (default 50, at most 500)", kind=int),
    ], responses={200: ref("AuditPage"), **BAD_INPUT, **COMMON_ERRORS})
    def get(self, request: Request) -> Response:
        form, events = filtered_events(request.query_params)
        if form.errors:
            return Response(
                {"detail": "Invalid filter values.", "errors": form.errors.get_json_data()}, status=400
            )
        paginator = AuditPagination()
        page = paginator.paginate_queryset(events, request, view=self) or []  # None: no pagination
        return paginator.get_paginated_response([event_as_dict(e) for e in described(page)])


class AuditVerify(APIView):
    """The page's check (``verified_prefix``): any viewer may ask, and each asking recomputes only the
    events since this process last checked (the whole chain at most every 10 minutes), so a loop of
    requests cannot keep the database busy re-hashing the log. ``manage.py verify_audit`` recomputes all."""

    permission_classes = [IsViewer]
    renderer_classes = [AsciiJSONRenderer]

    @extend_schema(summary="Verify the hash chain and its newest anchor", tags=["audit"],
                   responses={200: ref("AuditVerification"), **COMMON_ERRORS})
    def get(self, request: Request) -> Response:
        check = verify_for_page()
        anchored = check_newest()
        return Response({
            **check.result.as_dict(),
            "recomputed_after": check.recomputed_after,
            "full_verified_seconds_ago": round(check.full_verified_seconds_ago, 1),
            "anchor": {"ok": anchored.ok, "sequence": anchored.newest_sequence, "said": list(anchored.lines)},
        })
