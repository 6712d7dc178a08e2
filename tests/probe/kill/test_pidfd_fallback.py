"""Where pidfds are unavailable the executor falls back to kill() right after verifying, and says so."""

from __future__ import annotations

import errno
import os

import pytest

from gpuadmin.probe.journal import Journal
from gpuadmin.probe.kill import execute_order
from tests.probe.kill.helpers import Processes, Reports, make_order, target_for


def _no_pidfd_syscall(_pid: int, _flags: int = 0) -> int:
    raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))


@pytest.mark.parametrize("how", ["ENOSYS", "no os.pidfd_open"])
def test_without_pidfds_signals_go_through_kill_and_are_marked_so(
    processes: Processes, journal: Journal, reports: Reports, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    trainer = processes.start("trainer.py", "SIGINT=ignore", "SIGTERM=exit")
    if how == "ENOSYS":
        monkeypatch.setattr(os, "pidfd_open", _no_pidfd_syscall)
    else:
        monkeypatch.delattr(os, "pidfd_open")

    result = execute_order(make_order([target_for(trainer.pid)]), journal=journal, report=reports)

    assert result["result"] == "succeeded"
    sent = reports.of("signal_sent", trainer.pid)
    assert [event["signal"] for event in sent] == ["SIGINT", "SIGTERM"]
    assert {event["method"] for event in sent} == {"kill"}
    assert all("via kill(), pidfds unavailable" in event["detail"] for event in sent)
    assert trainer.signals() == ["SIGINT", "SIGTERM"]
    (exited,) = reports.of("target_exited", trainer.pid)
    assert exited["signal"] == "SIGTERM" and exited["method"] == "kill"
    assert result["targets"][0]["method"] == "kill"


def test_without_pidfds_a_changed_identity_is_still_refused(
    processes: Processes, journal: Journal, reports: Reports, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = processes.start("trainer.py")
    monkeypatch.setattr(os, "pidfd_open", _no_pidfd_syscall)
    target = target_for(trainer.pid) | {"cmdline_sha256": "a" * 64}

    result = execute_order(make_order([target]), journal=journal, report=reports)

    assert result["result"] == "refused"
    assert reports.of("signal_sent") == []
    assert trainer.alive() and trainer.signals() == []
