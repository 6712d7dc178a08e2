"""Findings that need history: suspected leak, idle holder, PIDs running out.

The leak and the idle holder are checked on a real process of this machine, its
GPU memory coming from a simulated GPU file (the only thing mocked); the PID
forecast needs a trend over minutes, so it is fed factory snapshots at chosen
moments.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gpuadmin.fleet.findings.rules import PidSample, pid_forecast
from gpuadmin.fleet.models import Finding, Host
from gpuadmin.probe import procfs
from gpuadmin.probe.config import ProbeConfig
from gpuadmin.probe.snapshot import take_snapshot
from tests.factories import GiB, gpu, proc, snapshot
from tests.fleet.helpers import at
from tests.keys import deliver
from tests.probe.helpers import Processes

pytestmark = pytest.mark.django_db

GPU = "GPU-real-0"
Kind = Finding.Kind


class RealHost:
    """This machine probed for real, with one real process given GPU memory by a simulated GPU file."""

    def __init__(self, tmp_path: Path, pid: int) -> None:
        self.pid = pid
        self.file = tmp_path / "gpus.json"
        self.config = ProbeConfig(
            gpu_backend="simulated",
            simulated_gpus_path=str(self.file),
            device_glob=str(tmp_path / "none*"),
            host_name="real-host",
        )

    def probe(self, *, memory: int, utilization: int) -> Host:
        self.file.write_text(
            json.dumps(
                {
                    "gpus": [
                        {
                            "uuid": GPU,
                            "name": "Simulated",
                            "memory_total_bytes": 80 * GiB,
                            "utilization_percent": utilization,
                        }
                    ],
                    "processes": [{"pid": self.pid, "gpu_uuid": GPU, "used_memory_bytes": memory}],
                }
            )
        )
        return deliver(json.dumps(take_snapshot(self.config)))


@pytest.fixture
def real(processes: Processes, tmp_path: Path) -> RealHost:
    return RealHost(tmp_path, processes.start("sleeper").pid)


def open_of(host: Host, kind: str) -> list[Finding]:
    return list(host.findings.open().filter(kind=kind))


def test_a_real_process_whose_memory_keeps_rising_is_a_suspected_leak(real: RealHost, settings: Any) -> None:
    settings.GPUADMIN_LEAK_RISING_SAMPLES = 5
    for step in range(5):
        host = real.probe(memory=(1 + step) * GiB, utilization=50)
    # Four rises after the first sighting: not yet.
    assert open_of(host, Kind.SUSPECTED_LEAK) == []
    host = real.probe(memory=6 * GiB, utilization=50)
    host = real.probe(memory=6 * GiB, utilization=50)  # a plateau keeps the count
    (leak,) = open_of(host, Kind.SUSPECTED_LEAK)
    start = procfs.read_stat(real.pid).start_time_ticks
    assert leak.key == f"{real.pid}:{start}"
    assert (leak.details["from_bytes"], leak.details["gpu_memory_bytes"], leak.details["rising_samples"]) == (
        GiB,
        6 * GiB,
        5,
    )
    assert f"(pid {real.pid}," in leak.title and "1 GiB to 6 GiB over 5 snapshots" in leak.title
    # Memory given back: a cache, or the leak fixed; the finding resolves.
    host = real.probe(memory=2 * GiB, utilization=50)
    assert open_of(host, Kind.SUSPECTED_LEAK) == []


def test_a_real_process_holding_memory_on_an_idle_gpu_is_an_idle_holder(
    real: RealHost, settings: Any
) -> None:
    settings.GPUADMIN_IDLE_HOLDER_SECONDS = 0
    host = real.probe(memory=4 * GiB, utilization=30)
    assert open_of(host, Kind.IDLE_HOLDER) == []
    host = real.probe(memory=4 * GiB, utilization=0)
    (idle,) = open_of(host, Kind.IDLE_HOLDER)
    start = procfs.read_stat(real.pid).start_time_ticks
    assert idle.key == GPU
    assert idle.details["targets"] == [[real.pid, start]]
    assert idle.title.startswith("GPU 0: 4 GiB held by ") and "at 0% utilization" in idle.title
    host = real.probe(memory=4 * GiB, utilization=12)
    assert open_of(host, Kind.IDLE_HOLDER) == []


def test_an_idle_holder_needs_the_threshold_of_idleness(ingest: Callable[..., Host], settings: Any) -> None:
    settings.GPUADMIN_IDLE_HOLDER_SECONDS = 3600
    holder = [proc(1000, gpu_memory={"GPU-sim-0000": 10 * GiB})]
    for minutes in (0, 30, 59):
        host = ingest(
            snapshot(
                processes=holder,
                gpus=[gpu(0, used=10 * GiB, utilization_percent=0)],
                taken_at=at(minutes * 60),
            )
        )
        assert open_of(host, Kind.IDLE_HOLDER) == []
    host = ingest(
        snapshot(processes=holder, gpus=[gpu(0, used=10 * GiB, utilization_percent=0)], taken_at=at(3600))
    )
    (idle,) = open_of(host, Kind.IDLE_HOLDER)
    assert "for 1 h" in idle.title
    assert idle.details["idle_since"] == "2026-12-02T12:00:00Z"


def zombies_growing(minute: int, *, per_minute: int) -> dict[str, Any]:
    """A parent that never reaps: `per_minute` more zombies every minute."""
    count = per_minute * minute
    parent = proc(500, name="leaky-forker", reasons=["ancestor"])
    zombies = [proc(10_000 + z, ppid=500, state="Z") for z in range(count)]
    return snapshot(
        processes=[parent, *zombies], taken_at=at(minute * 60), pid_max=32768, pids_in_use=20_000 + count
    )


def test_growing_zombies_forecast_when_pid_max_is_reached(ingest: Callable[..., Host], settings: Any) -> None:
    settings.GPUADMIN_PID_FORECAST_HORIZON_SECONDS = 24 * 3600
    for minute in range(0, 10):
        host = ingest(zombies_growing(minute, per_minute=20))
    (running_out,) = open_of(host, Kind.PIDS_RUNNING_OUT)
    # 20 PIDs a minute from 20,180 in use: 12,588 left, about 629 minutes.
    assert running_out.details["pids_per_hour"] == pytest.approx(1200.0)
    assert running_out.details["forecast_at"].startswith("2026-12-02T22:38")
    assert "zombies grew from 0 to 180" in running_out.title
    assert "leaky-forker" in running_out.remedy


def test_steady_zombies_or_a_far_forecast_is_no_finding(ingest: Callable[..., Host], settings: Any) -> None:
    settings.GPUADMIN_PID_FORECAST_HORIZON_SECONDS = 3600
    for minute in range(0, 10):
        host = ingest(zombies_growing(minute, per_minute=20))
    assert open_of(host, Kind.PIDS_RUNNING_OUT) == []  # ten hours away, beyond the horizon
    # PIDs rising as fast on another host, but by ordinary processes: its zombies stay at 40.
    settings.GPUADMIN_PID_FORECAST_HORIZON_SECONDS = 24 * 3600
    for minute in range(0, 10):
        document = zombies_growing(2, per_minute=20)
        document["host"]["name"] = "gpu02"
        document["taken_at"] = snapshot(taken_at=at(minute * 60))["taken_at"]
        document["host"]["pids_in_use"] = 20_000 + 20 * minute
        host = ingest(document)
    assert open_of(host, Kind.PIDS_RUNNING_OUT) == []


def test_the_pid_forecast_is_a_least_squares_line() -> None:
    samples = [PidSample(at(60 * m), 1000 + 10 * m + (3 if m % 2 else -3), m) for m in range(11)]
    per_second, reached_at = pid_forecast(samples, 2000)  # type: ignore[misc]
    assert per_second * 60 == pytest.approx(10, rel=0.05)
    assert at(600) + timedelta(minutes=85) < reached_at < at(600) + timedelta(minutes=95)
    assert pid_forecast(samples[:3], 2000) is None  # too short a trend
    falling = [PidSample(s.taken_at, 2000 - s.pids_in_use, s.zombies) for s in samples]
    assert pid_forecast(falling, 4000) is None


def test_a_trend_too_flat_to_reach_pid_max_by_any_date_has_no_forecast() -> None:
    # One PID more over a billion seconds: pid_max lies ~190 million years ahead, past what a date holds
    # (a 10-minute fleet soak found a rounding's worth of slope this way, and ingest raised).
    samples = [PidSample(at(0) + timedelta(seconds=200_000_000 * n), 1000 + (n == 5), n) for n in range(6)]
    assert pid_forecast(samples, 4_194_304) is None
    assert pid_forecast(samples, 1001) is not None  # one PID away: a date it reaches
