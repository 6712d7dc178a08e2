"""The protocol's words are defined once, and every event the executor reports reads back with them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuadmin.probe.journal import Journal
from gpuadmin.probe.kill import execute_order
from gpuadmin.wire.kill_protocol import (
    BadEvent,
    Event,
    Result,
    event_record,
    finished_event,
    parse_event,
)
from tests.probe.kill.helpers import Processes, Reports, make_order, target_for

EVERY_EVENT_HAS = {
    "request_id", "seq", "at", "event", "pid", "start_time_ticks", "signal", "method", "detail"
}
FINISHED_ALSO_HAS = {"result", "targets", "duplicate"}


def test_every_event_the_executor_reports_parses_back(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    trainer = processes.start("trainer.py", "SIGINT=checkpoint")
    order = make_order([target_for(trainer.pid), target_for(1)])

    execute_order(order, journal=journal, report=reports)

    assert reports.kinds() == ["started", "refused", "signal_sent", "target_exited", "finished"]
    for number, report in enumerate(reports, start=1):
        parsed = parse_event(report)
        assert (parsed.request_id, parsed.seq, parsed.event) == (order["request_id"], number, report["event"])
        assert parsed.at.tzinfo is not None
        assert set(report) >= EVERY_EVENT_HAS
    assert set(reports[-1]) == set(finished_event("1", seq=1, at="", result=Result.SUCCEEDED, detail=""))
    assert parse_event(reports[-1]).result is Result.SUCCEEDED


def test_the_expired_and_the_interrupted_answers_are_finished_events(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    trainer = processes.start("trainer.py")
    expired = make_order([target_for(trainer.pid)], deadline=datetime.now(UTC) - timedelta(seconds=1))
    answer = execute_order(expired, journal=journal, report=reports)
    assert set(answer) == EVERY_EVENT_HAS | FINISHED_ALSO_HAS
    assert parse_event(answer).result is Result.EXPIRED

    interrupted = make_order([target_for(trainer.pid)])
    writer = journal.claim(interrupted["request_id"], {"claimed_at": "earlier"})
    assert writer is not None
    writer.close()  # claimed, never finished: the agent died mid-way
    answer = execute_order(interrupted, journal=journal, report=reports)
    assert set(answer) == EVERY_EVENT_HAS | FINISHED_ALSO_HAS
    assert (parse_event(answer).result, answer["duplicate"]) == (Result.INTERRUPTED, True)
    assert trainer.alive()


def test_a_finished_event_has_the_keys_of_every_event_and_its_own() -> None:
    event = finished_event("42-ab", seq=3, at="2026-01-01T00:00:00Z", result=Result.REFUSED, detail="no")
    assert set(event) == EVERY_EVENT_HAS | FINISHED_ALSO_HAS
    assert (event["event"], event["result"], event["targets"], event["duplicate"]) == (
        "finished", "refused", [], False
    )
    assert set(event_record("42-ab", seq=1, at="", event=Event.STARTED)) == EVERY_EVENT_HAS


def test_a_naive_time_is_read_as_utc() -> None:
    parsed = parse_event({"request_id": 7, "seq": 0, "event": "started", "at": "2026-01-01T12:00:00"})
    assert parsed.at == datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert parsed.request_id == 7


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (["not", "an", "object"], "must be an object"),
        ({"request_id": None, "seq": 1, "event": "started", "at": "2026-01-01T00:00:00Z"}, "'request_id'"),
        ({"request_id": True, "seq": 1, "event": "started", "at": "2026-01-01T00:00:00Z"}, "'request_id'"),
        ({"request_id": "1", "seq": -1, "event": "started", "at": "2026-01-01T00:00:00Z"}, "'seq'"),
        ({"request_id": "1", "seq": True, "event": "started", "at": "2026-01-01T00:00:00Z"}, "'seq'"),
        ({"request_id": "1", "seq": 1, "event": "exploded", "at": "2026-01-01T00:00:00Z"}, "unknown event"),
        ({"request_id": "1", "seq": 1, "event": ["started"], "at": "2026-01-01T00:00:00Z"}, "unknown event"),
        ({"request_id": "1", "seq": 1, "event": "started", "at": "yesterday"}, "not an ISO 8601 time"),
        ({"request_id": "1", "seq": 1, "event": "started", "at": 1700000000}, "must be an ISO 8601 time"),
    ],
)
def test_a_report_outside_the_protocol_is_refused_with_the_reason(raw: object, says: str) -> None:
    with pytest.raises(BadEvent, match=says):
        parse_event(raw)


def test_an_unknown_result_reads_as_none() -> None:
    parsed = parse_event({"request_id": "1", "seq": 1, "event": "finished", "at": "2026-01-01T00:00:00Z",
                          "result": "exploded"})
    assert parsed.result is None

