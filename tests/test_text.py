"""gpuadmin.text: the one way central writes sizes, ages, process states, clipped text and UTC times."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from gpuadmin.text import clip, human_bytes, human_duration, process_state, utc_text

MiB = 1024**2
GiB = 1024**3


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (None, "—"),
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (512 * MiB, "512 MiB"),
        (12 * GiB, "12 GiB"),
        (3 * GiB // 2, "1.5 GiB"),
        (80 * GiB + 512 * MiB, "80.5 GiB"),
        (1024 * GiB, "1 TiB"),
        (3 * 1024**5, "3 PiB"),
        (-2 * GiB, "-2 GiB"),
    ],
)
def test_sizes_are_binary_units_with_at_most_one_decimal(size, text):
    assert human_bytes(size) == text


@pytest.mark.parametrize(("seconds", "shown"), [
    (None, "—"), (0, "0 s"), (59.9, "59 s"), (60, "1 min"), (303, "5 min 3 s"),
    (3 * 3600 + 12 * 60 + 40, "3 h 12 min"), (7200, "2 h"), (2 * 86400 + 4 * 3600 + 5, "2 d 4 h"),
    (86400 + 59, "1 d"), (-5, "0 s"),
])
def test_ages_use_the_two_largest_units(seconds, shown):
    assert human_duration(seconds) == shown


def test_process_states_read_after_was_or_is():
    assert f"was {process_state('S')}, now {process_state('D')}" == (
        "was sleeping, now in uninterruptible sleep (D)"
    )
    assert process_state("Z") == "a zombie"
    assert process_state("q") == "in state q"


def test_clip_keeps_short_text_and_ends_cut_text_with_an_ellipsis():
    assert clip("abc", 3) == "abc"
    assert clip("abcdef", 4) == "abc…"
    assert len(clip("x" * 500, 300)) == 300


def test_utc_times_end_in_z_whatever_zone_they_come_in():
    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert utc_text(moment) == "2026-01-02T03:04:05Z"
    assert utc_text(moment.replace(microsecond=120000)) == "2026-01-02T03:04:05.120000Z"
    assert utc_text(moment, timespec="microseconds") == "2026-01-02T03:04:05.000000Z"
    in_paris = moment.astimezone(timezone(timedelta(hours=1)))
    assert utc_text(in_paris) == "2026-01-02T03:04:05Z"
    assert utc_text(None) is None
