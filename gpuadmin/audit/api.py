"""Audit JSON API: GET /api/v1/audit/ (filtered, paginated) and GET /api/v1/audit/verify.

Same filters as the page (see filters.py); the viewer role, as on the page.
Non-ASCII is written as \\uXXXX, as in the rest of the API: names and target
summaries come from processes and must not reorder a terminal showing them.
"""

from __future__ import annotations

from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuadmin.accounts.permissions import IsViewer
from gpuadmin.api_json import AsciiJSONRenderer
from gpuadmin.audit.export import event_as_dict
from gpuadmin.audit.filters import filtered_events
from gpuadmin.audit.models import AuditEvent
from gpuadmin.audit.sentences import described


class AuditPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class AuditEventList(APIView):
    permission_classes = [IsViewer]
    renderer_classes = [AsciiJSONRenderer]

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
    permission_classes = [IsViewer]
    renderer_classes = [AsciiJSONRenderer]

    def get(self, request: Request) -> Response:
        return Response(AuditEvent.objects.verify().as_dict())
