"""``GET /api/v1/usage/?from=&to=&by=&sort=``: the usage page's table as JSON (``queries.usage_table``).

Authentication and the viewer-role check come from settings.REST_FRAMEWORK, as for the fleet's API.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import api_view, renderer_classes
from rest_framework.request import Request
from rest_framework.response import Response

from gpuadmin.api_json import AsciiJSONRenderer
from gpuadmin.api_schema import BAD_INPUT, COMMON_ERRORS, Shape, query
from gpuadmin.usage.queries import BadQuery, Grouping, Row, Sort, parse_choice, parse_period, usage_table


class UsageRowSerializer(Shape):
    key = serializers.CharField(
        help_text="What the row groups by: a user, person:<id>, an owner, a host, a model.")
    label = serializers.CharField()  # type: ignore[assignment]
    held_gpu_hours = serializers.FloatField(
        source="total.held_gpu_hours", help_text="Time a process held a device (memory above the threshold).")
    held_gib_hours = serializers.FloatField(source="total.held_gib_hours")
    busy_gpu_hours = serializers.FloatField(
        source="total.busy_gpu_hours",
        help_text="Each process's own utilisation where NVML gave it, else an estimate: the device's "
                  "utilisation its measured holders left, shared equally among the others.")
    busy_estimated_gpu_hours = serializers.FloatField(
        source="total.busy_estimated_gpu_hours", help_text="The part of busy_gpu_hours that is the estimate.")
    idle_gpu_hours = serializers.FloatField(source="total.idle_gpu_hours",
                                            help_text="Held while the device computed nothing (0 %).")
    unmeasured_gpu_hours = serializers.FloatField(
        source="total.unmeasured_gpu_hours", help_text="Held on a device that gave no utilisation (MIG).")
    held_gpu_hours_per_day = serializers.SerializerMethodField()

    def get_held_gpu_hours_per_day(self, row: Row) -> list[float]:
        days = self.context["days"]
        return [row.per_day[d].held_gpu_hours if d in row.per_day else 0.0 for d in days]


class UsageSerializer(Shape):
    start = serializers.DateField(help_text="First UTC day, included.")
    end = serializers.DateField(help_text="Last UTC day, included.")
    by = serializers.ChoiceField(choices=Grouping.choices)
    sort = serializers.ChoiceField(choices=Sort.choices)
    busy_is_estimate = serializers.BooleanField(
        help_text="True when every row's busy time is the estimate (no process gave its own utilisation).")
    days = serializers.ListField(child=serializers.DateField())
    rows = UsageRowSerializer(many=True)


def answer(params: Any) -> dict[str, Any]:
    """The API's answer for query parameters ``params``; raises ``BadQuery``."""
    period = parse_period(params.get("from"), params.get("to"))
    by = parse_choice(Grouping, params.get("by"), Grouping.USER, "by")
    sort = parse_choice(Sort, params.get("sort"), Sort.HELD, "sort")
    table = usage_table(period, by, sort)
    data = {"start": period.start, "end": period.end, "by": by, "sort": sort,
            "busy_is_estimate": all(row.total.busy_is_estimate for row in table.rows),
            "days": period.days, "rows": table.rows}
    return UsageSerializer(data, context={"days": period.days}).data


@extend_schema(
    summary="GPU usage over a period, by user, person, owner, host or GPU model", tags=["usage"],
    operation_id="usage",
    parameters=[query("from", "first UTC day, YYYY-MM-DD (default: 6 days before to)"),
                query("to", "last UTC day, YYYY-MM-DD (default: today)"),
                query("by", "grouping (default user)", enum=list(Grouping.values)),
                query("sort", "order of the rows (default held)", enum=list(Sort.values))],
    responses={200: UsageSerializer, **BAD_INPUT, **COMMON_ERRORS},
)
@api_view(["GET"])
@renderer_classes([AsciiJSONRenderer])
def usage(request: Request) -> Response:
    try:
        return Response(answer(request.query_params))
    except BadQuery as error:
        return Response({"detail": str(error)}, status=status.HTTP_400_BAD_REQUEST)
