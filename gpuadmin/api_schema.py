"""The JSON API's response shapes, once, as the OpenAPI 3.1 schema at /api/v1/schema/ describes them.

The API builds its answers with plain functions (``fleet/serializers.py``,
``kills/serializers.py``, ``audit/export.py``), not DRF serializers, so
drf-spectacular cannot read their shapes: they are written here as JSON Schema
(OpenAPI 3.1 is JSON Schema 2020-12), named components the views refer to with
``ref()``. A process is the snapshot's own definition
(``gpuadmin/wire/snapshot.schema.json``, ``$defs/process``): the API passes
processes through as the probe sent them. ``gpuadmin.web.api_docs.add_components``
(a drf-spectacular postprocessing hook) puts them into the schema, with the apps'
word lists (this module imports no app). ``tests/test_api_schema.py`` validates
real answers of every endpoint against it, so this file, the functions and
docs/api.md cannot drift apart unnoticed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse

Schema = dict[str, Any]
SNAPSHOT_SCHEMA = Path(__file__).resolve().parent / "wire" / "snapshot.schema.json"


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def array_of(name: str) -> Schema:
    return {"type": "array", "items": ref(name)}


def _null(kind: str | list[str]) -> Schema:
    return {"type": [*([kind] if isinstance(kind, str) else kind), "null"]}


def _object(properties: dict[str, Schema], *, optional: tuple[str, ...] = ()) -> Schema:
    """Every property required unless named optional; nothing else allowed (a new key is a schema change)."""
    return {"type": "object", "additionalProperties": False, "properties": properties,
            "required": [name for name in properties if name not in optional]}


STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
BOOLEAN: Schema = {"type": "boolean"}
TIME: Schema = {"type": "string", "format": "date-time"}
TIME_OR_NULL: Schema = {"type": ["string", "null"], "format": "date-time"}
FREE_OBJECT: Schema = {"type": "object"}


def _choices(*values: str) -> Schema:
    return {"type": "string", "enum": list(values)}


def _process_components() -> dict[str, Schema]:
    """The snapshot's process and owner definitions, their references pointed at the components."""
    text = SNAPSHOT_SCHEMA.read_text().replace("#/$defs/owner", "#/components/schemas/ProcessOwner")
    definitions = json.loads(text)["$defs"]
    return {"Process": definitions["process"], "ProcessOwner": definitions["owner"]}


@dataclass(frozen=True)
class Words:
    """The apps' closed word lists the shapes name: passed in, so this module imports no app."""

    statuses: tuple[str, ...]  # kills.states.Status
    finding_kinds: tuple[str, ...]  # fleet.models.Finding.Kind
    finding_severities: tuple[str, ...]  # fleet.models.Finding.Severity
    actions: tuple[str, ...]  # audit.models.Action


@cache
def components(words: Words) -> dict[str, Schema]:
    gpu = {
        "index": INTEGER, "uuid": STRING, "name": STRING, "memory_total_bytes": _null("integer"),
        "memory_used_bytes": _null("integer"), "memory_attributed_bytes": _null("integer"),
        "memory_unattributed_bytes": _null("integer"), "utilization_percent": _null("integer"),
    }
    host_summary = {
        "name": STRING, "online": BOOLEAN, "first_seen_at": TIME_OR_NULL, "last_seen_at": TIME_OR_NULL,
        "last_snapshot_taken_at": TIME_OR_NULL, "boot_id": _null("string"), "kernel": _null("string"),
        "driver_version": _null("string"), "pid_max": _null("integer"), "pids_in_use": _null("integer"),
        "gpus": array_of("Gpu"),
        "counts": _object({"processes": _null("integer"), "zombies": _null("integer"),
                           "gpu_processes": _null("integer")}),
        "open_findings_count": INTEGER,
        "open_findings_by_severity": _object({s: INTEGER for s in words.finding_severities}),
        "gpu_backend": _object({"name": _null("string"), "available": _null("boolean"),
                                "reason": _null("string")}),
        "last_error": _null("string"), "last_error_at": TIME_OR_NULL,
    }
    kill_marker = _object({"id": INTEGER, "status": _choices(*words.statuses), "t": TIME,
                           "finished_at": TIME_OR_NULL, "url": STRING})
    workload = {"oneOf": [_object({"key": STRING, "label": STRING}), {"type": "null"}]}
    target = {
        "pid": INTEGER, "start_time_ticks": INTEGER, "boot_id": STRING, "ppid": _null("integer"),
        "uid": _null("integer"), "user": _null("string"), "name": STRING,
        "cmdline": {"type": "array", "items": STRING}, "cmdline_truncated": BOOLEAN, "cmdline_sha256": STRING,
        "state": STRING, "gpu_memory_bytes": {"type": "object", "additionalProperties": _null("integer")},
        "is_descendant": BOOLEAN, "owner": {"oneOf": [ref("ProcessOwner"), {"type": "null"}]},
        "outcome": _null("string"), "outcome_detail": STRING, "last_signal": _null("string"),
    }
    kill_request = {
        "id": INTEGER, "status": _choices(*words.statuses), "final": BOOLEAN, "host": STRING,
        "requested_by": STRING, "requested_at": TIME, "reason": STRING, "plan": {"type": "array"},
        "include_descendants": BOOLEAN, "workload": workload, "snapshot_taken_at": TIME_OR_NULL,
        "boot_id": STRING, "warnings": {"type": "array", "items": STRING},
        "excluded_targets": {"type": "array"}, "pending_expires_at": TIME_OR_NULL,
        "approved_by": _null("string"), "self_approved": BOOLEAN, "sigkill_only_allowed": BOOLEAN,
        "closed_by": _null("string"), "decided_at": TIME_OR_NULL, "decision_reason": STRING,
        "start_deadline": TIME_OR_NULL, "dispatched_at": TIME_OR_NULL, "started_at": TIME_OR_NULL,
        "finished_at": TIME_OR_NULL, "result_detail": STRING,
        "memory": _object({"expected_release_bytes": _null("integer"), "released_bytes": _null("integer"),
                           "confirmed_at": TIME_OR_NULL}),
        "targets": array_of("KillTarget"),
        # Only on one request (detail, filing, decisions), not in the list:
        "steps": array_of("KillStep"),
        "targets_now": {"type": "array", "items": _object({
            "pid": INTEGER, "gone": BOOLEAN, "will_be_refused": BOOLEAN,
            "gpu_memory_now_bytes": _null("integer"), "changes": {"type": "array"}})},
    }
    return {
        **_process_components(),
        "Error": {"type": "object", "required": ["detail"], "description": (
            "Any refusal. Kill request errors add `error` (the same text) and may add `field`, "
            "`parent_offer`, `reauth_url`; a bad filter adds `errors` or `allowed`."),
            "properties": {"detail": STRING, "error": STRING, "field": STRING, "reauth_url": STRING,
                           "parent_offer": ref("ParentOffer"), "errors": FREE_OBJECT,
                           "allowed": {"type": "array", "items": STRING}}},
        "Gpu": _object(gpu),
        "HostSummary": _object(host_summary),
        "Finding": _object({"kind": _choices(*words.finding_kinds),
                            "severity": _choices(*words.finding_severities), "title": STRING,
                            "remedy": STRING,
                            "first_seen_at": TIME, "last_seen_at": TIME, "details": FREE_OBJECT}),
        "ZombieTree": _object({"parent_pid": INTEGER, "parent": {"oneOf": [ref("Process"), {"type": "null"}]},
                               "zombie_count": INTEGER, "zombies": array_of("Process")}),
        "HostDetail": _object({
            **host_summary, "snapshot_taken_at": TIME_OR_NULL, "processes": array_of("Process"),
            "zombie_trees": array_of("ZombieTree"), "orphans": array_of("Process"),
            "findings": array_of("Finding"),
        }),
        "KillMarker": kill_marker,
        "HostHistory": _object({
            "range": _choices("1h", "24h", "7d", "30d"), "resolution_seconds": INTEGER,
            "aggregation": {"type": ["object", "null"]}, "from": TIME, "to": TIME,
            "gpus": {"type": "array", "items": _object({
                "uuid": STRING, "index": INTEGER, "name": STRING, "memory_total_bytes": _null("integer"),
                "points": {"type": "array", "items": _object({
                    "t": TIME, "memory_used_bytes": _null("integer"),
                    "memory_attributed_bytes": _null("integer"),
                    "utilization_percent": _null("number")})}})},
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
        "KillTarget": _object(target),
        "KillStep": _object({"seq": INTEGER, "at": TIME_OR_NULL, "received_at": TIME_OR_NULL, "event": STRING,
                             "pid": _null("integer"), "signal": _null("string"), "method": _null("string"),
                             "result": _null("string"), "detail": STRING}),
        "KillRequest": _object(kill_request, optional=("steps", "targets_now")),
        "ParentOffer": _object({"pid": INTEGER, "start_time_ticks": _null("integer"), "name": STRING,
                                "user": _null("string"), "command_line": STRING, "state": STRING,
                                "zombie_count": INTEGER, "refused_because": _null("string")}),
        "KillPreview": _object({
            "host": STRING, "snapshot_taken_at": TIME_OR_NULL, "boot_id": _null("string"), "ok": BOOLEAN,
            "refusal": _null("string"), "parent_offer": {"oneOf": [ref("ParentOffer"), {"type": "null"}]},
            "warnings": {"type": "array", "items": STRING}, "workload": workload,
            "targets": {"type": "array", "items": _object({
                "pid": INTEGER, "start_time_ticks": INTEGER, "ppid": _null("integer"),
                "uid": _null("integer"), "user": _null("string"), "name": STRING, "state": STRING,
                "cmdline": {"type": "array", "items": STRING},
                "gpu_memory_bytes": {"type": "object", "additionalProperties": _null("integer")},
                "owner": {"oneOf": [ref("ProcessOwner"), {"type": "null"}]}, "is_descendant": BOOLEAN})},
            "excluded": {"type": "array", "items": _object({"pid": INTEGER, "name": STRING,
                                                             "user": _null("string"), "why": STRING})},
        }),
        "AuditEvent": _object({
            "sequence": INTEGER, "created_at": TIME, "action": _choices(*words.actions),
            "actor": STRING, "actor_id": _null("integer"), "kill_request_id": _null("integer"),
            "host": STRING, "requester": STRING, "approver": STRING,
            "process_users": {"type": "array", "items": STRING}, "targets_summary": STRING,
            "details": FREE_OBJECT, "previous_hash": STRING, "hash": STRING, "sentence": STRING,
        }),
        "AuditPage": _object({"count": INTEGER, "next": _null("string"), "previous": _null("string"),
                              "results": array_of("AuditEvent")}),
        "AuditVerification": _object({
            "ok": BOOLEAN, "events": INTEGER, "first_bad_sequence": _null("integer"),
            "problem": _null("string"), "head_sequence": _null("integer"), "head_hash": _null("string"),
            "recomputed_after": INTEGER, "full_verified_seconds_ago": {"type": "number"},
            "anchor": _object({"ok": BOOLEAN, "sequence": _null("integer"),
                               "said": {"type": "array", "items": STRING}})}),
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
