"""The order's validation at its edges: each message names where in the order the fault is,
and the smallest and largest values the format allows are accepted (what the agent then
refuses, PID 1 for one, is the executor's business, not the parser's)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuadmin.wire.kill_order import MAX_GRACE_SECONDS, MAX_STEPS, MAX_TARGETS, validate_order
from tests.probe.kill.helpers import DELETE, DIGEST, good_order, order_with


def message_for(order: Any) -> str:
    with pytest.raises(ValueError) as raised:
        validate_order(order)
    return str(raised.value)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        *[(key, f"order: missing {key!r}") for key in (
            "order_version", "request_id", "host", "boot_id", "deadline", "targets", "plan", "approved_by",
            "approved_at",
        )],
        *[(f"targets.0.{key}", f"target 1: missing {key!r}") for key in (
            "pid", "start_time_ticks", "uid", "user", "name", "cmdline_sha256",
        )],
        ("plan.1.signal", "plan step 2: missing 'signal'"),
        ("plan.1.grace_seconds", "plan step 2: missing 'grace_seconds'"),
    ],
)
def test_a_missing_field_is_named_with_where_it_belongs(path: str, message: str) -> None:
    assert message_for(order_with(path, DELETE)) == message


@pytest.mark.parametrize(
    ("order", "message"),
    [
        ([], "a kill order must be a JSON object; got list"),
        (order_with("order_version", 1), "unsupported order_version 1; this agent runs version 2, 3 only"),
        (order_with("targets", []), "'targets' must be a non-empty list"),
        (order_with("plan", []), "'plan' must be a non-empty list of steps"),
        (
            order_with("plan.0", "SIGINT"),
            "plan step 1 must be an object like {'signal': 'SIGINT', 'grace_seconds': 10}",
        ),
        (
            order_with(
                "plan", [{"signal": "SIGTERM", "grace_seconds": 1}, {"signal": "SIGINT", "grace_seconds": 1}]
            ),
            "plan step 2: SIGINT after SIGTERM; signals must escalate (SIGINT, then SIGTERM, then SIGKILL)",
        ),
        (
            order_with("approved_at", "2026-12-02T12:58:00"),
            "order: 'approved_at' must carry a UTC offset (e.g. 'Z'): '2026-12-02T12:58:00'",
        ),
    ],
)
def test_messages_say_exactly_what_is_wrong(order: Any, message: str) -> None:
    assert message_for(order) == message


def test_the_smallest_values_the_format_allows_are_accepted() -> None:
    order = good_order()
    order["targets"][0].update(pid=1, start_time_ticks=0, uid=0, user="", name="")
    (target,) = validate_order(order).targets
    assert (target.pid, target.start_time_ticks, target.uid, target.user, target.name) == (1, 0, 0, "", "")


def test_the_largest_plan_and_grace_are_accepted_one_more_step_is_not() -> None:
    steps = [{"signal": "SIGINT", "grace_seconds": MAX_GRACE_SECONDS}] * MAX_STEPS
    order = validate_order(order_with("plan", steps))
    assert len(order.plan) == MAX_STEPS and order.plan[0].grace_seconds == MAX_GRACE_SECONDS
    too_many = message_for(order_with("plan", [*steps, steps[0]]))
    assert too_many == f"'plan' has {MAX_STEPS + 1} steps; at most {MAX_STEPS}"


def test_the_most_targets_are_accepted_one_more_is_not() -> None:
    targets = [
        {"pid": pid, "start_time_ticks": 1, "uid": 1000, "user": "a", "name": "p", "cmdline_sha256": DIGEST}
        for pid in range(2, MAX_TARGETS + 2)
    ]
    assert len(validate_order(order_with("targets", targets)).targets) == MAX_TARGETS
    more = [*targets, {**targets[0], "pid": MAX_TARGETS + 2}]
    too_many = message_for(order_with("targets", more))
    assert too_many == f"'targets' has {MAX_TARGETS + 1} entries; at most {MAX_TARGETS}"


def test_the_approval_time_is_kept_in_utc_iso_form() -> None:
    assert validate_order(good_order()).approved_at == "2026-12-02T12:58:00+00:00"
