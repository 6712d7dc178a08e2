"""The JSON API's answers: the serializer base every shape is written with, and what is not a serializer.

Each response shape is a read-only DRF serializer beside the code that answers
with it (``fleet/serializers.py``, ``kills/serializers.py``,
``audit/export.py``): the answer is the serializer's ``.data`` and
drf-spectacular generates the schema's component from the same class (its
name without "Serializer"), so the keys are written once. ``Shape`` closes
every such object (``additionalProperties: false``: a new key is a schema
change) and requires every field not declared ``required=False``.

Written here by hand, because no serializer builds them:

- ``Process`` and ``ProcessOwner``: the API passes processes through exactly
  as the probe sent them, so their shape is the snapshot's own definition
  (``gpuadmin/wire/snapshot.schema.json``, ``$defs/process`` and ``$defs/owner``),
  which already is their one home; ``ProcessAsSent`` and ``OwnerAsSent`` point there.
- ``Error``: refusals are built by DRF's exception handler and by
  ``KillError.as_dict`` with keys that vary by refusal.
- ``HostHistory``, ``ProcessHistory`` and ``KillMarker``: the chart series
  (``fleet/history/series.py``) are built as plain dicts, thousands of points per
  answer, where a serializer per point would cost more than the queries.
- request bodies (``body()``) and query parameters (``query()``).

``gpuadmin.web.api_docs.add_components`` (a drf-spectacular postprocessing
hook) adds those components. ``tests/test_api_schema.py`` validates real
answers of every endpoint against the served schema.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema_field
from rest_framework import serializers

from gpuadmin.text import utc_text

Schema = dict[str, Any]
SNAPSHOT_SCHEMA = Path(__file__).resolve().parent / "wire" / "snapshot.schema.json"


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def array_of(name: str) -> Schema:
    return {"type": "array", "items": ref(name)}


def _null(kind: str) -> Schema:
    return {"type": [kind, "null"]}


def _object(properties: dict[str, Schema]) -> Schema:
    """Every property required; nothing else allowed (a new key is a schema change), as ``Shape``."""
    return {"type": "object", "additionalProperties": False, "properties": properties,
            "required": list(properties)}


STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
BOOLEAN: Schema = {"type": "boolean"}
TIME: Schema = {"type": "string", "format": "date-time"}
TIME_OR_NULL: Schema = {"type": ["string", "null"], "format": "date-time"}


# An answer's shape: only ever serializes (``.data``), never given data to validate. Fields are
# left required rather than ``read_only`` so that an attribute a field cannot find is an error, not
# a key silently left out. (No docstring: a serializer's docstring is its component's description.)
class Shape(serializers.Serializer):
    pass


class _ClosedShape(OpenApiSerializerExtension):
    """Every ``Shape`` in the schema allows no key it does not name."""

    target_class = Shape
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> Schema:
        schema: Schema = auto_schema._map_basic_serializer(self.target, direction)
        return {**schema, "additionalProperties": False}


class UtcTime(serializers.DateTimeField):
    """A time as the API writes every time (``gpuadmin.text.utc_text``): UTC, ISO 8601, with a "Z"."""

    def __init__(self, *, timespec: str = "auto", **kwargs: Any) -> None:
        self.timespec = timespec
        super().__init__(**kwargs)

    def to_representation(self, value: datetime) -> str:
        return utc_text(value, timespec=self.timespec)


class TextOrNull(serializers.CharField):
    """A text column that stores "" for "not known": null in the answer."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_null=True, **kwargs)

    def to_representation(self, value: Any) -> str | None:  # type: ignore[override]  # null: not known
        return str(value) if value else None


@extend_schema_field(ref("Process"))
class ProcessAsSent(serializers.JSONField):
    """A process record exactly as the probe sent it (the snapshot schema's ``$defs/process``)."""


@extend_schema_field(ref("ProcessOwner"))
class OwnerAsSent(serializers.JSONField):
    """A process's owner as the probe sent it (``$defs/owner``)."""


class Given(serializers.ListSerializer):
    """A list the caller hands in through the context under the field's name; left out when not given."""

    def get_attribute(self, instance: Any) -> Any:
        value = self.context.get(self.field_name or "")
        if value is None:
            raise serializers.SkipField
        return value


def _process_components() -> dict[str, Schema]:
    """The snapshot's process and owner definitions, their references pointed at the components."""
    text = SNAPSHOT_SCHEMA.read_text().replace("#/$defs/owner", "#/components/schemas/ProcessOwner")
    definitions = json.loads(text)["$defs"]
    return {"Process": definitions["process"], "ProcessOwner": definitions["owner"]}


@cache
def components(statuses: tuple[str, ...]) -> dict[str, Schema]:
    """The components no serializer generates (see the module's docstring).

    ``statuses``: ``kills.states.Status``'s values, passed in, so this module imports no app.
    """
    return {
        **_process_components(),
        "KillMarker": _object({"id": INTEGER, "status": {"type": "string", "enum": list(statuses)},
                               "t": TIME, "ran_at": TIME_OR_NULL, "finished_at": TIME_OR_NULL,
                               "gpu_uuids": {"type": "array", "items": STRING}, "url": STRING}),
        "HostHistory": _object({
            "range": {"type": "string", "enum": ["1h", "24h", "7d", "30d"]}, "resolution_seconds": INTEGER,
            "aggregation": {"type": ["object", "null"]}, "from": TIME, "to": TIME,
            "gpus": {"type": "array", "items": _object({
                "uuid": STRING, "index": INTEGER, "name": STRING, "memory_total_bytes": _null("integer"),
                "points": {"type": "array", "items": _object({
                    "t": TIME, "memory_used_bytes": _null("integer"),
                    "memory_attributed_bytes": _null("integer"),
                    "utilization_percent": _null("number"), "temperature_celsius": _null("integer"),
                    "power_draw_milliwatts": _null("integer"),
                    "power_limit_milliwatts": _null("integer")})}})},
            "host": _object({"name": STRING, "points": {"type": "array", "items": _object({
                "t": TIME, "zombies": _null("integer"), "d_state": _null("integer"),
                "pids_in_use": _null("integer"), "pid_max": _null("integer")})}}),
            "kill_requests": array_of("KillMarker"),
        }),
        "ProcessHistory": _object({
            "host": STRING, "pid": INTEGER, "start_time_ticks": INTEGER, "boot_id": STRING,
            "ppid": _null("integer"), "uid": _null("integer"), "user": _null("string"), "name": STRING,
            "cmdline": {"type": "array", "items": STRING}, "container_id": _null("string"),
            "first_seen_at": TIME, "last_seen_at": TIME, "gone_at": TIME_OR_NULL, "state": STRING,
            "gpu_memory_bytes": _null("integer"), "peak_gpu_memory_bytes": _null("integer"),
            "points": {"type": "array", "items": _object({"t": TIME, "gpu_memory_bytes": _null("integer"),
                                                          "state": STRING})},
            "state_changes": {"type": "array", "items": _object({"t": TIME, "state": STRING})},
            "kill_requests": array_of("KillMarker"),
        }),
        "Error": {"type": "object", "required": ["detail"], "description": (
            "Any refusal. Kill request errors add `error` (the same text) and may add `field`, "
            "`parent_offer`, `reauth_url`; a bad filter adds `errors` or `allowed`."),
            "properties": {"detail": STRING, "error": STRING, "field": STRING, "reauth_url": STRING,
                           "parent_offer": ref("ParentOffer"), "errors": {"type": "object"},
                           "allowed": {"type": "array", "items": STRING}}},
    }


def error(description: str) -> OpenApiResponse:
    return OpenApiResponse(ref("Error"), description=description)


# The answers every endpoint may give besides its own (docs/api.md, "Errors").
COMMON_ERRORS = {
    401: error("no credentials, or an expired or unknown token"),
    403: error("the account has no role that allows this"),
}
NOT_FOUND = {404: error("no such host, process or request")}
BAD_INPUT = {400: error("invalid input; `field` names the parameter when there is one")}


def query(name: str, description: str, *, kind: type = str,
          enum: list[str] | None = None) -> OpenApiParameter:
    return OpenApiParameter(name, kind, OpenApiParameter.QUERY, description=description, enum=enum)


def body(properties: dict[str, Schema], *, required: tuple[str, ...] = ()) -> dict[str, Schema]:
    """A JSON request body: an object (extra keys are ignored by the API, so allowed here)."""
    return {"application/json": {"type": "object", "properties": properties, "required": list(required)}}
