"""validate_order: a malformed order is refused with a message that says what is wrong."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpuadmin.probe.journal import Journal
from gpuadmin.probe.kill import execute_order
from gpuadmin.wire.kill_order import Order, PlanStep, Target, validate_order
from tests.probe.kill.helpers import DELETE, DIGEST, good_order, order_with


def test_a_good_order_becomes_dataclasses() -> None:
    order = validate_order(good_order())

    assert isinstance(order, Order)
    assert order.request_id == "42"
    assert order.deadline == datetime(2026, 12, 2, 13, 0, tzinfo=UTC)
    assert order.targets == (Target(4120, 123456, 1000, "alice", "python", DIGEST),)
    assert [step.signal for step in order.plan] == ["SIGINT", "SIGTERM", "SIGKILL"]
    assert order.plan[2] == PlanStep("SIGKILL", 30.0)
    assert order.describe_plan() == "SIGINT → 10 s → SIGTERM → 20 s → SIGKILL → 30 s"


@pytest.mark.parametrize(
    "plan",
    [
        [{"signal": "SIGKILL", "grace_seconds": 30}],
        [{"signal": "SIGTERM", "grace_seconds": 5}],
        [{"signal": "SIGINT", "grace_seconds": 1}, {"signal": "SIGINT", "grace_seconds": 0.5}],
    ],
    ids=["sigkill-only", "no-sigkill", "second-ctrl-c"],
)
def test_plans_this_layer_accepts(plan: list[dict[str, Any]]) -> None:
    order = good_order() | {"plan": plan}
    assert len(validate_order(order).plan) == len(plan)


def test_an_integer_request_id_is_taken_as_text() -> None:
    assert validate_order(good_order() | {"request_id": 42}).request_id == "42"


@pytest.mark.parametrize(
    ("order", "message"),
    [
        ([], "a kill order must be a JSON object"),
        (order_with("order_version", 1), "unsupported order_version 1"),
        (order_with("order_version", DELETE), "missing 'order_version'"),
        (order_with("request_id", "../etc/passwd"), "'request_id' must be 1-128 letters"),
        (order_with("request_id", True), "'request_id' must be"),
        (order_with("host", ""), "'host' must not be empty"),
        (order_with("boot_id", 7), "'boot_id' must be a string; got int"),
        (order_with("deadline", "tomorrow"), "'deadline' is not an ISO 8601 time"),
        (order_with("deadline", "2026-12-02T13:00:00"), "'deadline' must carry a UTC offset"),
        (order_with("host_deadline", "2026-12-02T13:00:00"), "'host_deadline' must carry a UTC offset"),
        (order_with("host_deadline", "2026-12-02T14:00:01Z"), "'host_deadline' is more than 3600 s away"),
        (order_with("host_deadline", "2026-12-02T11:59:59Z"), "'host_deadline' is more than 3600 s away"),
        (order_with("approved_by", DELETE), "missing 'approved_by'"),
        (order_with("targets", []), "'targets' must be a non-empty list"),
        (order_with("targets", {"pid": 1}), "'targets' must be a non-empty list"),
        (order_with("targets.0", "4120"), "target 1 must be an object; got str"),
        (order_with("targets.0.pid", 0), "target 1: 'pid' must be a positive integer; got 0"),
        (order_with("targets.0.pid", "4120"), "target 1: 'pid' must be a positive integer; got '4120'"),
        (order_with("targets.0.pid", True), "target 1: 'pid' must be a positive integer; got True"),
        (order_with("targets.0.start_time_ticks", DELETE), "target 1: missing 'start_time_ticks'"),
        (order_with("targets.0.start_time_ticks", -1), "'start_time_ticks' must be an integer of 0 or more"),
        (order_with("targets.0.uid", 1.5), "target 1: 'uid' must be a non-negative integer"),
        (order_with("targets.0.cmdline_sha256", "XYZ"), "'cmdline_sha256' must be 64 lowercase hex digits"),
        (order_with("targets.0.user", None), "target 1: 'user' must be a string; got NoneType"),
        (order_with("plan", []), "'plan' must be a non-empty list of steps"),
        (order_with("plan", [{"signal": "SIGINT", "grace_seconds": 1}] * 11),
         "'plan' has 11 steps; at most 10"),
        (order_with("plan.0.signal", "SIGHUP"),
         "signal must be one of SIGINT, SIGTERM, SIGKILL, SIGCHLD; got 'SIGHUP'"),
        (order_with("plan.0.signal", 2),
         "plan step 1: signal must be one of SIGINT, SIGTERM, SIGKILL, SIGCHLD; got 2"),
        (order_with("plan.1.grace_seconds", 0),
         "step 2: 'grace_seconds' must be over 0, at most 3600; got 0"),
        (order_with("plan.1.grace_seconds", -5), "plan step 2: 'grace_seconds' must be over 0"),
        (order_with("plan.1.grace_seconds", float("nan")), "plan step 2: 'grace_seconds' must be over 0"),
        (order_with("plan.1.grace_seconds", "20"), "plan step 2: 'grace_seconds' must be a number; got '20'"),
        (order_with("plan.1.grace_seconds", DELETE), "plan step 2: missing 'grace_seconds'"),
        (order_with("plan.1.signal", "SIGKILL"), "plan step 2: SIGKILL must be the last step"),
        (
            order_with("plan.0.signal", "SIGTERM")
            | {"plan": [{"signal": "SIGTERM", "grace_seconds": 1}, {"signal": "SIGINT", "grace_seconds": 1}]},
            "plan step 2: SIGINT after SIGTERM; signals must escalate",
        ),
    ],
)
def test_malformed_orders_are_rejected_with_a_clear_message(order: Any, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        validate_order(order)
    assert message in str(raised.value)


def test_a_pid_listed_twice_is_rejected() -> None:
    order = good_order()
    order["targets"].append(dict(order["targets"][0]))
    with pytest.raises(ValueError, match="PID 4120 is listed twice"):
        validate_order(order)


def test_execute_order_rejects_a_malformed_order_before_journaling_or_reporting(tmp_path: Any) -> None:
    journal = Journal(tmp_path / "journal")
    reported: list[dict[str, Any]] = []
    with pytest.raises(ValueError, match="SIGHUP"):
        execute_order(order_with("plan.0.signal", "SIGHUP"), journal=journal, report=reported.append)
    assert reported == []
    assert list((tmp_path / "journal").iterdir()) == []
