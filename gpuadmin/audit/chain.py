"""The hash chain, pure: which fields an event's hash covers, how they are
encoded, and how a run of stored rows is checked. No Django here; the model
(``AuditEvent.computed_hash``) and its queryset (``AuditEvent.objects.verify()``)
feed it.

Each event's hash is SHA-256 over the canonical JSON (sorted keys, no
whitespace, ASCII only) of the fields in ``HASHED_FIELDS`` — every field but
the actor's foreign key — with ``created_at`` written as ISO 8601 in UTC with
microseconds and ``details_json`` decoded into the key ``details``.

``previous_hash`` is the hash of the event before, or 64 zeros for the first
one. Editing any hashed field breaks that event's hash; recomputing the hash
after an edit breaks the next event's link; deleting an event leaves a gap in
the sequence. What the chain alone cannot show is the removal of the newest
events, which is why verification reports the head (sequence and hash): note
it somewhere else, and a later check can compare.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

# The one canonical encoding, shared with the signatures on orders, snapshots and reports.
from gpuadmin.wire.signing import canonical_json

GENESIS_HASH = "0" * 64
VERIFY_CHUNK_SIZE = 2000

# The one list of what the hash covers (the model's column names).
HASHED_FIELDS = (
    "sequence",
    "created_at",
    "actor_name",
    "action",
    "kill_request_id",
    "host_name",
    "requester_name",
    "approver_name",
    "process_users",
    "targets_summary",
    "details_json",
    "previous_hash",
)
# What verification reads per row: the hashed fields, then the stored hash.
VERIFY_COLUMNS = (*HASHED_FIELDS, "hash")


def timestamp_text(moment: datetime) -> str:
    """A time as hashed: ISO 8601 in UTC, always six fractional digits ("+00:00", not "Z")."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def canonical_encoding(fields: Mapping[str, Any]) -> bytes:
    """The bytes hashed for an event given exactly the ``HASHED_FIELDS``.

    Raises TypeError for a missing or extra field (a field outside the list
    must never silently change or escape the hash), ValueError when
    ``details_json`` is not JSON.
    """
    if set(fields) != set(HASHED_FIELDS):
        missing = sorted(set(HASHED_FIELDS) - set(fields))
        extra = sorted(set(fields) - set(HASHED_FIELDS))
        raise TypeError(f"hashed fields do not match: missing {missing}, not hashed {extra}")
    encoded = {name: fields[name] for name in HASHED_FIELDS if name not in ("created_at", "details_json")}
    encoded["created_at"] = timestamp_text(fields["created_at"])
    encoded["details"] = json.loads(fields["details_json"])
    return canonical_json(encoded).encode("ascii")


def event_hash(fields: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_encoding(fields)).hexdigest()


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    events: int
    first_bad_sequence: int | None = None
    problem: str | None = None
    # The newest event seen; compare with a value noted earlier to catch a cut-off tail.
    head_sequence: int | None = None
    head_hash: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        if self.ok:
            return f"audit chain OK: {self.events} events"
        return f"audit chain BROKEN at event {self.first_bad_sequence}: {self.problem}"


def check_rows(rows: Iterable[tuple], *, after_sequence: int = 0, after_hash: str = GENESIS_HASH,
               ) -> VerifyResult:
    """Check rows (``VERIFY_COLUMNS``, ascending sequence); stop checking at the first fault, count all.

    By default the rows are the whole log. Given a prefix already verified
    (``after_sequence`` events, the last with hash ``after_hash``), the rows
    are the events after it and must link onto it; the count includes the prefix.
    """
    expected_sequence = after_sequence + 1
    previous_hash = after_hash
    count = after_sequence
    fault: tuple[int, str] | None = None
    head: tuple[int, str] | None = (after_sequence, after_hash) if after_sequence else None
    for row in rows:
        count += 1
        sequence, stored_hash = row[0], row[-1]
        head = (sequence, stored_hash)
        if fault is not None:
            continue
        fault = _check_row(row, expected_sequence, previous_hash)
        expected_sequence = sequence + 1
        previous_hash = stored_hash
    return VerifyResult(
        ok=fault is None,
        events=count,
        first_bad_sequence=fault[0] if fault else None,
        problem=fault[1] if fault else None,
        head_sequence=head[0] if head else None,
        head_hash=head[1] if head else None,
    )


def _check_row(row: tuple, expected_sequence: int, previous_hash: str) -> tuple[int, str] | None:
    fields = dict(zip(VERIFY_COLUMNS, row, strict=True))
    sequence = fields["sequence"]
    if sequence != expected_sequence:
        missing = (
            f"event {expected_sequence} is missing"
            if sequence == expected_sequence + 1
            else f"events {expected_sequence} to {sequence - 1} are missing"
        )
        return expected_sequence, f"gap in sequence: {missing} (the next event present is {sequence})"
    stored_hash = fields.pop("hash")
    try:
        computed = event_hash(fields)
    except ValueError:
        return sequence, "hash mismatch: the event's details are not valid JSON (the event was changed)"
    if computed != stored_hash:
        return sequence, (
            f"hash mismatch: stored {stored_hash[:16]}…, recomputed {computed[:16]}… "
            "(the event's content was changed after it was written)"
        )
    if fields["previous_hash"] != previous_hash:
        if sequence == 1:
            return sequence, "broken link: the first event's previous_hash is not 64 zeros"
        return sequence, f"broken link: previous_hash does not match the hash of event {sequence - 1}"
    return None
