"""Helpers for the kill executor's tests: real processes, hand-made orders, report recorders.

The programs under programs/ log the signals they receive, so a test can
assert both what the executor reported and what the process actually got.
"""

from __future__ import annotations

import contextlib
import copy
import os
import pwd
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpuadmin.probe import procfs
from gpuadmin.wire.kill_protocol import ORDER_VERSION
from tests.environment import without_coverage

PROGRAMS = Path(__file__).parent / "programs"
READY_TIMEOUT_SECONDS = 15.0
# Bound at import: tests monkeypatch os/signal to simulate hosts without pidfds,
# and the clean-up must keep working whatever a test did to them.
_pidfd_open = os.pidfd_open
_pidfd_send_signal = signal.pidfd_send_signal
FAST_PLAN = [
    {"signal": "SIGINT", "grace_seconds": 1},
    {"signal": "SIGTERM", "grace_seconds": 1},
    {"signal": "SIGKILL", "grace_seconds": 1},
]


def wait_until(condition: Any, timeout_seconds: float = READY_TIMEOUT_SECONDS, what: str = "it") -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds} s waiting for {what}")
        time.sleep(0.01)


def is_alive(pid: int, start_time_ticks: int) -> bool:
    """The very process (PID + start time) exists and has not exited (a zombie has)."""
    stat = procfs.read_stat(pid)
    return stat is not None and stat.start_time_ticks == start_time_ticks and not stat.zombie


def target_for(pid: int) -> dict[str, Any]:
    """The target as central would copy it from a snapshot: identity read from /proc now."""
    stat = procfs.read_stat(pid)
    uid = procfs.read_uid(pid)
    raw = procfs.read_cmdline_bytes(pid)
    assert stat is not None and uid is not None and raw is not None, f"PID {pid} is gone"
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return {
        "pid": pid,
        "start_time_ticks": stat.start_time_ticks,
        "uid": uid,
        "user": user,
        "name": stat.comm,
        "cmdline_sha256": procfs.cmdline_sha256(raw),
    }


def make_order(
    targets: list[dict[str, Any]],
    *,
    plan: list[dict[str, Any]] | None = None,
    request_id: str | None = None,
    deadline: datetime | None = None,
    host_deadline: datetime | None = None,
) -> dict[str, Any]:
    now = datetime.now(UTC)
    extra = {"host_deadline": host_deadline.isoformat().replace("+00:00", "Z")} if host_deadline else {}
    return {
        "order_version": ORDER_VERSION,
        "request_id": request_id or f"t-{uuid.uuid4().hex[:12]}",
        "host": "testhost",
        "boot_id": procfs.read_boot_id(),
        "deadline": (deadline or now + timedelta(minutes=2)).isoformat().replace("+00:00", "Z"),
        "targets": targets,
        "plan": plan if plan is not None else [dict(step) for step in FAST_PLAN],
        "approved_by": "bob",
        "approved_at": now.isoformat(),
        **extra,
    }


# A hand-written order for the validation tests (test_order_validation.py, test_order_edges.py):
# fixed values, not read from /proc, since these orders are parsed, never executed.
DIGEST = "ab" * 32


def good_order() -> dict[str, Any]:
    return {
        "order_version": ORDER_VERSION,
        "request_id": "42",
        "host": "gpu01",
        "boot_id": "6f1c1a57-2b3a-4b0e-9a43-1d2f3e4a5b6c",
        "deadline": "2026-12-02T13:00:00Z",
        "targets": [
            {
                "pid": 4120,
                "start_time_ticks": 123456,
                "uid": 1000,
                "user": "alice",
                "name": "python",
                "cmdline_sha256": DIGEST,
            },
        ],
        "plan": [
            {"signal": "SIGINT", "grace_seconds": 10},
            {"signal": "SIGTERM", "grace_seconds": 20},
            {"signal": "SIGKILL", "grace_seconds": 30},
        ],
        "approved_by": "bob",
        "approved_at": "2026-12-02T12:58:00Z",
    }


# order_with's value that deletes the field instead of replacing it.
DELETE = object()


def order_with(path: str, value: Any) -> dict[str, Any]:
    """The good order with one field replaced; path like 'targets.0.pid'; DELETE deletes it."""
    order = copy.deepcopy(good_order())
    *parents, last = path.split(".")
    node: Any = order
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) else last
    if value is DELETE:
        del node[key]
    else:
        node[key] = value
    return order


@dataclass
class Program:
    """A started test program and its working directory."""

    popen: subprocess.Popen[bytes]
    workdir: Path
    start_time_ticks: int = 0

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signals(self) -> list[str]:
        log = self.workdir / "signals.log"
        return log.read_text().split() if log.exists() else []

    def alive(self) -> bool:
        return is_alive(self.pid, self.start_time_ticks)

    def started_cmdline_sha256(self) -> str:
        """The digest of the command line it was started with, as a snapshot showed it then."""
        assert isinstance(self.popen.args, list)
        return procfs.cmdline_sha256(b"".join(os.fsencode(arg) + b"\0" for arg in self.popen.args))


@dataclass
class Processes:
    """Starts programs and guarantees that none outlives the test."""

    base: Path
    programs: list[Program] = field(default_factory=list)
    extra: list[tuple[int, int]] = field(default_factory=list)  # (pid, start time) not our children

    def start(self, program: str, *args: str, ready_file: str = "ready") -> Program:
        workdir = self.base / f"{program.removesuffix('.py')}-{len(self.programs)}"
        workdir.mkdir()
        popen = subprocess.Popen([sys.executable, str(PROGRAMS / program), str(workdir), *args],
                                 env=without_coverage())
        started = Program(popen, workdir)
        self.programs.append(started)
        wait_until(
            lambda: (workdir / ready_file).exists() or popen.poll() is not None, what=f"{program} to be ready"
        )
        assert popen.poll() is None, f"{program} exited early with {popen.returncode}"
        stat = procfs.read_stat(popen.pid)
        assert stat is not None
        started.start_time_ticks = stat.start_time_ticks
        return started

    def track(self, pid: int) -> None:
        stat = procfs.read_stat(pid)
        if stat is not None:
            self.extra.append((pid, stat.start_time_ticks))

    def cleanup(self) -> None:
        for program in self.programs:
            with contextlib.suppress(OSError):
                (program.workdir / "stop").touch()
        everyone = [(program.pid, program.start_time_ticks) for program in self.programs] + self.extra
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not any(is_alive(*each) for each in everyone), 3.0, "programs to stop")
        for pid, start_time_ticks in everyone:
            kill_exactly(pid, start_time_ticks)
        for program in self.programs:
            try:
                program.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                program.popen.kill()
                program.popen.wait()


def kill_exactly(pid: int, start_time_ticks: int) -> None:
    """SIGKILL this process if it is still the one we started: the clean-up must not hit a reused PID."""
    try:
        pidfd = _pidfd_open(pid)
    except OSError:
        return
    try:
        if is_alive(pid, start_time_ticks):
            with contextlib.suppress(ProcessLookupError):
                _pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        os.close(pidfd)


class Reports(list[dict[str, Any]]):
    """What the executor reported, in order: the callable handed to execute_order."""

    def __call__(self, event: dict[str, Any]) -> None:
        self.append(event)

    def kinds(self) -> list[str]:
        return [event["event"] for event in self]

    def of(self, kind: str, pid: int | None = None) -> list[dict[str, Any]]:
        return [event for event in self if event["event"] == kind and (pid is None or event["pid"] == pid)]

    def signals_to(self, pid: int) -> list[str]:
        return [event["signal"] for event in self.of("signal_sent", pid)]

    def at(self, event: dict[str, Any]) -> float:
        return datetime.fromisoformat(event["at"]).timestamp()


def pid_of_pidfd(pidfd: int) -> int:
    with open(f"/proc/self/fdinfo/{pidfd}") as info:
        for line in info:
            if line.startswith("Pid:"):
                return int(line.split()[1])
    raise AssertionError(f"fd {pidfd} is not a pidfd")


@dataclass
class SignalSpy:
    """Records every signal the code under test sends, and blocks those to PIDs it must never hit.

    A test of "never signal PID 1 / the agent" must be able to fail without
    actually signalling them: a blocked send raises AssertionError, which the
    executor does not catch, so the test fails instead of the machine.
    """

    forbidden: set[int]
    sent: list[tuple[int, str]] = field(default_factory=list)

    def record(self, pid: int, signum: int) -> None:
        name = signal.Signals(signum).name
        self.sent.append((pid, name))
        if pid in self.forbidden:
            raise AssertionError(f"the executor tried to send {name} to protected PID {pid}")
