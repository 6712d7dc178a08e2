"""Signal plans: which signals, in which order, with how long to wait after each.

A plan is stored and sent as a list of ``{"signal": "SIGINT", "grace_seconds": 10}``.
The grace of the last step is how long the agent waits to confirm the end.
"""

from __future__ import annotations

from typing import Any

from gpuadmin.wire import kill_protocol

# The protocol's signals, in escalation order; central's bounds below are tighter than the agent's.
SIGNALS = tuple(kill_protocol.SIGNALS)
MIN_GRACE_SECONDS = 1
MAX_GRACE_SECONDS = 600
MAX_STEPS = 5

DEFAULT_PLAN: list[dict[str, Any]] = [
    {"signal": "SIGINT", "grace_seconds": 10},
    {"signal": "SIGTERM", "grace_seconds": 20},
    {"signal": "SIGKILL", "grace_seconds": 30},
]
SIGKILL_ONLY_PLAN: list[dict[str, Any]] = [{"signal": "SIGKILL", "grace_seconds": 30}]
# "Ask to reap": one SIGCHLD to the parent of zombies, which nothing escalates
# (gpuadmin/wire/kill_protocol.py, docs/kill-order.md). Pages pre-fill it by name.
REAP_PLAN_NAME = "reap"
REAP_PLAN: list[dict[str, Any]] = [{"signal": kill_protocol.REAP_SIGNAL, "grace_seconds": 5}]
PRESETS: dict[str, list[dict[str, Any]]] = {REAP_PLAN_NAME: REAP_PLAN}


class PlanError(ValueError):
    """A plan outside the bounds; the message says which step and why."""


def default_plan() -> list[dict[str, Any]]:
    return [dict(step) for step in DEFAULT_PLAN]


def preset(name: str | None) -> list[dict[str, Any]]:
    """A named plan (``reap``), or the default for any other name."""
    return [dict(step) for step in PRESETS.get(name or "", DEFAULT_PLAN)]


def asks_to_reap(plan: list[dict[str, Any]]) -> bool:
    return kill_protocol.is_reap_plan([step["signal"] for step in plan])


def is_sigkill_only(plan: list[dict[str, Any]]) -> bool:
    return bool(plan) and plan[0]["signal"] == "SIGKILL"


def validate_plan(raw: Any) -> list[dict[str, Any]]:
    """The plan in its stored form, or PlanError.

    A plan that starts with SIGKILL ("SIGKILL only") passes here; only an
    approver may allow it, which approval checks (see ``needs_sigkill_only_approval``).
    """
    if not isinstance(raw, list):
        raise PlanError('the plan must be a list of steps like {"signal": "SIGINT", "grace_seconds": 10}')
    if not 1 <= len(raw) <= MAX_STEPS:
        raise PlanError(f"the plan must have 1 to {MAX_STEPS} steps; it has {len(raw)}")
    plan: list[dict[str, Any]] = []
    for number, step in enumerate(raw, start=1):
        if not isinstance(step, dict):
            raise PlanError(f"step {number} must be an object with 'signal' and 'grace_seconds'")
        unknown = set(step) - {"signal", "grace_seconds"}
        if unknown:
            raise PlanError(f"step {number} has unknown fields: {', '.join(sorted(map(str, unknown)))}")
        signal = step.get("signal")
        if signal not in SIGNALS:
            raise PlanError(f"step {number}: signal must be one of {', '.join(SIGNALS)}; got {signal!r}")
        grace = step.get("grace_seconds")
        if isinstance(grace, bool) or not isinstance(grace, int):
            raise PlanError(f"step {number}: grace_seconds must be a whole number of seconds; got {grace!r}")
        if not MIN_GRACE_SECONDS <= grace <= MAX_GRACE_SECONDS:
            raise PlanError(
                f"step {number}: grace_seconds must be {MIN_GRACE_SECONDS} to {MAX_GRACE_SECONDS}; "
                f"got {grace}"
            )
        plan.append({"signal": signal, "grace_seconds": grace})
    if len(plan) > 1 and any(step["signal"] == kill_protocol.REAP_SIGNAL for step in plan):
        raise PlanError(
            f"{kill_protocol.REAP_SIGNAL} asks a parent to reap its zombies and ends nothing: "
            "it must be the only step"
        )
    kills = [i for i, step in enumerate(plan) if step["signal"] == "SIGKILL"]
    if kills and kills != [len(plan) - 1]:
        raise PlanError("SIGKILL can only be the last step, once: nothing can follow it")
    order = [SIGNALS.index(step["signal"]) for step in plan]
    for earlier, later, number in zip(order, order[1:], range(2, len(order) + 1), strict=False):
        # Repeating a catchable signal is allowed: many trainers read a second
        # Ctrl+C as "stop now, skip the clean-up".
        if later < earlier:
            raise PlanError(
                f"step {number}: {SIGNALS[later]} after {SIGNALS[earlier]}; signals must escalate "
                "(SIGINT, then SIGTERM, then SIGKILL)"
            )
    return plan


def needs_sigkill_only_approval(plan: list[dict[str, Any]]) -> bool:
    """A plan that opens with SIGKILL skips every chance to save a checkpoint."""
    return is_sigkill_only(plan)


def total_seconds(plan: list[dict[str, Any]]) -> int:
    return sum(step["grace_seconds"] for step in plan)


def describe(plan: list[dict[str, Any]]) -> str:
    """'SIGINT → 10 s → SIGTERM → 20 s → SIGKILL → 30 s'"""
    return " → ".join(f"{step['signal']} → {step['grace_seconds']} s" for step in plan)
