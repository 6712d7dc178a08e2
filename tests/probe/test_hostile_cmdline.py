"""Command lines and process names are data chosen by any user of the host.

The probe keeps them verbatim (the web escapes them), parses /proc/<pid>/stat
correctly whatever the name, and digests the exact raw bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

from gpuadmin.probe import procfs
from gpuadmin.probe.processes import split_cmdline
from tests.probe.helpers import REPO, WORKLOADS, Device, Processes, rows_by_pid, snapshot

CONFUSING_NAME = ") R 1 ("
HOSTILE_ARGUMENTS: list[str | bytes] = [
    "<script>alert(1)</script>",
    "\x1b[31mred\x1b[0m",
    "\u202egnp.exe",  # RIGHT-TO-LEFT OVERRIDE: shows as "exe.png"
    b"bad-\xff\xfe-utf8",
    "",
]


def raw_cmdline(argv: list[str | bytes]) -> bytes:
    return b"".join((a if isinstance(a, bytes) else os.fsencode(a)) + b"\0" for a in argv)


def test_hostile_command_line_and_name_are_kept_verbatim(processes: Processes, device: Device) -> None:
    hostile = processes.start("hostile", device.path, CONFUSING_NAME, *HOSTILE_ARGUMENTS)
    argv = [sys.executable, WORKLOADS, "hostile", device.path, CONFUSING_NAME, *HOSTILE_ARGUMENTS]

    row = rows_by_pid(snapshot(device.glob))[hostile.pid]

    assert row["name"] == CONFUSING_NAME
    # The fields after the name are read from after the *last* ')': the name cannot shift them.
    assert row["state"] in ("S", "R")
    assert row["ppid"] == os.getpid()
    assert row["start_time_ticks"] == procfs.read_stat(hostile.pid).start_time_ticks
    assert row["cmdline"] == [
        sys.executable, WORKLOADS, "hostile", device.path, CONFUSING_NAME,
        "<script>alert(1)</script>", "\x1b[31mred\x1b[0m", "\u202egnp.exe", "bad-\ufffd\ufffd-utf8", "",
    ]
    assert row["cmdline_truncated"] is False
    with open(f"/proc/{hostile.pid}/cmdline", "rb") as f:
        assert f.read() == raw_cmdline(argv)
    assert row["cmdline_sha256"] == hashlib.sha256(raw_cmdline(argv)).hexdigest()


def test_cli_output_carries_no_raw_control_characters(processes: Processes, device: Device) -> None:
    hostile = processes.start("hostile", device.path, CONFUSING_NAME, *HOSTILE_ARGUMENTS)

    command = [sys.executable, "-m", "gpuadmin.probe", "--json", "--gpu-backend", "none",
               "--device-glob", device.glob]
    out = subprocess.run(command, capture_output=True, check=True, cwd=REPO).stdout

    # Printed to a terminal, the snapshot must not colour it or reverse it.
    assert b"\x1b" not in out
    assert "\u202e".encode() not in out
    row = rows_by_pid(json.loads(out))[hostile.pid]
    assert "\x1b[31mred\x1b[0m" in row["cmdline"]


def test_long_command_line_is_cut_and_flagged_but_digested_whole(
    processes: Processes, device: Device
) -> None:
    long_arguments = [f"{i:03d}" + "x" * 996 for i in range(10)]  # 10 arguments of 1,000 bytes
    holder = processes.start("holder", device.path, *long_arguments)
    with open(f"/proc/{holder.pid}/cmdline", "rb") as f:
        raw = f.read()
    assert len(raw) > 10_000

    row = rows_by_pid(snapshot(device.glob, cmdline_max_bytes=4096))[holder.pid]

    assert row["cmdline_truncated"] is True
    assert sum(len(a.encode()) + 1 for a in row["cmdline"]) <= 4096 + 1
    assert raw.startswith(b"\0".join(a.encode() for a in row["cmdline"]))
    assert row["cmdline"][:4] == [sys.executable, WORKLOADS, "holder", device.path]
    assert row["cmdline_sha256"] == hashlib.sha256(raw).hexdigest()


# --- splitting and capping, byte by byte ----------------------------------------------


def test_split_cmdline_keeps_arguments_and_empty_ones() -> None:
    assert split_cmdline(b"", 100) == ([], False)
    assert split_cmdline(b"python\0train.py\0\0--lr\0", 100) == (["python", "train.py", "", "--lr"], False)
    assert split_cmdline(b"\0", 100) == ([""], False)


def test_split_cmdline_of_a_process_that_rewrote_its_title_is_one_string() -> None:
    assert split_cmdline(b"postgres: checkpointer ", 100) == (["postgres: checkpointer "], False)


def test_split_cmdline_counts_separators_in_the_cap() -> None:
    raw = b"aaaa\0bbbb\0"  # 10 bytes
    assert split_cmdline(raw, 10) == (["aaaa", "bbbb"], False)
    assert split_cmdline(raw, 9) == (["aaaa", "bbbb"], True)  # only the final NUL is lost
    assert split_cmdline(raw, 7) == (["aaaa", "bb"], True)
    assert split_cmdline(raw, 5) == (["aaaa"], True)  # cut right after a NUL: nothing of "bbbb"
    assert split_cmdline(raw, 4) == (["aaaa"], True)


def test_split_cmdline_replaces_undecodable_bytes_and_a_cut_character() -> None:
    assert split_cmdline(b"caf\xc3\xa9\0\xff\0", 100) == (["café", "\ufffd"], False)
    assert split_cmdline("é".encode() * 3, 5) == (["éé\ufffd"], True)  # cut inside the third é


def test_split_cmdline_never_returns_more_arguments_than_bytes_or_the_schema_allows() -> None:
    argv, truncated = split_cmdline(b"\0" * 10_000, 2000)
    assert truncated is True
    assert len(argv) == 2000
    argv, truncated = split_cmdline(b"\0" * 8192, 8192)
    assert truncated is True
    assert len(argv) == 4096
