"""Read-side JSON API for hosts: /api/v1/hosts/ and /api/v1/hosts/<name>/.

Authentication and the viewer-role check come from settings.REST_FRAMEWORK
(token or session; IsViewer), so missing credentials answer 401 and a user
without a role 403, both as JSON. The shapes live in serializers.py, the
queries on the models' querysets.
"""

from __future__ import annotations

from rest_framework.decorators import api_view, renderer_classes
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from gpuadmin.api_json import AsciiJSONRenderer
from gpuadmin.fleet.models import Host, LatestSnapshot
from gpuadmin.fleet.serializers import host_detail_dict, host_summary_dict


@api_view(["GET"])
@renderer_classes([AsciiJSONRenderer])
def hosts(request: Request) -> Response:
    return Response([host_summary_dict(h) for h in Host.objects.for_listing()])


@api_view(["GET"])
@renderer_classes([AsciiJSONRenderer])
def host_detail(request: Request, name: str) -> Response:
    host = Host.objects.for_listing().named(name)
    if host is None:
        raise NotFound(f"No host named {name!r} has sent a snapshot.")
    document = LatestSnapshot.objects.document_for(host)
    return Response(host_detail_dict(host, document, host.findings.open().most_severe_first()))
