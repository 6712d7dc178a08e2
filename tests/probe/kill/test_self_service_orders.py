"""A self-service order (a person stopping their own processes, no second admin): the agent
signals a target only while /proc shows its uid among the order's allowed uids, and checks it
before every signal, whatever else the order says. The orders are crafted here, as a forger
(or a central tricked into signing one) would write them."""

from __future__ import annotations

import os
from typing import Any

import pytest

from gpuadmin.probe.journal import Journal
from gpuadmin.probe.kill import execute_order
from gpuadmin.wire.kill_order import validate_order
from gpuadmin.wire.kill_protocol import SELF_SERVICE_ORDER_VERSION
from tests.probe.kill.helpers import Processes, Reports, SignalSpy, make_order, target_for

OTHER_UID = os.getuid() + 4242


def self_service(targets: list[dict[str, Any]], allowed_uids: list[int]) -> dict[str, Any]:
    return {**make_order(targets), "order_version": SELF_SERVICE_ORDER_VERSION,
            "self_service": {"allowed_uids": allowed_uids, "person": "alice"}}


def test_a_self_service_order_stops_a_process_of_an_allowed_uid(
    processes: Processes, journal: Journal, reports: Reports
) -> None:
    trainer = processes.start("trainer.py")
    result = execute_order(self_service([target_for(trainer.pid)], [os.getuid()]), journal=journal,
                           report=reports)
    assert result["result"] == "succeeded"
    assert not trainer.alive()
    assert "self-service by alice" in reports.of("started")[0]["detail"]


def test_the_agent_refuses_a_target_whose_live_uid_is_not_allowed_and_sends_nothing(
    processes: Processes, journal: Journal, reports: Reports, signal_spy: SignalSpy
) -> None:
    # The order claims the target runs as an allowed uid; /proc says otherwise. The uid check of
    # a self-service order comes before the identity check and names why.
    trainer = processes.start("trainer.py")
    target = {**target_for(trainer.pid), "uid": OTHER_UID}
    result = execute_order(self_service([target], [OTHER_UID]), journal=journal, report=reports)
    assert result["result"] == "refused"
    (refused,) = reports.of("refused", trainer.pid)
    assert refused["reason"] == "not_own_process"
    assert f"runs as uid {os.getuid()}" in refused["detail"]
    assert signal_spy.sent == []
    assert trainer.alive()


def test_a_self_service_order_naming_a_target_outside_its_uids_is_malformed() -> None:
    target = {"pid": 4120, "start_time_ticks": 1, "uid": 1001, "user": "bob", "name": "python",
              "cmdline_sha256": "ab" * 32}
    with pytest.raises(ValueError, match="target PID 4120 has uid 1001, not one of the allowed uids"):
        validate_order(self_service([target], [1000]))


def test_a_version_3_order_without_its_self_service_block_is_malformed() -> None:
    target = {"pid": 4120, "start_time_ticks": 1, "uid": 1000, "user": "a", "name": "p",
              "cmdline_sha256": "ab" * 32}
    order = self_service([target], [1000])
    del order["self_service"]
    with pytest.raises(ValueError, match="self-service order; its 'self_service' is missing"):
        validate_order(order)


@pytest.mark.parametrize("allowed", [[], "1000", [-1], [True], list(range(65))])
def test_allowed_uids_must_be_a_short_list_of_uids(allowed: Any) -> None:
    target = {"pid": 4120, "start_time_ticks": 1, "uid": 1000, "user": "a", "name": "p",
              "cmdline_sha256": "ab" * 32}
    with pytest.raises(ValueError, match="allowed_uids"):
        validate_order(self_service([target], allowed))


def test_an_order_without_the_block_is_read_as_before() -> None:
    target = {"pid": 4120, "start_time_ticks": 1, "uid": 1001, "user": "bob", "name": "python",
              "cmdline_sha256": "ab" * 32}
    assert validate_order(make_order([target])).self_service_uids is None
