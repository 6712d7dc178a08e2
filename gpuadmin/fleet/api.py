"""Read-side JSON API for hosts: /api/v1/hosts/, /api/v1/hosts/<name>/, its history and its processes.

Authentication and the viewer-role check come from settings.REST_FRAMEWORK
(token or session; IsViewer), so missing credentials answer 401 and a user
without a role 403, both as JSON. The shapes live in serializers.py, the
queries on the models' querysets.
"""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import api_view, renderer_classes
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from gpuadmin.api_json import AsciiJSONRenderer
from gpuadmin.api_schema import BAD_INPUT, COMMON_ERRORS, NOT_FOUND, query, ref
from gpuadmin.fleet.history import series
from gpuadmin.fleet.models import Host, LatestSnapshot, ProcessLife
from gpuadmin.fleet.serializers import HostDetailSerializer, HostSummarySerializer


def _host(name: str) -> Host:
    host = Host.objects.named(name)
    if host is None:
        raise NotFound(f"No host named {name!r} has sent a snapshot.")
    return host


@extend_schema(summary="Every host of the fleet", tags=["fleet"], operation_id="hosts_list",
               responses={200: HostSummarySerializer(many=True), **COMMON_ERRORS})
@api_view(["GET"])
@renderer_classes([AsciiJSONRenderer])
def hosts(request: Request) -> Response:
    return Response(HostSummarySerializer(Host.objects.for_listing(), many=True).data)


@extend_schema(summary="One host: GPUs, the processes that matter, open findings", tags=["fleet"],
               responses={200: HostDetailSerializer, **COMMON_ERRORS, **NOT_FOUND})
@api_view(["GET"])
@renderer_classes([AsciiJSONRenderer])
def host_detail(request: Request, name: str) -> Response:
    host = Host.objects.for_listing().named(name)
    if host is None:
        raise NotFound(f"No host named {name!r} has sent a snapshot.")
    context = {"document": LatestSnapshot.objects.document_for(host),
               "findings": host.findings.open().most_severe_first()}
    return Response(HostDetailSerializer(host, context=context).data)


@extend_schema(summary="A host's history for the charts", tags=["fleet"],
               parameters=[query("range", "how far back (default 1h)", enum=list(series.RANGES))],
               responses={200: ref("HostHistory"), **BAD_INPUT, **COMMON_ERRORS, **NOT_FOUND})
@api_view(["GET"])
@renderer_classes([AsciiJSONRenderer])
def host_history(request: Request, name: str) -> Response:
    host = _host(name)
    try:
        chart_range = series.parse_range(request.query_params.get("range"))
    except series.UnknownRange as error:
        return Response({"detail": str(error), "allowed": error.allowed}, status=status.HTTP_400_BAD_REQUEST)
    return Response(series.host_history(host, chart_range, timezone.now()))


@extend_schema(summary="One process's recorded life", tags=["fleet"],
               responses={200: ref("ProcessHistory"), **COMMON_ERRORS, **NOT_FOUND})
@api_view(["GET"])
@renderer_classes([AsciiJSONRenderer])
def process_detail(request: Request, name: str, pid: int, start_time_ticks: int) -> Response:
    host = _host(name)
    life = ProcessLife.objects.identified(host, pid, start_time_ticks)
    if life is None:
        raise NotFound(f"{name} has no recorded process {pid} started at tick {start_time_ticks}.")
    return Response(series.process_history(life))
