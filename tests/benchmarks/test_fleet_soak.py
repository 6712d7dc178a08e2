"""benchmarks/fleet_soak.py --replay: each queued message reaches central at its slot, none twice or lost."""

from __future__ import annotations

import re

import pytest

from benchmarks.fleet_soak import Stream
from tests.benchmarks.test_smoke import require, run_script


def test_a_stream_is_due_by_its_slots_less_what_was_moved() -> None:
    stream = Stream(None, "central.updates", [0.0, 0.5, 0.5, 2.0])
    assert stream.due(-0.1) == 0
    assert stream.due(0.5) == 3  # slots are due at their second, not after it
    stream.moved = 3
    assert stream.due(1.9) == 0
    assert stream.due(2.0) == 1
    assert len(stream) == 4


# 3 rounds of 6 hosts, made faster than the fleet's clock (the messages must not be dated ahead of it).
TINY = ["--hosts", "6", "--minutes", "0.1", "--interval-seconds", "2", "--gpus", "1", "--processes", "20",
        "--sample-seconds", "2", "--senders", "2", "--skip-pages", "--no-wait"]


def soak_output(*args: str) -> str:
    require(("postgres", "redis"))
    return run_script("fleet_soak.py", [*args, *TINY])


@pytest.mark.services
def test_a_backlog_queued_faster_than_the_fleets_clock_is_stored_whole() -> None:
    output = soak_output("--backlog")
    assert re.search(r"\ningested: 18 stored .*?, 0 refused", output), output[-3000:]
    assert "hosts whose latest stored message is the last their agent sent 6 of 6" in output
    # The first full snapshots' own cost, measured on central's worker and PostgreSQL.
    enrolment = re.search(r"first full snapshots .*: 6 in .*; CPU per snapshot: worker ([0-9.]+) ms, "
                          r"PostgreSQL ([0-9.]+) ms", output)
    assert enrolment and float(enrolment[1]) > 0 and float(enrolment[2]) > 0, output[-3000:]


@pytest.mark.services
def test_replay_sends_every_queued_message_to_central_at_the_fleets_pace() -> None:
    # 3 s ahead for 18 messages: the rounds are made by then, each taken at the moment it is sent.
    output = soak_output("--replay", "--replay-making-ms", "170")
    queued = re.search(r"replay: (\d+) messages \((\d+) full snapshots, (\d+) updates\) queued aside", output)
    sent = re.search(r"\nsent: (\d+) \(.*?\): (\d+) full snapshots .*?, (\d+) updates", output)
    stored = re.search(r"\ningested: (\d+) stored", output)
    assert queued and sent and stored, output[-3000:]
    # 3 rounds of 6 hosts: what the senders queued aside is what the pacer sent and central stored.
    assert int(queued[1]) == 18
    assert queued.groups() == sent.groups()
    assert int(stored[1]) == 18
    assert "the pacer" in output
    # Beat's upkeep of the time the rounds took to make ran before the clock, not in the run.
    caught_up = r"\nupkeep caught up before the clock in \d+ s: history \{'buckets_rolled_up': \d+"
    assert re.search(caught_up, output), output[-3000:]
    assert "\nusage: 6 hosts' settlings spread over 900 s" in output, output[-3000:]
    # Sent over the rounds' 6 s, not at once: the first window saw some of them, not all.
    first_window = re.search(r"\n\s+\d+\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s+\d+", output)
    assert first_window, output[-3000:]
    first_sent = 2 * (float(first_window[1]) + float(first_window[2]))
    assert 0 < first_sent <= 12, output[-3000:]
    # Central received each about at its moment (the pacer's tick and a batch later), not 3 s after it.
    arrival = re.search(r"\narrival: .*? ([\d.]+) s after its moment \(median\), at most ([\d.]+) s", output)
    assert arrival and float(arrival[2]) < 2.5, output[-3000:]
