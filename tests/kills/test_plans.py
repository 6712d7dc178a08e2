"""Signal plans: the default, the bounds, and SIGKILL's place."""

from __future__ import annotations

import pytest

from gpuadmin.kills.plans import (
    DEFAULT_PLAN,
    PlanError,
    default_plan,
    describe,
    is_sigkill_only,
    validate_plan,
)


def step(signal: str, grace: int = 5) -> dict:
    return {"signal": signal, "grace_seconds": grace}


def test_the_default_plan_is_sigint_sigterm_sigkill():
    assert default_plan() == [step("SIGINT", 10), step("SIGTERM", 20), step("SIGKILL", 30)]
    assert describe(DEFAULT_PLAN) == "SIGINT → 10 s → SIGTERM → 20 s → SIGKILL → 30 s"
    assert validate_plan(default_plan()) == DEFAULT_PLAN


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ([], "1 to 5 steps"),
        ([step("SIGINT")] * 3 + [step("SIGTERM")] * 2 + [step("SIGKILL")], "1 to 5 steps"),
        ([step("SIGINT", 0)], "grace_seconds must be 1 to 600"),
        ([step("SIGINT", 601)], "grace_seconds must be 1 to 600"),
        ([step("SIGINT", 2.5)], "whole number of seconds"),
        ([step("SIGINT", True)], "whole number of seconds"),
        ([step("SIGHUP")], "signal must be one of SIGINT, SIGTERM, SIGKILL"),
        ([step("SIGKILL"), step("SIGTERM")], "SIGKILL can only be the last step"),
        ([step("SIGINT"), step("SIGKILL"), step("SIGKILL")], "SIGKILL can only be the last step"),
        ([step("SIGTERM"), step("SIGINT")], "signals must escalate"),
        ([{"signal": "SIGINT", "grace_seconds": 5, "shell": "rm -rf /"}], "unknown fields: shell"),
        ("SIGKILL", "must be a list"),
        ([42], "step 1 must be an object"),
    ],
)
def test_plans_out_of_bounds_are_refused_with_a_clear_message(plan, message):
    with pytest.raises(PlanError, match=message):
        validate_plan(plan)


def test_a_repeated_ctrl_c_is_allowed():
    plan = [step("SIGINT", 5), step("SIGINT", 5), step("SIGTERM"), step("SIGKILL")]
    assert validate_plan(plan) == plan


def test_a_plan_without_sigkill_is_allowed():
    assert validate_plan([step("SIGTERM", 60)]) == [step("SIGTERM", 60)]


def test_sigkill_only_is_a_valid_plan_that_approval_must_allow():
    plan = validate_plan([step("SIGKILL", 30)])
    assert is_sigkill_only(plan)
    assert not is_sigkill_only(default_plan())
