"""A reset order on the simulated backend, with real processes holding the simulated GPU's device file.

The agent refuses while any process holds the GPU (its device file, or NVML's list), names the
holder, and changes nothing; once the holder is gone the reset clears the GPU's memory.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from gpuadmin.probe.config import ProbeConfig
from gpuadmin.probe.gpus import simulated
from gpuadmin.probe.journal import Journal
from gpuadmin.probe.kill import execute_order
from gpuadmin.wire.kill_order import validate_order
from gpuadmin.wire.kill_protocol import Action
from tests.probe.helpers import Processes
from tests.probe.kill.helpers import Reports, make_order

GiB = 1024**3
UUID = "GPU-sim-reset"


def reset_order(uuid: str = UUID) -> dict[str, Any]:
    order = make_order([], plan=[])
    order.update(action="reset_gpu", gpu={"uuid": uuid})
    return order


def gpu_file(tmp_path: Path, device: Path, processes: list[dict[str, Any]], **gpu: Any) -> Path:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({
        "gpus": [{"uuid": UUID, "name": "Simulated H100", "memory_total_bytes": 80 * GiB,
                  "extra_used_bytes": 18 * GiB, "utilization_percent": 0, "device": str(device),
                  "persistence_mode": True, **gpu}],
        "processes": processes,
    }))
    return path


@pytest.fixture
def device(tmp_path: Path) -> Path:
    path = tmp_path / "nvidia0"
    path.write_bytes(b"")
    return path


@pytest.fixture
def holders() -> Any:
    tracked = Processes()
    try:
        yield tracked
    finally:
        tracked.cleanup()


def run(order: dict[str, Any], path: Path, journal: Journal, reports: Reports) -> dict[str, Any]:
    config = ProbeConfig(gpu_backend="simulated", simulated_gpus_path=str(path), host_name="testhost")
    return execute_order(order, journal=journal, report=reports, probe_config=config)


def used_bytes(path: Path) -> int | None:
    return simulated.read(str(path)).gpus[0].memory_used_bytes


def test_a_reset_is_refused_while_a_holder_exists_then_clears_the_memory_once_it_is_gone(
    tmp_path: Path, device: Path, holders: Processes, journal: Journal, reports: Reports
) -> None:
    holder = holders.start("holder", str(device), "train.py")
    path = gpu_file(tmp_path, device, [])

    refused = run(reset_order(), path, journal, reports)

    assert refused["result"] == "refused"
    assert refused["reason"] == "gpu_held"
    assert f"held by pid {holder.pid} (" in refused["detail"] and "workloads.py holder" in refused["detail"]
    assert used_bytes(path) == 18 * GiB  # nothing was reset
    assert [event["event"] for event in reports] == ["started", "finished"]

    os.kill(holder.pid, signal.SIGKILL)
    holder.process.wait(timeout=10)
    done = run(reset_order(), path, journal, reports)

    assert done["result"] == "succeeded", done["detail"]
    assert "persistence mode on" in done["detail"]
    assert used_bytes(path) == 0


def test_a_process_nvml_lists_on_the_gpu_is_a_holder_too(
    tmp_path: Path, device: Path, holders: Processes, journal: Journal, reports: Reports
) -> None:
    sleeper = holders.start("sleeper")
    path = gpu_file(tmp_path, device, [{"pid": sleeper.pid, "gpu_uuid": UUID, "used_memory_bytes": GiB}])

    refused = run(reset_order(), path, journal, reports)

    assert refused["reason"] == "gpu_held" and f"pid {sleeper.pid}" in refused["detail"]
    assert used_bytes(path) == 19 * GiB


@pytest.mark.parametrize("case", [
    ({"virtualization": "passthrough"}, "virtual_machine",
     "a virtual machine's passthrough GPU: not allowed"),
    ({"mig_instances": 2}, "mig_in_use", "MIG mode with 2 instance(s)"),
    ({"reset_refused": "GPU 00000000:3B:00.0 is in use by another client"}, "driver_refused",
     "the driver refused: GPU 00000000:3B:00.0 is in use by another client"),
])
def test_what_the_driver_or_a_virtual_machine_does_not_allow_is_refused_with_the_reason(
    tmp_path: Path, device: Path, journal: Journal, reports: Reports, case: tuple[dict[str, Any], str, str]
) -> None:
    gpu, reason, words = case
    path = gpu_file(tmp_path, device, [], **gpu)

    refused = run(reset_order(), path, journal, reports)

    assert (refused["result"], refused["reason"]) == ("refused", reason)
    assert words in refused["detail"]
    assert used_bytes(path) == 18 * GiB


def test_an_unknown_gpu_is_refused(tmp_path: Path, device: Path, journal: Journal, reports: Reports) -> None:
    path = gpu_file(tmp_path, device, [])

    refused = run(reset_order("GPU-elsewhere"), path, journal, reports)

    assert refused["reason"] == "gpu_not_found"


def test_a_repeat_delivery_answers_from_the_journal(
    tmp_path: Path, device: Path, journal: Journal, reports: Reports
) -> None:
    path = gpu_file(tmp_path, device, [])
    order = reset_order()
    first = run(order, path, journal, reports)
    path.write_text(path.read_text().replace('"extra_used_bytes": 0', '"extra_used_bytes": 5'))

    again = run(order, path, journal, reports)

    assert first["result"] == "succeeded" and again["duplicate"] is True
    assert used_bytes(path) == 5  # not reset twice


def test_a_reset_order_has_no_targets_and_no_plan_and_kill_orders_stay_as_they_were() -> None:
    assert validate_order(reset_order()).action is Action.RESET_GPU
    with pytest.raises(ValueError, match="empty 'targets' and 'plan'"):
        validate_order(reset_order() | {"plan": [{"signal": "SIGKILL", "grace_seconds": 1}]})
    with pytest.raises(ValueError, match="'gpu'"):
        validate_order({k: v for k, v in reset_order().items() if k != "gpu"})
    with pytest.raises(ValueError, match="'action' must be one of kill, reset_gpu"):
        validate_order(reset_order() | {"action": "reboot"})
    # An agent from before reset orders ignores 'action' and finds no targets: refused, never a kill.
    with pytest.raises(ValueError, match="'targets' must be a non-empty list"):
        validate_order({k: v for k, v in reset_order().items() if k != "action"})



@pytest.mark.parametrize("change, message", [
    ({"gpu": None}, "order: 'gpu' must be an object like {'uuid': 'GPU-...'}"),
    ({"gpu": {}}, "order.gpu: missing 'uuid'"),
    ({"gpu": {"uuid": ""}}, "order.gpu: 'uuid' must not be empty"),
    ({"gpu": {"uuid": "G" * 129}}, "order.gpu: 'uuid' must be 1-128 characters, no spaces around"),
    ({"gpu": {"uuid": f" {UUID}"}}, "order.gpu: 'uuid' must be 1-128 characters, no spaces around"),
    ({"targets": [{"pid": 1}]}, "order: a reset_gpu order has empty 'targets' and 'plan'"),
])
def test_a_malformed_reset_order_is_refused_naming_what_is_wrong(change: dict[str, Any],
                                                                  message: str) -> None:
    # The agent's refusal carries this text back to the request's page: it must say where.
    with pytest.raises(ValueError) as refused:
        validate_order(reset_order() | change)
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize("missing", ["gpu", "targets", "plan"])
def test_a_reset_order_without_its_fields_is_refused_naming_the_field(missing: str) -> None:
    with pytest.raises(ValueError, match=f"^order: missing '{missing}'$"):
        validate_order({k: v for k, v in reset_order().items() if k != missing})


def test_a_gpu_uuid_of_128_characters_is_accepted() -> None:
    assert validate_order(reset_order("G" * 128)).action is Action.RESET_GPU
