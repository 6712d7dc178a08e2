"""Audit events as data: a serializer for the API (and its schema), rows for the CSV export.

Both keep every raw field and add the event's sentence (``sentences.sentence_text``):
the fields are the evidence, the sentence is for reading.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from rest_framework import serializers

from gpuadmin.api_schema import Shape, UtcTime
from gpuadmin.audit.models import Action, AuditEvent
from gpuadmin.audit.sentences import describe, described, sentence_text
from gpuadmin.text import utc_text

CSV_COLUMNS = (
    "sequence",
    "created_at",
    "action",
    "actor",
    "kill_request_id",
    "host",
    "requester",
    "approver",
    "process_users",
    "targets_summary",
    "details",
    "previous_hash",
    "hash",
    # Last, so that scripts reading the columns by position before it was added still work.
    "sentence",
)

# A spreadsheet runs a cell starting with one of these as a formula
# ("=HYPERLINK(...)"), and host or process names are chosen by whoever runs
# the process. A leading quote makes it text again.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _sentence(event: AuditEvent) -> str:
    return sentence_text(getattr(event, "sentence", None) or describe(event))


class AuditEventSerializer(Shape):
    """One event: every raw field (the evidence) and its sentence (for reading)."""

    # Pass events through ``sentences.described`` first, so their sentences share one context.

    sequence = serializers.IntegerField()
    # Always six fractional digits, as hashed (the rest of the API writes them only when present).
    created_at = UtcTime(timespec="microseconds")
    action = serializers.ChoiceField(Action.choices)
    actor = serializers.CharField(source="actor_name")
    actor_id = serializers.IntegerField(allow_null=True)
    kill_request_id = serializers.IntegerField(allow_null=True)
    host = serializers.CharField(source="host_name")
    requester = serializers.CharField(source="requester_name")
    approver = serializers.CharField(source="approver_name")
    process_users = serializers.ListField(child=serializers.CharField(), source="process_user_list")
    targets_summary = serializers.CharField()
    details = serializers.DictField()
    previous_hash = serializers.CharField()
    hash = serializers.CharField()
    sentence = serializers.SerializerMethodField()

    def get_sentence(self, event: AuditEvent) -> str:
        return _sentence(event)


def csv_safe(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def _csv_row(event: AuditEvent) -> list[Any]:
    row = [
        event.sequence,
        utc_text(event.created_at, timespec="microseconds"),
        event.action,
        event.actor_name,
        event.kill_request_id if event.kill_request_id is not None else "",
        event.host_name,
        event.requester_name,
        event.approver_name,
        event.process_users,
        event.targets_summary,
        event.details_json,
        event.previous_hash,
        event.hash,
        _sentence(event),
    ]
    return [csv_safe(cell) for cell in row]


class _Echo:
    """A file-like object whose write() returns the line, for streaming csv.writer output."""

    def write(self, value: str) -> str:
        return value


def csv_lines(events: Iterable[AuditEvent], *, batch_size: int = 2000) -> Iterator[str]:
    """The CSV text, line by line; sentences share a context per batch of ``batch_size`` events."""
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    iterator = iter(events)
    while batch := list(islice(iterator, batch_size)):
        for event in described(batch):
            yield writer.writerow(_csv_row(event))
