"""A plan of one SIGCHLD asks a parent to reap its zombies: sent once, parent left running, no escalation."""

from __future__ import annotations

import os

import pytest

from gpuadmin.kills import plans
from gpuadmin.probe.journal import Journal
from gpuadmin.probe.kill import execute_order
from gpuadmin.wire.kill_order import validate_order
from tests.probe.kill.helpers import Processes, Reports, make_order, target_for, wait_until

REAP = [{"signal": "SIGCHLD", "grace_seconds": 1}]


def zombie_of(parent_workdir: os.PathLike[str]) -> int:
    with open(os.path.join(parent_workdir, "zombie")) as f:
        return int(f.read())


def state_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_a_parent_that_handles_sigchld_reaps_its_zombie_and_keeps_running(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    parent = processes.start("zombie_parent.py", "SIGCHLD=reap")
    zombie = zombie_of(parent.workdir)
    assert state_of(zombie) == "Z"

    result = execute_order(make_order([target_for(parent.pid)], plan=REAP), journal=journal, report=reports)

    assert result["result"] == "succeeded"
    assert "asked 1 of 1 targets to reap" in result["detail"]
    assert result["targets"][0]["outcome"] == "asked"
    assert reports.kinds() == ["started", "signal_sent", "finished"]  # no target_survived, no escalation
    assert reports.signals_to(parent.pid) == ["SIGCHLD"]
    wait_until(lambda: state_of(zombie) is None, what="the zombie to be reaped")
    assert parent.signals() == ["SIGCHLD"]
    assert parent.alive()


def test_a_parent_that_ignores_sigchld_is_never_sent_anything_else(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    parent = processes.start("zombie_parent.py")
    zombie = zombie_of(parent.workdir)

    result = execute_order(make_order([target_for(parent.pid)], plan=REAP), journal=journal, report=reports)

    assert result["result"] == "succeeded"
    assert reports.signals_to(parent.pid) == ["SIGCHLD"]
    assert parent.alive()
    assert state_of(zombie) == "Z"  # still there: the finding stays open and says so


@pytest.mark.parametrize(
    "plan",
    [
        [{"signal": "SIGCHLD", "grace_seconds": 1}, {"signal": "SIGKILL", "grace_seconds": 1}],
        [{"signal": "SIGTERM", "grace_seconds": 1}, {"signal": "SIGCHLD", "grace_seconds": 1}],
    ],
)
def test_sigchld_is_a_plan_of_its_own_on_both_sides(plan: list[dict[str, object]]) -> None:
    with pytest.raises(ValueError, match="only step"):
        validate_order(make_order([target_for(os.getpid())], plan=plan))
    with pytest.raises(plans.PlanError, match="only step"):
        plans.validate_plan([{**step, "grace_seconds": 1} for step in plan])
    assert plans.validate_plan(plans.preset(plans.REAP_PLAN_NAME)) == plans.REAP_PLAN
    assert plans.asks_to_reap(plans.REAP_PLAN)
