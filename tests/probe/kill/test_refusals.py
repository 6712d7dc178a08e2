"""What the agent refuses on the host, whatever the order says: nothing is signalled."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from typing import Any

import pytest

from gpuadmin.probe import procfs
from gpuadmin.probe.journal import Journal
from gpuadmin.probe.kill import execute_order
from gpuadmin.probe.kill.protected import ProtectedExecutables
from tests.probe.kill.helpers import Processes, Reports, SignalSpy, make_order, target_for, wait_until

NOBODY_UID = 65534


@pytest.mark.parametrize(
    ("change", "expected_detail"),
    [
        ({"start_time_ticks": 1}, "start time"),
        ({"cmdline_sha256": "0" * 64}, "command line differs"),
        ({"uid": 4242}, "uid is 0, the target had 4242"),
    ],
    ids=["start-time", "command-line", "uid"],
)
def test_a_target_whose_identity_changed_is_refused_and_not_signalled(
    *,
    processes: Processes,
    journal: Journal,
    reports: Reports,
    signal_spy: SignalSpy,
    change: dict[str, Any],
    expected_detail: str,
) -> None:
    trainer = processes.start("trainer.py")
    target = target_for(trainer.pid)
    if "start_time_ticks" in change:
        # Same PID, another start time: what a reused PID looks like to the order.
        change = {"start_time_ticks": target["start_time_ticks"] + 1}
    target.update(change)

    result = execute_order(make_order([target]), journal=journal, report=reports)

    assert result["result"] == "refused"
    (refused,) = reports.of("refused", trainer.pid)
    assert refused["reason"] == "identity_changed"
    assert refused["detail"].startswith("refused: identity changed: ")
    assert expected_detail in refused["detail"]
    assert reports.of("signal_sent") == []
    assert signal_spy.sent == []
    assert trainer.alive()
    assert trainer.signals() == []  # its handlers saw nothing


def test_an_order_for_another_boot_is_refused(
    processes: Processes, journal: Journal, reports: Reports, signal_spy: SignalSpy
) -> None:
    trainer = processes.start("trainer.py")
    order = make_order([target_for(trainer.pid)])
    order["boot_id"] = "00000000-0000-0000-0000-000000000000"

    result = execute_order(order, journal=journal, report=reports)

    assert result["result"] == "refused"
    assert "the order is for boot 00000000" in reports.of("refused")[0]["detail"]
    assert signal_spy.sent == [] and trainer.signals() == [] and trainer.alive()


def test_a_zombie_is_refused_and_its_parent_named(
    processes: Processes, journal: Journal, reports: Reports, signal_spy: SignalSpy
) -> None:
    parent = processes.start("zombie_parent.py")
    zombie_pid = int((parent.workdir / "zombie").read_text())
    zombie = target_for(zombie_pid)

    result = execute_order(make_order([zombie]), journal=journal, report=reports)

    assert result["result"] == "refused"
    (refused,) = reports.of("refused", zombie_pid)
    assert refused["reason"] == "zombie"
    assert refused["parent_pid"] == parent.pid
    assert f"already exited, a zombie waiting for parent {parent.pid} (python" in refused["detail"]
    assert signal_spy.sent == []
    assert parent.alive() and parent.signals() == []  # the parent is offered, never hit


def test_pid_1_the_agent_and_its_ancestor_are_refused_even_from_a_hand_made_order(
    journal: Journal, reports: Reports, signal_spy: SignalSpy
) -> None:
    targets = [target_for(1), target_for(os.getpid()), target_for(os.getppid())]

    result = execute_order(make_order(targets), journal=journal, report=reports)

    assert result["result"] == "refused"
    reasons = {event["pid"]: event["reason"] for event in reports.of("refused")}
    assert reasons == {1: "pid_1", os.getpid(): "agent", os.getppid(): "agent_ancestor"}
    assert signal_spy.sent == []
    assert [summary["outcome"] for summary in result["targets"]] == ["refused"] * 3


def test_a_kernel_thread_is_refused(journal: Journal, reports: Reports, signal_spy: SignalSpy) -> None:
    kernel_threads = [
        pid
        for pid in (int(entry) for entry in os.listdir("/proc") if entry.isdigit())
        if (stat := procfs.read_stat(pid)) is not None and stat.kernel_thread and pid > 2
    ]
    if not kernel_threads:
        pytest.skip("no kernel thread visible (a PID namespace hides them)")
    result = execute_order(make_order([target_for(kernel_threads[0])]), journal=journal, report=reports)

    assert result["result"] == "refused"
    assert reports.of("refused")[0]["reason"] == "kernel_thread"
    assert signal_spy.sent == []


def test_a_thread_id_is_refused_as_not_a_process(
    journal: Journal, reports: Reports, signal_spy: SignalSpy
) -> None:
    started = threading.Event()
    stop = threading.Event()
    thread_ids: list[int] = []

    def run() -> None:
        thread_ids.append(threading.get_native_id())
        started.set()
        stop.wait(10)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        started.wait(5)
        # A worker thread of this very process: its id has a /proc entry of its own.
        target = target_for(os.getpid()) | {"pid": thread_ids[0]}
        target["start_time_ticks"] = procfs.read_stat(thread_ids[0]).start_time_ticks  # type: ignore[union-attr]
        result = execute_order(make_order([target]), journal=journal, report=reports)
    finally:
        stop.set()
        thread.join()

    assert result["result"] == "refused"
    refused = reports.of("refused")[0]
    assert refused["reason"] == "not_a_process"
    assert f"is a thread of process {os.getpid()}" in refused["detail"]
    assert signal_spy.sent == []


def test_a_target_the_agent_may_not_signal_fails_with_eperm(processes: Processes) -> None:
    """The executor runs as nobody (as an agent without root would) against a root-owned trainer."""
    trainer = processes.start("trainer.py")
    order = make_order([target_for(trainer.pid)])
    journal_dir = tempfile.mkdtemp(prefix="journal-nobody-")
    os.chown(journal_dir, NOBODY_UID, NOBODY_UID)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the executor as an unprivileged agent
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY_UID)
            os.setuid(NOBODY_UID)
            events: list[dict[str, Any]] = []
            # No executable patterns: as nobody, /proc/<pid>/exe of root's process is unreadable,
            # and the protected executables would refuse it before the signal could fail.
            result = execute_order(order, journal=Journal(journal_dir), report=events.append,
                                   protected_executables=ProtectedExecutables(patterns=()))
            os.write(write_end, json.dumps({"result": result, "events": events}).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as pipe:
            output = pipe.read()
        _, status = os.waitpid(child, 0)
    finally:
        shutil.rmtree(journal_dir, ignore_errors=True)
    assert os.waitstatus_to_exitcode(status) == 0
    answer = json.loads(output)

    assert answer["result"]["result"] == "failed"
    refused = [event for event in answer["events"] if event["event"] == "refused"]
    assert len(refused) == 1 and refused[0]["error"] == "EPERM"
    assert "permission denied (EPERM)" in refused[0]["detail"]
    assert [event for event in answer["events"] if event["event"] == "signal_sent"] == []
    assert answer["result"]["targets"][0]["outcome"] == "failed"
    assert trainer.alive() and trainer.signals() == []


def test_a_target_that_execs_another_program_mid_plan_gets_no_further_signal(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    """exec() keeps the PID and the start time but replaces the program: not what was approved."""
    trainer = processes.start("trainer.py", "SIGINT=exec")
    plan = [{"signal": "SIGINT", "grace_seconds": 1}, {"signal": "SIGKILL", "grace_seconds": 1}]

    result = execute_order(make_order([target_for(trainer.pid)], plan=plan), journal=journal, report=reports)

    assert result["result"] == "failed"
    assert reports.signals_to(trainer.pid) == ["SIGINT"]
    (refused,) = reports.of("refused", trainer.pid)
    assert refused["detail"].startswith("refused: before SIGKILL: identity changed: the command line differs")
    assert result["targets"][0]["outcome"] == "failed"
    wait_until(lambda: b"execed" in (procfs.read_cmdline_bytes(trainer.pid) or b""), what="the exec")
    assert trainer.alive()
