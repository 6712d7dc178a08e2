"""What the executor writes about each target: the summary rebuilt from an interrupted
delivery's journal, the answer to a repeat delivery, and why a target outlived the plan."""

from __future__ import annotations

import errno
import os
import re
import signal
from datetime import UTC, datetime, timedelta

import pytest

from gpuadmin.probe import procfs
from gpuadmin.probe.journal import Journal, JournalEntry
from gpuadmin.probe.kill import execute_order
from gpuadmin.probe.kill.executor import _summary_from_journal
from gpuadmin.wire.kill_order import validate_order
from tests.probe.kill.helpers import Processes, Reports, make_order, target_for, wait_until


def hand_target(pid: int) -> dict[str, object]:
    return {"pid": pid, "start_time_ticks": pid * 10, "uid": 1000, "user": f"u{pid}", "name": f"p{pid}",
            "cmdline_sha256": "ab" * 32}


def test_an_interrupted_delivery_is_summed_up_per_target_from_its_journal() -> None:
    order = validate_order(make_order([hand_target(pid) for pid in (101, 102, 103, 104)]))
    entry = JournalEntry("r", claim={}, events=[
        {"event": "started", "seq": 1},
        {"event": "signal_sent", "seq": 2, "pid": 101, "signal": "SIGINT", "method": "pidfd"},
        {"event": "signal_sent", "seq": 3, "pid": 101, "signal": "SIGTERM", "method": "pidfd"},
        {"event": "target_exited", "seq": 4, "pid": 101, "detail": "exited after SIGTERM"},
        {"event": "signal_sent", "seq": 5, "pid": 102, "signal": "SIGKILL", "method": "kill"},
        {"event": "target_survived", "seq": 6, "pid": 102, "detail": "still alive"},
        {"event": "refused", "seq": 7, "pid": 103},
        {"event": "signal_sent", "seq": 8, "pid": 999, "signal": "SIGINT", "method": "pidfd"},  # not a target
    ])

    summaries = _summary_from_journal(order, entry)

    unknown = "unknown: the delivery stopped before recording an outcome"
    assert summaries == [
        {"pid": 101, "start_time_ticks": 1010, "user": "u101", "name": "p101", "outcome": "exited",
         "signals_sent": ["SIGINT", "SIGTERM"], "method": "pidfd", "detail": "exited after SIGTERM"},
        {"pid": 102, "start_time_ticks": 1020, "user": "u102", "name": "p102", "outcome": "survived",
         "signals_sent": ["SIGKILL"], "method": "kill", "detail": "still alive"},
        {"pid": 103, "start_time_ticks": 1030, "user": "u103", "name": "p103", "outcome": "refused",
         "signals_sent": [], "method": None, "detail": ""},
        {"pid": 104, "start_time_ticks": 1040, "user": "u104", "name": "p104", "outcome": None,
         "signals_sent": [], "method": None, "detail": unknown},
    ]


def test_a_repeat_of_a_finished_order_answers_its_result_again_and_says_so(
    processes: Processes, journal: Journal
) -> None:
    trainer = processes.start("trainer.py")
    expired = make_order([target_for(trainer.pid)], deadline=datetime.now(UTC) - timedelta(seconds=1))
    first = execute_order(expired, journal=journal, report=Reports())
    reports = Reports()

    again = execute_order(expired, journal=journal, report=reports)

    assert reports == [again]
    assert again["detail"] == f"{first['detail']}; repeat delivery, nothing executed"
    assert again["duplicate"] is True and first["duplicate"] is False
    changed = ("detail", "duplicate", "answered_at")
    assert {key: value for key, value in again.items() if key not in changed} == {
        key: value for key, value in first.items() if key not in changed
    }
    assert datetime.fromisoformat(again["answered_at"]) >= datetime.fromisoformat(first["at"])


def test_a_target_that_ignores_the_last_signal_survives_with_its_state(
    processes: Processes, journal: Journal
) -> None:
    trainer = processes.start("trainer.py", "SIGTERM=ignore")
    order = make_order([target_for(trainer.pid)], plan=[{"signal": "SIGTERM", "grace_seconds": 0.2}])

    result = execute_order(order, journal=journal, report=Reports())

    assert result["result"] == "unkillable"
    (summary,) = result["targets"]
    assert (summary["outcome"], summary["state"]) == ("survived", "S")
    assert summary["detail"] == "still alive 0.2 s after SIGTERM, the last step; state S"


def test_a_stopped_target_survives_and_the_detail_says_it_is_stopped(
    processes: Processes, journal: Journal
) -> None:
    trainer = processes.start("trainer.py")
    os.kill(trainer.pid, signal.SIGSTOP)
    wait_until(lambda: getattr(procfs.read_stat(trainer.pid), "state", None) == "T", what="it to stop")
    reports = Reports()
    order = make_order([target_for(trainer.pid)], plan=[{"signal": "SIGTERM", "grace_seconds": 0.2}])

    result = execute_order(order, journal=journal, report=reports)

    (survived,) = reports.of("target_survived", trainer.pid)
    assert (survived["state"], survived["signal"]) == ("T", "SIGTERM")
    assert result["targets"][0]["detail"] == (
        "still alive 0.2 s after SIGTERM, the last step; "
        "stopped (state T): catchable signals wait until it is continued"
    )


def test_a_pidfd_that_cannot_be_opened_is_a_signal_error_never_a_kill_fallback(
    processes: Processes, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EMFILE (the agent out of file descriptors) stands for any failure other than "no such
    process" or "no pidfds on this kernel": the target is refused, not signalled by PID."""
    trainer = processes.start("trainer.py")

    def out_of_descriptors(_pid: int, _flags: int = 0) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(os, "pidfd_open", out_of_descriptors)
    reports = Reports()

    result = execute_order(make_order([target_for(trainer.pid)]), journal=journal, report=reports)

    (refused,) = reports.of("refused", trainer.pid)
    assert (refused["reason"], refused["error"]) == ("signal_error", "EMFILE")
    assert result["targets"][0]["reason"] == "signal_error"
    assert refused["detail"] == f"refused: could not open a pidfd: {os.strerror(errno.EMFILE)}"
    assert reports.of("signal_sent") == [] and trainer.signals() == []
    assert result["result"] == "failed"


def test_a_signal_the_kernel_refuses_is_a_signal_error_with_its_code(
    processes: Processes, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = processes.start("trainer.py")

    def refused_by_the_kernel(_pidfd: int, _signum: int, *_args: object) -> None:
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

    monkeypatch.setattr(signal, "pidfd_send_signal", refused_by_the_kernel)
    reports = Reports()

    result = execute_order(make_order([target_for(trainer.pid)]), journal=journal, report=reports)

    (refused,) = reports.of("refused", trainer.pid)
    assert (refused["reason"], refused["error"]) == ("signal_error", "EINVAL")
    assert refused["detail"] == f"refused: could not send SIGINT: {os.strerror(errno.EINVAL)}"
    assert result["result"] == "failed" and result["targets"][0]["outcome"] == "failed"
    assert trainer.alive() and trainer.signals() == []


def test_an_exit_says_after_which_signal_how_long_after_and_who_must_reap_it(
    processes: Processes, journal: Journal
) -> None:
    trainer = processes.start("trainer.py")  # exits on SIGINT; its parent, this process, reaps it later
    reports = Reports()

    execute_order(make_order([target_for(trainer.pid)]), journal=journal, report=reports)

    (exited,) = reports.of("target_exited", trainer.pid)
    assert exited["signal"] == "SIGINT"
    assert exited["parent_pid"] == os.getpid()
    after = re.fullmatch(
        rf"exited, not yet reaped by parent {os.getpid()} \(.+\) "
        r"\(after SIGINT, (\d+\.\d\d) s after it was sent\)",
        exited["detail"],
    )
    assert after is not None, exited["detail"]
    assert 0 <= float(after.group(1)) < 60  # a duration since the signal, not a clock reading


def test_a_repeat_that_differs_or_follows_a_dead_delivery_says_so_exactly(
    processes: Processes, journal: Journal
) -> None:
    trainer = processes.start("trainer.py")
    interrupted = make_order([target_for(trainer.pid)])
    writer = journal.claim(interrupted["request_id"], {"claimed_at": "earlier"})
    assert writer is not None
    writer.close()  # claimed, never finished: the agent died mid-way

    answer = execute_order(interrupted, journal=journal, report=Reports())
    assert answer["detail"] == (
        "an earlier delivery claimed this order at earlier and never finished (the agent stopped "
        "mid-way); nothing executed now"
    )
    again = execute_order(interrupted, journal=journal, report=Reports())
    assert again["detail"] == f"{answer['detail']}; repeat delivery, nothing executed"

    expired = make_order([target_for(trainer.pid)], deadline=datetime.now(UTC) - timedelta(seconds=1))
    first = execute_order(expired, journal=journal, report=Reports())
    changed = {**expired, "approved_by": "someone else"}
    differing = execute_order(changed, journal=journal, report=Reports())
    # Another order under a request id already executed is refused, never answered as if the same.
    assert first["event"] == "finished" and first["result"] == "expired"
    assert differing["event"] == "order_refused" and differing["reason"] == "conflict"
    assert differing["detail"].startswith(
        "this delivery's content differs from the order recorded under this request id (claimed at "
    ) and differing["detail"].endswith("); nothing executed")
    assert trainer.alive() and trainer.signals() == []


def test_a_signal_sent_without_pidfds_says_which_step_and_how(
    processes: Processes, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = processes.start("trainer.py")  # exits on SIGINT
    monkeypatch.delattr(os, "pidfd_open")
    reports = Reports()

    execute_order(make_order([target_for(trainer.pid)]), journal=journal, report=reports)

    (sent,) = reports.of("signal_sent", trainer.pid)
    assert sent["detail"] == "sent SIGINT (step 1 of 3; grace 1 s); via kill(), pidfds unavailable"
