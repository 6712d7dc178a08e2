"""Helpers for the supervisor tests: run a command under tests/run/programs/harness.py and read /proc."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).with_name("programs") / "harness.py"
STARTED_LINE = re.compile(r"^gpuadmin: started (?P<name>.+) \(pid (?P<pid>\d+)\)$")


HOSTS_QUERY = (
    "SELECT h.name, s.document FROM fleet_host h LEFT JOIN fleet_latestsnapshot s ON s.host_id = h.id"
)


def hosts_in(env: dict[str, str]) -> dict[str, dict]:
    """Host name -> latest snapshot document, read straight from the panel's database."""
    if env.get("DATABASE_URL"):
        import psycopg

        with psycopg.connect(env["DATABASE_URL"]) as connection:
            try:
                rows = connection.execute(HOSTS_QUERY).fetchall()
            except psycopg.errors.UndefinedTable:  # not migrated yet
                return {}
        return {name: json.loads(document) if document else {} for name, document in rows}  # stored as text
    database = Path(env["GPUADMIN_DATA_DIR"]) / "gpuadmin.sqlite3"
    if not database.exists():
        return {}
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as connection:
        try:
            rows = connection.execute(HOSTS_QUERY).fetchall()
        except sqlite3.OperationalError:  # not migrated yet
            return {}
    return {name: json.loads(document) if document else {} for name, document in rows}


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    state: str
    ppid: int
    pgid: int
    sid: int
    comm: str


def process_table() -> list[ProcessInfo]:
    """Every process now in /proc, zombies included."""
    table = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes().decode(errors="replace")
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        table.append(ProcessInfo(int(entry), fields[0], int(fields[1]), int(fields[2]), int(fields[3]), comm))
    return table


def in_groups_or_sessions(ids: set[int]) -> list[ProcessInfo]:
    return [p for p in process_table() if p.pgid in ids or p.sid in ids]


def zombies_of(parents: set[int]) -> list[ProcessInfo]:
    return [p for p in process_table() if p.state == "Z" and p.ppid in parents]


@dataclass
class SupervisedRun:
    """A command running under the harness, its output collected line by line."""

    argv: list[str]
    env: dict[str, str]
    lines: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> SupervisedRun:
        self.process = subprocess.Popen(
            [sys.executable, str(HARNESS), *self.argv], cwd=REPO, env=self.env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, pattern: str, timeout_seconds: float) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_seconds
        with self._changed:
            while True:
                for line in self.lines:
                    match = regex.search(line)
                    if match:
                        return match
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    message = f"no line matching {pattern!r} within {timeout_seconds} s"
                    raise AssertionError(f"{message}:\n{self.output}")
                self._changed.wait(remaining)

    @property
    def command_pid(self) -> int:
        return int(self.wait_for_line(r"^HARNESS pid (\d+)$", 30).group(1))

    def started_children(self) -> dict[str, int]:
        return {m["name"]: int(m["pid"]) for m in map(STARTED_LINE.match, self.lines) if m}

    def finish(self, timeout_seconds: float) -> tuple[int, list[dict]]:
        """Wait for the command to end; returns its exit status and what it left behind."""
        exit_line = self.wait_for_line(r"^HARNESS exit (-?\d+)$", timeout_seconds)
        leftovers = self.wait_for_line(r"^HARNESS leftovers (.*)$", 10)
        assert self.process is not None
        self.process.wait(timeout=10)
        return int(exit_line.group(1)), json.loads(leftovers.group(1))

    def kill_everything(self, extra_groups: set[int]) -> None:
        """Clean-up after a failed test: no process of this run may outlive it."""
        for group in extra_groups | ({self.process.pid} if self.process else set()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
