"""The snapshot checks at their edges: values exactly at a limit pass, one past it fails, and
a rejection keeps the host's name whatever made the payload unreadable."""

from __future__ import annotations

import json

import pytest

from gpuadmin.fleet.validation import (
    INT64_MAX,
    MAX_CLOCK_AHEAD,
    PID_MAX_LIMIT,
    parse_snapshot,
    parse_taken_at,
)
from tests.factories import proc
from tests.fleet.test_validation import NOW, good, rejection


def test_taken_at_exactly_the_allowed_margin_ahead_is_accepted() -> None:
    document = good(taken_at=NOW + MAX_CLOCK_AHEAD)
    assert parse_snapshot(json.dumps(document), now=NOW)["taken_at"] == document["taken_at"]


def test_the_largest_64_bit_integer_is_accepted_and_one_more_is_not() -> None:
    document = good(processes=[proc(10)])
    document["processes"][0]["rss_bytes"] = INT64_MAX
    assert parse_snapshot(json.dumps(document), now=NOW)["processes"][0]["rss_bytes"] == INT64_MAX
    document["processes"][0]["rss_bytes"] = INT64_MAX + 1
    assert rejection(json.dumps(document)).message.endswith("is larger than a 64-bit integer")


@pytest.mark.parametrize("field", ["ppid", "pgid", "sid"])
def test_every_process_id_field_is_held_to_pid_max_limit(field: str) -> None:
    document = good(processes=[proc(10)])
    document["processes"][0][field] = PID_MAX_LIMIT + 1
    assert rejection(json.dumps(document)).message.startswith(
        f"processes[0].{field}: {PID_MAX_LIMIT + 1} is greater than Linux's PID_MAX_LIMIT"
    )


def test_a_payload_that_is_not_utf8_keeps_the_host_name() -> None:
    payload = json.dumps(good()).encode()[:-20] + b"\xff\xfe"
    error = rejection(payload)
    assert "not UTF-8" in error.message
    assert error.host_name == "gpu07"


def test_a_payload_nested_too_deeply_keeps_the_host_name() -> None:
    text = json.dumps(good())
    payload = text[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}"
    error = rejection(payload)
    assert error.message == "snapshot is not valid JSON: nested too deeply"
    assert error.host_name == "gpu07"


@pytest.mark.usefixtures("host_in_another_time_zone")
def test_taken_at_is_read_as_utc_whatever_the_host_time_zone() -> None:
    assert parse_taken_at("2025-03-04T05:06:07.1234567Z").isoformat() == "2025-03-04T05:06:07.123456+00:00"
    assert parse_taken_at("2025-03-04T07:06:07+02:00") == parse_taken_at("2025-03-04T05:06:07Z")
