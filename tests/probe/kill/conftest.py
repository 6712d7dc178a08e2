"""Fixtures for the kill executor's tests; the helpers they use live in helpers.py.

`processes` here (programs/ that log their signals) overrides the probe's; `journal`
comes from tests/probe/conftest.py.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuadmin.probe import procfs
from tests.probe.kill.helpers import Processes, Reports, SignalSpy, pid_of_pidfd


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    tracked = Processes(tmp_path / "programs")
    tracked.base.mkdir()
    try:
        yield tracked
    finally:
        tracked.cleanup()


@pytest.fixture
def reports() -> Reports:
    return Reports()


@pytest.fixture
def signal_spy(monkeypatch: pytest.MonkeyPatch) -> SignalSpy:
    ancestors = set()
    pid = os.getpid()
    while pid > 0:
        ancestors.add(pid)
        stat = procfs.read_stat(pid)
        pid = stat.ppid if stat else 0
    spy = SignalSpy(forbidden={1, 2} | ancestors)
    real_pidfd_send_signal = signal.pidfd_send_signal
    real_kill = os.kill

    def pidfd_send_signal(pidfd: int, signum: int, *args: Any) -> None:
        spy.record(pid_of_pidfd(pidfd), signum)
        real_pidfd_send_signal(pidfd, signum, *args)

    def kill(target_pid: int, signum: int) -> None:
        spy.record(target_pid, signum)
        real_kill(target_pid, signum)

    monkeypatch.setattr(signal, "pidfd_send_signal", pidfd_send_signal)
    monkeypatch.setattr(os, "kill", kill)
    return spy
