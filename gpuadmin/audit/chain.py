"""The hash chain: how an event is encoded for hashing, and how the whole log
is checked.

Each event's hash is SHA-256 over the canonical JSON (sorted keys, no
whitespace, ASCII only) of every field except the actor's foreign key:

    action, actor_name, approver_name, created_at (ISO 8601, UTC, microseconds),
    details (the event's JSON object), host_name, kill_request_id,
    previous_hash, process_users, requester_name, sequence, targets_summary

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
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

GENESIS_HASH = "0" * 64
VERIFY_CHUNK_SIZE = 2000


def canonical_json(value: Any) -> str:
    """The one text a JSON value hashes as: sorted keys, no whitespace, ASCII, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def timestamp_text(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def canonical_encoding(
    *,
    sequence: int,
    created_at: datetime,
    actor_name: str,
    action: str,
    kill_request_id: int | None,
    host_name: str,
    requester_name: str,
    approver_name: str,
    process_users: str,
    targets_summary: str,
    details_json: str,
    previous_hash: str,
) -> bytes:
    """Raises ValueError when ``details_json`` is not JSON."""
    fields = {
        "sequence": sequence,
        "created_at": timestamp_text(created_at),
        "actor_name": actor_name,
        "action": action,
        "kill_request_id": kill_request_id,
        "host_name": host_name,
        "requester_name": requester_name,
        "approver_name": approver_name,
        "process_users": process_users,
        "targets_summary": targets_summary,
        "details": json.loads(details_json),
        "previous_hash": previous_hash,
    }
    return canonical_json(fields).encode("ascii")


def event_hash(**fields: Any) -> str:
    return hashlib.sha256(canonical_encoding(**fields)).hexdigest()


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


# The columns verify reads, in canonical_encoding's keyword order plus the stored hash.
_COLUMNS = (
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
    "hash",
)


def check_rows(rows: Iterable[tuple]) -> VerifyResult:
    """Check rows (``_COLUMNS`` order, ascending sequence); stop checking at the first fault but count all."""
    expected_sequence = 1
    previous_hash = GENESIS_HASH
    count = 0
    fault: tuple[int, str] | None = None
    head: tuple[int, str] | None = None
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
    fields = dict(zip(_COLUMNS, row, strict=True))
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
        computed = event_hash(**fields)
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


def verify_chain(*, using: str = "default", chunk_size: int = VERIFY_CHUNK_SIZE) -> VerifyResult:
    """Recompute the whole chain, streaming it from the database in chunks."""
    from gpuadmin.audit.models import AuditEvent

    rows = (
        AuditEvent.objects.using(using)
        .order_by("sequence")
        .values_list(*_COLUMNS)
        .iterator(chunk_size=chunk_size)
    )
    return check_rows(rows)
