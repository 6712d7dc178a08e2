"""Audit events as plain data: one dict shape for the API, rows for the CSV export.

Both keep every raw field and add the event's sentence (``sentences.sentence_text``):
the fields are the evidence, the sentence is for reading.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from gpuadmin.audit.models import AuditEvent
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


def event_as_dict(event: AuditEvent) -> dict[str, Any]:
    """The API's shape; pass events through ``sentences.described`` first to share one context."""
    return {
        "sequence": event.sequence,
        # Always six fractional digits, as hashed (the rest of the API writes them only when present).
        "created_at": utc_text(event.created_at, timespec="microseconds"),
        "action": event.action,
        "actor": event.actor_name,
        "actor_id": event.actor_id,
        "kill_request_id": event.kill_request_id,
        "host": event.host_name,
        "requester": event.requester_name,
        "approver": event.approver_name,
        "process_users": event.process_user_list,
        "targets_summary": event.targets_summary,
        "details": event.details,
        "previous_hash": event.previous_hash,
        "hash": event.hash,
        "sentence": _sentence(event),
    }


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
