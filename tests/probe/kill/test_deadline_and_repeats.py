"""Nothing runs after its deadline, and an order delivered twice runs once."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuadmin.probe.journal import Journal
from gpuadmin.probe.kill import execute_order
from tests.probe.kill.helpers import Processes, Reports, SignalSpy, make_order, target_for, wait_until


def test_an_order_past_its_deadline_is_not_executed(
    processes: Processes, journal: Journal, reports: Reports, signal_spy: SignalSpy
) -> None:
    trainer = processes.start("trainer.py")
    order = make_order([target_for(trainer.pid)], deadline=datetime.now(UTC) - timedelta(seconds=1))

    result = execute_order(order, journal=journal, report=reports)

    assert result["result"] == "expired"
    assert reports.kinds() == ["finished"]
    assert "after its start deadline" in result["detail"]
    assert signal_spy.sent == []
    assert trainer.alive() and trainer.signals() == []


def test_the_deadline_is_read_from_the_injected_clock(
    processes: Processes, journal: Journal, reports: Reports, signal_spy: SignalSpy
) -> None:
    trainer = processes.start("trainer.py")
    deadline = datetime.now(UTC) + timedelta(minutes=5)
    order = make_order([target_for(trainer.pid)], deadline=deadline)

    result = execute_order(order, journal=journal, report=reports, clock=lambda: deadline.timestamp() + 0.001)

    assert result["result"] == "expired"
    assert signal_spy.sent == [] and trainer.alive()


def test_the_same_order_delivered_twice_runs_once(
    processes: Processes, journal: Journal, monkeypatch: Any
) -> None:
    trainer = processes.start("trainer.py", "SIGINT=checkpoint")
    order = make_order([target_for(trainer.pid)])
    first_reports = Reports()
    first = execute_order(order, journal=journal, report=first_reports)
    assert first["result"] == "succeeded"

    sent: list[int] = []
    monkeypatch.setattr(signal, "pidfd_send_signal", lambda fd, signum, *rest: sent.append(signum))
    monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append(signum))
    second_reports = Reports()
    second = execute_order(order, journal=journal, report=second_reports)

    assert sent == []
    assert second_reports.kinds() == ["finished"]
    assert second == second_reports[0]
    assert second["duplicate"] is True
    assert second["result"] == "succeeded"
    assert second["seq"] == first["seq"] and second["targets"] == first["targets"]
    assert "repeat delivery, nothing executed" in second["detail"]
    assert trainer.signals() == ["SIGINT"]


def test_two_simultaneous_deliveries_run_once_and_agree(processes: Processes, journal: Journal) -> None:
    trainer = processes.start("trainer.py", "SIGINT=ignore", "SIGTERM=exit")
    order = make_order([target_for(trainer.pid)])
    barrier = threading.Barrier(2)
    results: list[dict[str, Any]] = []

    def deliver() -> None:
        barrier.wait()
        results.append(execute_order(order, journal=journal, report=Reports()))

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert len(results) == 2
    assert sorted(result["duplicate"] for result in results) == [False, True]
    assert {result["result"] for result in results} == {"succeeded"}
    assert trainer.signals() == ["SIGINT", "SIGTERM"]  # one ladder, not two


def test_a_repeat_of_an_order_whose_agent_died_mid_way_is_interrupted_and_runs_nothing(
    processes: Processes, journal: Journal, signal_spy: SignalSpy
) -> None:
    trainer = processes.start("trainer.py", "SIGINT=ignore", "SIGTERM=ignore")
    plan = [{"signal": "SIGINT", "grace_seconds": 30}, {"signal": "SIGKILL", "grace_seconds": 5}]
    order = make_order([target_for(trainer.pid)], plan=plan)
    agent = os.fork()
    if agent == 0:  # an agent that will be killed while it waits out the SIGINT grace
        try:
            execute_order(order, journal=journal, report=lambda _event: None)
        finally:
            os._exit(0)
    try:
        wait_until(lambda: trainer.signals() == ["SIGINT"], what="the first agent's SIGINT")
        wait_until(
            lambda: (
                (entry := journal.read(order["request_id"])) is not None
                and [event["event"] for event in entry.events] == ["started", "signal_sent"]
            ),
            what="the journaled SIGINT",
        )
    finally:
        os.kill(agent, signal.SIGKILL)
        os.waitpid(agent, 0)
    signal_spy.sent.clear()  # the spy saw the kill of the agent above

    reports = Reports()
    started = time.monotonic()
    result = execute_order(order, journal=journal, report=reports)

    assert time.monotonic() - started < 5, "it must not wait out the plan"
    assert result["result"] == "interrupted"
    assert result["duplicate"] is True
    assert reports.kinds() == ["finished"]
    assert result["seq"] == 3  # after the dead agent's "started" and "signal_sent"
    (summary,) = result["targets"]
    assert summary["signals_sent"] == ["SIGINT"] and summary["outcome"] is None
    assert signal_spy.sent == []
    assert trainer.alive() and trainer.signals() == ["SIGINT"]

    again = execute_order(order, journal=journal, report=Reports())
    assert again["result"] == "interrupted" and again["seq"] == 3 and again["duplicate"] is True
    assert signal_spy.sent == []


def test_a_different_order_under_a_known_request_id_is_refused_as_a_conflict(
    processes: Processes, journal: Journal, signal_spy: SignalSpy
) -> None:
    trainer = processes.start("trainer.py")
    target = target_for(trainer.pid)
    first = make_order([target], deadline=datetime.now(UTC) - timedelta(seconds=1))
    execute_order(first, journal=journal, report=Reports())
    second = make_order([target], request_id=first["request_id"])

    result = execute_order(second, journal=journal, report=Reports())

    assert result["event"] == "order_refused" and result["reason"] == "conflict"
    assert "differs from the order recorded" in result["detail"]
    assert signal_spy.sent == [] and trainer.alive()


def test_the_same_order_delivered_ten_times_runs_once(
    processes: Processes, journal: Journal, signal_spy: SignalSpy
) -> None:
    trainer = processes.start("trainer.py", "SIGINT=ignore", "SIGTERM=exit")
    order = make_order([target_for(trainer.pid)])

    results = [execute_order(order, journal=journal, report=Reports()) for _ in range(10)]

    assert [result["duplicate"] for result in results] == [False] + [True] * 9
    assert {result["result"] for result in results} == {"succeeded"}
    assert [name for _pid, name in signal_spy.sent] == ["SIGINT", "SIGTERM"]  # one ladder
    assert trainer.signals() == ["SIGINT", "SIGTERM"]


@pytest.mark.parametrize("skew_seconds", [600, -600])
def test_a_host_clock_ten_minutes_off_runs_a_fresh_order_and_never_a_late_one(
    skew_seconds: int, processes: Processes, journal: Journal, signal_spy: SignalSpy
) -> None:
    """Central sends the deadline on the host's clock too (host_deadline); only that is compared."""
    deadline = datetime.now(UTC) + timedelta(minutes=2)
    host_deadline = deadline + timedelta(seconds=skew_seconds)

    def host_clock() -> float:
        return time.time() + skew_seconds

    late = processes.start("trainer.py")
    late_order = make_order([target_for(late.pid)], deadline=deadline, host_deadline=host_deadline)
    after_deadline = execute_order(late_order, journal=journal, report=Reports(),
                                   clock=lambda: host_deadline.timestamp() + 0.001)
    assert after_deadline["result"] == "expired"
    assert "both on this host's clock" in after_deadline["detail"]
    assert signal_spy.sent == [] and late.alive()

    fresh = processes.start("trainer.py", "SIGINT=exit")
    order = make_order([target_for(fresh.pid)], deadline=deadline, host_deadline=host_deadline)
    result = execute_order(order, journal=journal, report=Reports(), clock=host_clock)
    assert result["result"] == "succeeded"
    assert fresh.signals() == ["SIGINT"]


def test_without_host_deadline_the_deadline_itself_is_compared(
    processes: Processes, journal: Journal, signal_spy: SignalSpy
) -> None:
    trainer = processes.start("trainer.py")
    deadline = datetime.now(UTC) + timedelta(minutes=2)
    order = make_order([target_for(trainer.pid)], deadline=deadline)
    assert "host_deadline" not in order

    result = execute_order(order, journal=journal, report=Reports(), clock=lambda: deadline.timestamp() + 1)

    assert result["result"] == "expired" and signal_spy.sent == []
