"""Helpers the probe's tests share: real processes (always cleaned up), a stand-in device, the schema check.

The real processes are programs/workloads.py; `processes` is the fixture that
starts them (registered by tests/probe/conftest.py and tests/fleet/conftest.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpuadmin.probe import procfs
from gpuadmin.probe.config import ProbeConfig
from gpuadmin.probe.snapshot import take_snapshot
from tests.environment import without_coverage

WORKLOADS = str(Path(__file__).with_name("programs") / "workloads.py")
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "gpuadmin" / "wire" / "snapshot.schema.json"
REPO = SCHEMA_PATH.parents[2]


@dataclass(frozen=True)
class Device:
    """A temporary file standing in for /dev/nvidia0, and the glob that matches it alone."""

    path: str
    glob: str


@cache
def schema_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def assert_valid(document: dict[str, Any]) -> None:
    errors = sorted(schema_validator().iter_errors(document), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:10])


def snapshot(device_glob: str, **config: Any) -> dict[str, Any]:
    """A real snapshot of this host, checked against the schema."""
    config.setdefault("gpu_backend", "none")
    document = take_snapshot(ProbeConfig(device_glob=device_glob, **config))
    assert_valid(document)
    return document


def rows_by_pid(document: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {row["pid"]: row for row in document["processes"]}


def wait_until(condition: Callable[[], bool], what: str, timeout_seconds: float = 10.0) -> None:
    """Poll until the processes reach the state a test needs (this is not an assertion on speed)."""
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for: {what}")
        time.sleep(0.01)


def state_of(pid: int) -> str | None:
    stat = procfs.read_stat(pid)
    return stat.state if stat else None


@dataclass
class Started:
    """A workload as the test sees it: the process, and what it reported when ready."""

    process: subprocess.Popen[bytes]
    report: dict[str, Any]

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def children(self) -> list[int]:
        return list(self.report.get("children", ()))


@dataclass
class Processes:
    """Every process a test starts, killed and reaped at the end even when the test fails.

    Descendants are remembered with their start time and signalled only while
    that still matches, so a PID reused meanwhile is never hit.
    """

    started: list[subprocess.Popen[bytes]] = field(default_factory=list)
    descendants: list[tuple[int, int]] = field(default_factory=list)

    def start(self, kind: str, *args: str | bytes, new_session: bool = False) -> Started:
        command: Sequence[str | bytes] = [sys.executable, WORKLOADS, kind, *args]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   start_new_session=new_session, env=without_coverage())
        self.started.append(process)
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            process.wait(timeout=10)
            assert process.stderr is not None
            raise AssertionError(f"workload {kind} failed: {process.stderr.read().decode(errors='replace')}")
        report = json.loads(line)
        for pid in [*report.get("children", ()), report.get("launcher")]:
            if pid:
                self.track(pid)
        return Started(process, report)

    def track(self, pid: int) -> None:
        stat = procfs.read_stat(pid)
        if stat is not None:
            self.descendants.append((pid, stat.start_time_ticks))

    def kill_descendant(self, pid: int) -> None:
        for tracked, start_ticks in self.descendants:
            if tracked == pid:
                self._kill_if_same(pid, start_ticks)

    def cleanup(self) -> None:
        # Grandchildren first, while their subreaper (if any) is alive to reap them.
        for pid, start_ticks in self.descendants:
            self._kill_if_same(pid, start_ticks)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: all(not self._alive(p, t) for p, t in self.descendants),
                       "descendants reaped", timeout_seconds=5)
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()

    @staticmethod
    def _alive(pid: int, start_ticks: int) -> bool:
        stat = procfs.read_stat(pid)
        return stat is not None and stat.start_time_ticks == start_ticks and not stat.zombie

    @staticmethod
    def _kill_if_same(pid: int, start_ticks: int) -> None:
        stat = procfs.read_stat(pid)
        if stat is not None and stat.start_time_ticks == start_ticks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def processes() -> Iterator[Processes]:
    """A `Processes` for the test; tests/probe/conftest.py and tests/fleet/conftest.py register it."""
    tracked = Processes()
    try:
        yield tracked
    finally:
        tracked.cleanup()


def free_pid() -> int:
    """A PID no process has right now (for GPU processes that /proc does not know)."""
    pid_max = procfs.read_pid_max()
    for pid in range(pid_max - 1, 1, -1):
        if not os.path.exists(f"/proc/{pid}"):
            return pid
    raise AssertionError("no free PID")
