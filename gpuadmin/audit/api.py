"""Audit JSON API: GET /api/v1/audit/ (filtered, paginated) and GET /api/v1/audit/verify.

Same filters as the page (see filters.py); the viewer role, as on the page.
Non-ASCII is written as \\uXXXX, as in the rest of the API: names and target
summaries come from processes and must not reorder a terminal showing them.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuadmin.accounts.permissions import IsViewer
from gpuadmin.api_json import AsciiJSONRenderer
from gpuadmin.api_schema import BAD_INPUT, COMMON_ERRORS, Shape, query
from gpuadmin.audit.anchors import check_newest
from gpuadmin.audit.export import AuditEventSerializer
from gpuadmin.audit.filters import filtered_events
from gpuadmin.audit.models import Action
from gpuadmin.audit.sentences import described
from gpuadmin.audit.verified_prefix import verify_for_page


class AuditPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        """DRF's page, every key required and none other allowed, as the API's other shapes.

        DRF writes a null link as OpenAPI 3.0 does (``nullable``), which 3.1 (JSON Schema) ignores.
        """
        page = super().get_paginated_response_schema(schema)
        properties = {
            name: ({**{k: v for k, v in prop.items() if k != "nullable"}, "type": [prop["type"], "null"]}
                   if prop.get("nullable") else prop)
            for name, prop in page["properties"].items()
        }
        return {**page, "properties": properties, "required": list(properties), "additionalProperties": False}


class AnchorCheckSerializer(Shape):
    """The newest anchor against the table (``anchors.AnchorCheck``)."""

    ok = serializers.BooleanField()
    sequence = serializers.IntegerField(allow_null=True, source="newest_sequence")
    said = serializers.ListField(child=serializers.CharField(), source="lines")


class AuditVerificationSerializer(Shape):
    """The chain's check as the page shows it (``verified_prefix.PageCheck``) and its newest anchor."""

    ok = serializers.BooleanField(source="check.result.ok")
    events = serializers.IntegerField(source="check.result.events")
    first_bad_sequence = serializers.IntegerField(allow_null=True, source="check.result.first_bad_sequence")
    problem = serializers.CharField(allow_null=True, source="check.result.problem")
    head_sequence = serializers.IntegerField(allow_null=True, source="check.result.head_sequence")
    head_hash = serializers.CharField(allow_null=True, source="check.result.head_hash")
    recomputed_after = serializers.IntegerField(source="check.recomputed_after")
    full_verified_seconds_ago = serializers.SerializerMethodField()
    anchor = AnchorCheckSerializer()

    def get_full_verified_seconds_ago(self, verification: dict[str, Any]) -> float:
        return round(verification["check"].full_verified_seconds_ago, 1)


class AuditEventList(APIView):
    permission_classes = [IsViewer]
    renderer_classes = [AsciiJSONRenderer]
    pagination_class = AuditPagination  # what the schema's page (PaginatedAuditEventList) is read from

    @extend_schema(summary="Audit events, newest first, filtered as on the page", tags=["audit"], parameters=[
        query("host", "host name"), query("requester", "who filed"), query("approver", "who approved"),
        query("process_user", "owner of a target process"),
        query("action", "one action", enum=list(Action.values)),
        query("kill_request", "request number", kind=int), query("from", "first day (YYYY-MM-DD, UTC)"),
        query("to", "last day (YYYY-MM-DD, UTC)"), query("page", "page number", kind=int),
        query("page_size", "events per page (default 50, at most 500)", kind=int),
    ], responses={200: AuditEventSerializer(many=True), **BAD_INPUT, **COMMON_ERRORS})
    def get(self, request: Request) -> Response:
        form, events = filtered_events(request.query_params)
        if form.errors:
            return Response(
                {"detail": "Invalid filter values.", "errors": form.errors.get_json_data()}, status=400
            )
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(events, request, view=self) or []  # None: no pagination
        return paginator.get_paginated_response(AuditEventSerializer(described(page), many=True).data)


class AuditVerify(APIView):
    """The page's check (``verified_prefix``): any viewer may ask, and each asking recomputes only the
    events since this process last checked (the whole chain at most every 10 minutes), so a loop of
    requests cannot keep the database busy re-hashing the log. ``manage.py verify_audit`` recomputes all."""

    permission_classes = [IsViewer]
    renderer_classes = [AsciiJSONRenderer]

    @extend_schema(summary="Verify the hash chain and its newest anchor", tags=["audit"],
                   responses={200: AuditVerificationSerializer, **COMMON_ERRORS})
    def get(self, request: Request) -> Response:
        verification = {"check": verify_for_page(), "anchor": check_newest()}
        return Response(AuditVerificationSerializer(verification).data)
