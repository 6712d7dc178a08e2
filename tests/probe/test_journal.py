"""The journal: one claim per request id, durable private records, pruning that spares running orders."""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuadmin.probe.journal import Journal


def test_a_request_id_is_claimed_once(journal: Journal) -> None:
    first = journal.claim("7", {"claimed_at": "now"})
    assert first is not None
    with first:
        assert journal.claim("7", {"claimed_at": "later"}) is None
    assert journal.claim("7", {"claimed_at": "much later"}) is None
    entry = journal.read("7")
    assert entry is not None and entry.claim["claimed_at"] == "now"
    assert [path.name for path in journal.directory.iterdir()] == ["7.jsonl"]  # no temporary left


def test_only_one_of_many_processes_wins_a_claim(tmp_path: Path) -> None:
    script = (
        "import sys, time; from gpuadmin.probe.journal import Journal; "
        "w = Journal(sys.argv[1]).claim('race', {'by': sys.argv[2]}); "
        "print('won' if w else 'lost', flush=True); time.sleep(0.5 if w else 0)"
    )
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "journal"), str(number)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        for number in range(6)
    ]
    outcomes = [racer.communicate(timeout=30)[0].strip() for racer in racers]
    assert sorted(outcomes) == ["lost"] * 5 + ["won"]


def test_journal_files_are_private_and_records_durable(journal: Journal) -> None:
    writer = journal.claim("8", {"claimed_at": "now"})
    assert writer is not None
    with writer:
        writer.append({"event": "started", "seq": 1})
        # Another reader sees the line at once: it was written and fsync'ed, not buffered.
        entry = journal.read("8")
        assert entry is not None and entry.events == [{"event": "started", "seq": 1}]
    assert stat.S_IMODE(os.stat(journal.directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(journal.path_for("8")).st_mode) == 0o600


def test_an_existing_directory_is_made_private(tmp_path: Path) -> None:
    directory = tmp_path / "open"
    directory.mkdir(mode=0o777)
    os.chmod(directory, 0o777)
    Journal(directory)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700


def test_a_line_torn_by_a_crash_is_ignored(journal: Journal) -> None:
    writer = journal.claim("9", {"claimed_at": "now"})
    assert writer is not None
    with writer:
        writer.append({"event": "started", "seq": 1})
    with open(journal.path_for("9"), "a") as file:
        file.write('{"event": "signal_se')  # the agent died mid-write

    entry = journal.read("9")
    assert entry is not None
    assert entry.events == [{"event": "started", "seq": 1}]
    assert entry.finished is None and entry.last_seq == 1


def test_wait_for_blocks_while_the_entry_is_held(journal: Journal) -> None:
    writer = journal.claim("10", {"claimed_at": "now"})
    assert writer is not None
    fd = os.open(journal.path_for("10"), os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    writer.append({"event": "finished", "seq": 1, "result": "succeeded"})
    writer.close()

    again = journal.wait_for("10")
    assert again is not None
    with again:
        assert again.entry.finished == {"event": "finished", "seq": 1, "result": "succeeded"}
    assert journal.wait_for("never-claimed") is None


def test_prune_removes_old_entries_but_not_recent_or_running_ones(journal: Journal) -> None:
    for request_id in ("old", "recent", "running"):
        writer = journal.claim(request_id, {"claimed_at": "now"})
        assert writer is not None
        if request_id == "running":
            running = writer
        else:
            writer.close()
    long_ago = time.time() - 3 * 86400
    for request_id in ("old", "running"):
        os.utime(journal.path_for(request_id), (long_ago, long_ago))
    stale_temporary = journal.directory / ".claim-x-1-abcd"
    stale_temporary.write_text("")
    os.utime(stale_temporary, (long_ago, long_ago))

    removed = journal.prune(older_than_seconds=86400)

    assert removed == 2  # "old" and the stale temporary
    assert sorted(path.name for path in journal.directory.iterdir()) == ["recent.jsonl", "running.jsonl"]
    running.close()
    assert journal.prune(older_than_seconds=86400) == 1


def test_request_ids_that_are_not_safe_file_names_are_rejected(journal: Journal) -> None:
    for bad in ("../escape", ".hidden", "a/b", ""):
        with pytest.raises(ValueError, match="cannot name a journal file"):
            journal.path_for(bad)
