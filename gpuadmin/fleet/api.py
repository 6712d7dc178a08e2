"""Read-side JSON API for hosts: /api/v1/hosts/ and /api/v1/hosts/<name>/.

Authentication and the viewer-role check come from settings.REST_FRAMEWORK
(token or session; IsViewer), so missing credentials answer 401 and a user
without a role 403, both as JSON. The shapes live in serializers.py.
"""

from __future__ import annotations

from rest_framework.decorators import api_view, renderer_classes
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from gpuadmin.api_json import AsciiJSONRenderer
from gpuadmin.fleet.serializers import (
    host_detail_dict,
    host_for_listing,
    host_summary_dict,
    hosts_for_listing,
    latest_document,
    open_findings,
)


@api_view(["GET"])
@renderer_classes([AsciiJSONRenderer])
def hosts(request: Request) -> Response:
    return Response([host_summary_dict(h) for h in hosts_for_listing()])


@api_view(["GET"])
@renderer_classes([AsciiJSONRenderer])
def host_detail(request: Request, name: str) -> Response:
    host = host_for_listing(name)
    if host is None:
        raise NotFound(f"No host named {name!r} has sent a snapshot.")
    return Response(host_detail_dict(host, latest_document(host), open_findings(host)))
