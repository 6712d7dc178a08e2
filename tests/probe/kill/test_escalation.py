"""The signal ladder on real processes: each stops at the first signal that ends its target."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from gpuadmin.probe import procfs
from gpuadmin.probe.journal import Journal
from gpuadmin.probe.kill import execute_order
from tests.probe.kill.helpers import Processes, Reports, is_alive, make_order, target_for, wait_until

# How far a measured step may stray from the plan (the issue allows ±0.5 s).
TIMING_TOLERANCE_SECONDS = 0.5


def test_trainer_that_checkpoints_on_sigint_ends_on_sigint(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    trainer = processes.start("trainer.py", "SIGINT=checkpoint")

    result = execute_order(make_order([target_for(trainer.pid)]), journal=journal, report=reports)

    assert result["result"] == "succeeded"
    assert reports.signals_to(trainer.pid) == ["SIGINT"]  # no SIGTERM, no SIGKILL
    assert trainer.signals() == ["SIGINT"]
    assert (trainer.workdir / "checkpoint.pt").read_text() == "step=1234 saved on SIGINT\n"
    exited = reports.of("target_exited", trainer.pid)
    assert len(exited) == 1 and exited[0]["signal"] == "SIGINT"
    # pytest started it and has not waited for it yet: a zombie of ours, named as such.
    assert exited[0]["detail"].startswith(f"exited, not yet reaped by parent {os.getpid()}")
    assert exited[0]["parent_pid"] == os.getpid()
    assert trainer.popen.wait(timeout=5) == 0
    assert reports.kinds() == ["started", "signal_sent", "target_exited", "finished"]
    assert [event["seq"] for event in reports] == [1, 2, 3, 4]
    assert result == reports[-1]
    assert result["targets"][0]["outcome"] == "exited"
    assert result["targets"][0]["signals_sent"] == ["SIGINT"]


def test_trainer_that_ignores_sigint_ends_on_sigterm(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    trainer = processes.start("trainer.py", "SIGINT=ignore", "SIGTERM=exit")

    result = execute_order(make_order([target_for(trainer.pid)]), journal=journal, report=reports)

    assert result["result"] == "succeeded"
    assert reports.signals_to(trainer.pid) == ["SIGINT", "SIGTERM"]
    assert trainer.signals() == ["SIGINT", "SIGTERM"]
    assert trainer.popen.wait(timeout=5) == 128 + signal.SIGTERM
    assert reports.of("target_exited", trainer.pid)[0]["signal"] == "SIGTERM"
    assert all(event["method"] == "pidfd" for event in reports.of("signal_sent"))


def test_trainer_that_ignores_both_gets_sigkill_on_the_plans_schedule(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    trainer = processes.start("trainer.py", "SIGINT=ignore", "SIGTERM=ignore")
    plan = [
        {"signal": "SIGINT", "grace_seconds": 1},
        {"signal": "SIGTERM", "grace_seconds": 1.5},
        {"signal": "SIGKILL", "grace_seconds": 2},
    ]

    result = execute_order(make_order([target_for(trainer.pid)], plan=plan), journal=journal, report=reports)

    assert result["result"] == "succeeded"
    assert trainer.popen.wait(timeout=5) == -signal.SIGKILL
    assert trainer.signals() == ["SIGINT", "SIGTERM"]  # SIGKILL cannot be caught, so not logged
    sigint, sigterm, sigkill = reports.of("signal_sent", trainer.pid)
    assert [sigint["signal"], sigterm["signal"], sigkill["signal"]] == ["SIGINT", "SIGTERM", "SIGKILL"]
    (exited,) = reports.of("target_exited", trainer.pid)
    assert abs(reports.at(sigterm) - reports.at(sigint) - 1.0) <= TIMING_TOLERANCE_SECONDS
    assert abs(reports.at(sigkill) - reports.at(sigterm) - 1.5) <= TIMING_TOLERANCE_SECONDS
    # The exit is noticed through the pidfd at once, not at the end of the 2 s grace.
    assert 0 <= reports.at(exited) - reports.at(sigkill) <= TIMING_TOLERANCE_SECONDS


def test_a_tree_with_grandchildren_and_a_setsid_child_leaves_no_survivor(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    reaper = processes.start("tree.py", "reaper", ready_file="pids")
    pids_dir = reaper.workdir / "pids"
    wait_until(lambda: len(list(pids_dir.glob("*[0-9]"))) == 7, what="the 7 members of the tree")
    roles_and_pids = (path.name.rsplit("-", 1) for path in pids_dir.glob("*[0-9]"))
    members = {int(pid): role for role, pid in roles_and_pids}
    for pid in members:
        processes.track(pid)
    sessions = {pid: os.getsid(pid) for pid in members}
    assert len(set(sessions.values())) == 2, "one child (and its grandchild) runs in a session of its own"
    targets = [target_for(pid) for pid in members]

    result = execute_order(make_order(targets), journal=journal, report=reports)

    assert result["result"] == "succeeded", result["detail"]
    for target in targets:
        assert not is_alive(target["pid"], target["start_time_ticks"]), members[target["pid"]]
    ended_by = {members[event["pid"]] + ":" + event["signal"] for event in reports.of("target_exited")}
    assert ended_by == {"parent:SIGINT", "child:SIGTERM", "grandchild:SIGKILL"}
    assert {summary["outcome"] for summary in result["targets"]} == {"exited"}
    assert is_alive(reaper.pid, reaper.start_time_ticks), "the reaper was not a target"


def test_a_target_alive_after_the_last_step_is_unkillable(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    trainer = processes.start("trainer.py", "SIGINT=ignore")
    plan = [{"signal": "SIGINT", "grace_seconds": 1}]  # a plan without SIGKILL can leave it alive

    result = execute_order(make_order([target_for(trainer.pid)], plan=plan), journal=journal, report=reports)

    assert result["result"] == "unkillable"
    (survived,) = reports.of("target_survived", trainer.pid)
    assert survived["state"] in {"S", "R"}
    assert "still alive 1 s after SIGINT" in survived["detail"]
    assert trainer.alive()
    assert result["targets"][0]["outcome"] == "survived"


def test_a_stopped_target_is_reported_as_stopped_when_it_survives(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    trainer = processes.start("trainer.py")
    os.kill(trainer.pid, signal.SIGSTOP)
    wait_until(lambda: (Path(f"/proc/{trainer.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "T")
    plan = [{"signal": "SIGTERM", "grace_seconds": 1}]

    result = execute_order(make_order([target_for(trainer.pid)], plan=plan), journal=journal, report=reports)

    assert result["result"] == "unkillable"
    (survived,) = reports.of("target_survived", trainer.pid)
    assert survived["state"] == "T"
    assert "stopped (state T)" in survived["detail"]
    os.kill(trainer.pid, signal.SIGCONT)  # the pending SIGTERM now ends it
    assert trainer.popen.wait(timeout=5) == 128 + signal.SIGTERM


def test_every_event_is_journaled_before_the_result(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    trainer = processes.start("trainer.py", "SIGINT=ignore")
    order = make_order([target_for(trainer.pid)])

    execute_order(order, journal=journal, report=reports)

    entry = journal.read(order["request_id"])
    assert entry is not None
    assert entry.events == list(reports)
    assert entry.finished == reports[-1]
    assert entry.claim["order"] == order


def test_a_failing_report_does_not_stop_the_escalation(processes: Processes, journal: Journal) -> None:
    trainer = processes.start("trainer.py", "SIGINT=ignore")
    order = make_order([target_for(trainer.pid)])

    def broken_report(_event: dict) -> None:
        raise ConnectionError("broker down")

    result = execute_order(order, journal=journal, report=broken_report)

    assert result["result"] == "succeeded"
    assert trainer.signals() == ["SIGINT", "SIGTERM"]
    entry = journal.read(order["request_id"])
    assert entry is not None and [event["event"] for event in entry.events][-1] == "finished"


def test_a_target_gone_before_the_order_counts_as_exited(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    trainer = processes.start("trainer.py")
    target = target_for(trainer.pid)
    (trainer.workdir / "stop").touch()
    trainer.popen.wait(timeout=10)  # exited and reaped: the PID is free

    result = execute_order(make_order([target]), journal=journal, report=reports)

    assert result["result"] == "succeeded"
    (exited,) = reports.of("target_exited", trainer.pid)
    assert exited["signal"] is None and exited["detail"] == "exited (before any signal)"
    assert reports.of("signal_sent") == []


# A process whose main thread exited (pthread_exit) while another runs on shows state "Z"
# in /proc, yet lives, holds its memory and takes signals: it must get the whole ladder.


def test_a_process_whose_leader_exited_is_signalled_up_to_sigkill(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    program = processes.start("leader_exits.py")  # its leader exited before it said ready
    stat = procfs.read_stat(program.pid)
    assert stat is not None and stat.state == "Z" and stat.num_threads > 1
    # Approved while it still ran normally: the digest of its whole command line.
    target = {**target_for(program.pid), "cmdline_sha256": program.started_cmdline_sha256()}
    at_exit: list[procfs.StatFields | None] = []

    def report(event: dict[str, Any]) -> None:
        if event["event"] == "target_exited":
            at_exit.append(procfs.read_stat(program.pid))
        reports(event)

    result = execute_order(make_order([target]), journal=journal, report=report)

    assert result["result"] == "succeeded", result["detail"]
    assert reports.signals_to(program.pid) == ["SIGINT", "SIGTERM", "SIGKILL"]
    (exited,) = reports.of("target_exited", program.pid)
    assert exited["signal"] == "SIGKILL"
    # Reported exited only once the whole process had: a zombie (not yet reaped by us).
    assert len(at_exit) == 1 and at_exit[0] is not None and at_exit[0].zombie
    assert program.popen.wait(timeout=5) == -signal.SIGKILL


def test_a_leader_exiting_on_sigint_does_not_pass_for_the_process_exiting(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    program = processes.start("leader_exits.py", "on-sigint")

    result = execute_order(make_order([target_for(program.pid)]), journal=journal, report=reports)

    assert program.signals() == ["SIGINT"]  # it did exit its leader, not the process
    assert result["result"] == "succeeded", result["detail"]
    assert reports.signals_to(program.pid) == ["SIGINT", "SIGTERM", "SIGKILL"]
    (exited,) = reports.of("target_exited", program.pid)
    assert exited["signal"] == "SIGKILL"
    assert program.popen.wait(timeout=5) == -signal.SIGKILL
