"""The protocol's records exactly as written and read: every key of an event and of the
finished event, and times read in UTC whatever offset the agent wrote."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuadmin.wire.kill_protocol import (
    BadEvent,
    Event,
    Method,
    Result,
    event_record,
    finished_event,
    parse_event,
)


def test_an_event_record_has_every_key_with_its_default() -> None:
    assert event_record("42", seq=0, at="2026-12-02T12:00:00Z", event=Event.STARTED) == {
        "request_id": "42", "seq": 0, "at": "2026-12-02T12:00:00Z", "event": "started",
        "pid": None, "start_time_ticks": None, "signal": None, "method": None, "detail": "",
    }


def test_a_signal_record_names_the_method_used() -> None:
    record = event_record("42", seq=1, at="t", event=Event.SIGNAL_SENT, pid=7, signal="SIGINT",
                          method=Method.KILL)
    assert (record["method"], record["signal"], record["pid"]) == ("kill", "SIGINT", 7)


def test_a_finished_event_carries_result_detail_targets_and_extras() -> None:
    record = finished_event("42", seq=5, at="t", result=Result.REFUSED, detail="all refused",
                            targets=None, host_boot_id="b")
    assert record["event"] == "finished"
    assert (record["result"], record["detail"], record["targets"]) == ("refused", "all refused", [])
    assert (record["duplicate"], record["host_boot_id"]) == (False, "b")


def test_an_event_time_with_an_offset_is_converted_not_relabelled() -> None:
    raw = event_record("42", seq=0, at="2026-12-02T14:00:00+02:00", event=Event.STARTED)
    assert parse_event(raw).at == datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    naive = event_record("42", seq=0, at="2026-12-02T12:00:00", event=Event.STARTED)
    assert parse_event(naive).at == datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "a progress event must be an object; got list"),
        ({"request_id": "42", "seq": 0, "event": "exploded", "at": "t"}, "unknown event 'exploded'"),
    ],
)
def test_a_bad_event_says_what_it_got(raw: object, message: str) -> None:
    with pytest.raises(BadEvent) as raised:
        parse_event(raw)
    assert str(raised.value) == message
