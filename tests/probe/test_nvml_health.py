"""A GPU's health through the nvml backend (gpuadmin/probe/gpus/nvml_health.py), against the real
nvidia-ml-py over the simulated driver (tests/probe/fake_pynvml.py): every field read, each one
unknown (None, never 0) when the GPU cannot say, and XID events seen while the agent runs."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuadmin.probe.gpus import nvml
from gpuadmin.probe.gpus.nvml_health import XID_REMEMBERED_SECONDS, XidWatch
from tests.probe.fake_pynvml import NO_PERMISSION, FakeGpu, fake_pynvml
from tests.probe.helpers import Device, snapshot

Install = Callable[..., types.ModuleType]
CORRECTED, UNCORRECTED, VOLATILE, AGGREGATE = 0, 1, 0, 1


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """A fresh XID memory for each test (it is the process's), on a clock the test moves."""
    clock = Clock()
    monkeypatch.setattr(nvml, "_xids", XidWatch(clock=clock))
    return clock


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> Iterator[Install]:
    def put(*gpus: FakeGpu, **options: object) -> types.ModuleType:
        module = fake_pynvml(gpus, **options)  # type: ignore[arg-type]
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    yield put
    nvml.close()


def health_of(device: Device) -> tuple[list[dict[str, Any]], str | None]:
    document = snapshot(device.glob, gpu_backend="nvml")  # checked against the schema
    return [gpu["health"] for gpu in document["gpus"]], document["gpu_backend"]["reason"]


def test_every_field_of_an_ampere_gpu(install: Install, device: Device) -> None:
    install(FakeGpu("GPU-0", temperature=91, power_mw=412_345, power_limit_mw=400_000,
                    clock_reasons=0x4 | 0x8 | 0x40 | 0x400,
                    ecc={(CORRECTED, VOLATILE): 5, (UNCORRECTED, VOLATILE): 1, (CORRECTED, AGGREGATE): 70,
                         (UNCORRECTED, AGGREGATE): 2},
                    remapped_rows=(3, 1, 1, 0)))

    (health,), reason = health_of(device)

    assert health == {
        "temperature_celsius": 91, "power_draw_milliwatts": 412_345, "power_limit_milliwatts": 400_000,
        "clock_event_reasons": ["sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "bit_10"],
        "ecc_volatile_corrected_errors": 5, "ecc_volatile_uncorrected_errors": 1,
        "ecc_aggregate_corrected_errors": 70, "ecc_aggregate_uncorrected_errors": 2,
        "remapped_rows_correctable": 3, "remapped_rows_uncorrectable": 1,
        "remapped_rows_pending": True, "remapped_rows_failed": False,
        # Ampere remaps rows and retires no pages: unknown, not zero.
        "retired_pages_single_bit_ecc": None, "retired_pages_double_bit_ecc": None,
        "retired_pages_pending": None,
        "xid_errors": [],
    }
    assert reason is None  # what a GPU cannot say is no news


def test_an_older_gpu_retires_pages_and_an_older_driver_names_throttle_reasons(
    install: Install, device: Device
) -> None:
    # 470 has no nvmlDeviceGetCurrentClocksEventReasons: the throttle-reasons name answers.
    install(FakeGpu("GPU-0", clock_reasons=0x20 | 0x80, retired_pages={0: 2, 1: 1}, retired_pages_pending=1,
                    ecc={}), version="470.57.02")

    (health,), _ = health_of(device)

    assert health["clock_event_reasons"] == ["sw_thermal_slowdown", "hw_power_brake_slowdown"]
    assert (health["retired_pages_single_bit_ecc"], health["retired_pages_double_bit_ecc"]) == (2, 1)
    assert health["retired_pages_pending"] is True
    assert health["ecc_volatile_uncorrected_errors"] == 0  # ECC on and clean: a real zero
    assert health["remapped_rows_pending"] is None


def test_no_permission_is_unknown_and_another_error_is_said(install: Install, device: Device) -> None:
    install(FakeGpu("GPU-0", temperature=50, power_mw=100_000, power_limit_mw=300_000,
                    errors={"nvmlDeviceGetPowerUsage": NO_PERMISSION, "nvmlDeviceGetTemperature": 999}))

    (health,), reason = health_of(device)

    assert health["power_draw_milliwatts"] is None
    assert health["temperature_celsius"] is None
    assert health["power_limit_milliwatts"] == 300_000
    assert reason == "GPU 0 temperature: Unknown Error"


def test_xid_events_seen_after_the_first_read_are_named_per_gpu(
    install: Install, device: Device, clock: Clock
) -> None:
    driver = install(FakeGpu("GPU-0"), FakeGpu("GPU-1")).driver
    driver.xid(0, 13)  # before the agent watched: never seen, as on a real driver
    health_of(device)

    driver.xid(1, 79)
    driver.xid(1, 79)
    clock.now += 30
    driver.xid(0, 94)
    (first, second), reason = health_of(device)

    assert first["xid_errors"] == [{"xid": 94, "count": 1, "last_seen_at": "2027-01-15T08:00:30Z"}]
    assert second["xid_errors"] == [{"xid": 79, "count": 2, "last_seen_at": "2027-01-15T08:00:30Z"}]
    assert reason is None

    # Kept across snapshots and a new NVML session (XID 79 loses the GPU and the session with it)...
    driver.reload()
    health_of(device)  # the stale session fails and is closed
    (_, second), _ = health_of(device)
    assert second["xid_errors"][0]["count"] == 2
    # ...for a day.
    clock.now += XID_REMEMBERED_SECONDS + 1
    (first, second), _ = health_of(device)
    assert first["xid_errors"] == second["xid_errors"] == []


def test_a_gpu_whose_events_cannot_be_watched_has_unknown_xids(install: Install, device: Device) -> None:
    install(FakeGpu("GPU-0", errors={"nvmlDeviceRegisterEvents": 3}))

    (health,), reason = health_of(device)

    assert health["xid_errors"] is None
    assert reason is None
