"""The pure chain check (check_rows, timestamp_text) on hand-built rows: what each fault is
called, and hashes that do not depend on the host's time zone. No database."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from gpuadmin.audit.chain import GENESIS_HASH, HASHED_FIELDS, check_rows, event_hash, timestamp_text

AT = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)


def chain(count: int) -> list[dict[str, Any]]:
    """``count`` events as stored, each linked to the one before and hashed."""
    events: list[dict[str, Any]] = []
    previous_hash = GENESIS_HASH
    for sequence in range(1, count + 1):
        fields: dict[str, Any] = dict.fromkeys(HASHED_FIELDS, "")
        fields.update(sequence=sequence, created_at=AT, kill_request_id=None, details_json="{}",
                      previous_hash=previous_hash, action="requested")
        fields["hash"] = previous_hash = event_hash(fields)
        events.append(fields)
    return events


def rows(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(*(event[name] for name in HASHED_FIELDS), event["hash"]) for event in events]


def rehash(event: dict[str, Any]) -> None:
    event["hash"] = event_hash({name: event[name] for name in HASHED_FIELDS})


def test_a_whole_chain_is_ok_and_reports_its_head() -> None:
    events = chain(3)
    result = check_rows(rows(events))
    assert (result.ok, result.events) == (True, 3)
    assert (result.head_sequence, result.head_hash) == (3, events[2]["hash"])


def test_an_empty_log_is_ok_with_no_head() -> None:
    result = check_rows([])
    assert (result.ok, result.events, result.head_sequence, result.head_hash) == (True, 0, None, None)


def test_a_first_event_not_linked_to_64_zeros_is_named_so() -> None:
    events = chain(2)
    events[0]["previous_hash"] = "f" * 64
    rehash(events[0])
    result = check_rows(rows(events))
    assert (result.first_bad_sequence, result.problem) == (
        1, "broken link: the first event's previous_hash is not 64 zeros"
    )


def test_a_later_broken_link_names_the_event_before() -> None:
    events = chain(3)
    events[2]["previous_hash"] = "f" * 64
    rehash(events[2])
    result = check_rows(rows(events))
    assert (result.first_bad_sequence, result.problem) == (
        3, "broken link: previous_hash does not match the hash of event 2"
    )


def test_a_hash_mismatch_shows_both_hashes_shortened() -> None:
    events = chain(2)
    stored = events[1]["hash"]
    events[1]["actor_name"] = "mallory"
    recomputed = event_hash({name: events[1][name] for name in HASHED_FIELDS})
    result = check_rows(rows(events))
    assert (result.first_bad_sequence, result.problem) == (
        2,
        f"hash mismatch: stored {stored[:16]}…, recomputed {recomputed[:16]}… "
        "(the event's content was changed after it was written)",
    )


def test_details_that_are_not_json_are_a_hash_mismatch_said_so() -> None:
    events = chain(1)
    events[0]["details_json"] = "{not json"
    result = check_rows(rows(events))
    assert (result.first_bad_sequence, result.problem) == (
        1, "hash mismatch: the event's details are not valid JSON (the event was changed)"
    )


def test_a_row_that_does_not_match_the_columns_is_an_error_not_a_verdict() -> None:
    (row,) = rows(chain(1))
    with pytest.raises(ValueError, match="zip"):
        check_rows([(*row[:-1], "extra column", row[-1])])


@pytest.mark.usefixtures("host_in_another_time_zone")
def test_timestamps_are_hashed_in_utc_whatever_the_host_time_zone() -> None:
    assert time.strftime("%z", time.localtime(0)) == "+0530"  # the fixture took effect
    assert timestamp_text(AT) == "2025-03-04T05:06:07.890123+00:00"
    # A naive time is UTC, not local time.
    assert timestamp_text(AT.replace(tzinfo=None)) == "2025-03-04T05:06:07.890123+00:00"
    # An aware time in another zone is converted, not relabelled.
    two_hours_east = AT.astimezone(timezone(timedelta(hours=2)))
    assert timestamp_text(two_hours_east) == "2025-03-04T05:06:07.890123+00:00"
    assert timestamp_text(AT.replace(microsecond=0)) == "2025-03-04T05:06:07.000000+00:00"
