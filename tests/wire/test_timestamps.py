"""gpuadmin/wire/timestamps.py: one written form for a moment, whichever side writes it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from gpuadmin.wire.timestamps import wire_time


def test_a_wire_time_is_utc_with_a_z_from_a_datetime_or_a_timestamp() -> None:
    moment = datetime(2026, 12, 2, 14, 0, 0, 250000, tzinfo=timezone(timedelta(hours=1)))
    assert wire_time(moment) == "2026-12-02T13:00:00.250000Z"
    assert wire_time(moment.timestamp()) == "2026-12-02T13:00:00.250000Z"
    assert wire_time(moment.replace(microsecond=0)) == "2026-12-02T13:00:00Z"
    assert datetime.fromisoformat(wire_time(moment)) == moment
