"""Facts about the host in every snapshot, checked against the kernel's own files."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuadmin.probe.config import ProbeConfig, ProbeConfigError
from gpuadmin.probe.host import read_driver_version_file
from tests.probe.helpers import Device, Processes, snapshot


def test_host_facts_match_the_kernel(device: Device) -> None:
    host = snapshot(device.glob)["host"]

    assert host["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert host["pid_max"] == int(Path("/proc/sys/kernel/pid_max").read_text())
    assert host["kernel"] == os.uname().release
    assert host["clock_ticks_per_second"] == os.sysconf("SC_CLK_TCK")
    assert host["agent_pid"] == os.getpid()
    btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                 if line.startswith("btime "))
    assert host["boot_time"] == datetime.fromtimestamp(btime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert host["name"] == os.uname().nodename


def test_pids_in_use_counts_threads_too(processes: Processes, device: Device) -> None:
    # Every thread takes a PID from pid_max: 100 threads in one process must show.
    processes.start("threads", "100")

    document = snapshot(device.glob)

    assert document["host"]["pids_in_use"] >= document["process_counts"]["total"] + 90


def test_taken_at_is_utc_with_z_and_the_duration_is_measured(device: Device) -> None:
    before = datetime.now(UTC)
    document = snapshot(device.glob)
    after = datetime.now(UTC)

    taken_at = datetime.strptime(document["taken_at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    assert before <= taken_at <= after
    assert document["probe_duration_seconds"] > 0


def test_host_name_comes_from_the_environment() -> None:
    assert ProbeConfig.from_env({"GPUADMIN_HOST_NAME": "gpu-07.lab"}).host_name == "gpu-07.lab"
    assert ProbeConfig.from_env({}).host_name == os.uname().nodename
    assert ProbeConfig.from_env({"GPUADMIN_HOST_NAME": "gpu-07"}, host_name="gpu-08").host_name == "gpu-08"


@pytest.mark.parametrize("settings", [
    {"host_name": "-leading-dash"},
    {"host_name": "spaces in it"},
    {"host_name": "x" * 254},
    {"gpu_backend": "cuda"},
    {"device_glob": ""},
    {"cmdline_max_bytes": 0},
    {"cmdline_max_bytes": 8193},
])
def test_unusable_settings_are_refused_with_a_message(settings: dict[str, object]) -> None:
    with pytest.raises(ProbeConfigError) as refused:
        ProbeConfig(**{"host_name": "gpu-01", **settings})  # type: ignore[arg-type]
    assert str(refused.value)


def test_driver_version_from_the_kernel_module(tmp_path: Path) -> None:
    proprietary = tmp_path / "proprietary"
    proprietary.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    open_module = tmp_path / "open"
    open_module.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.14  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Thu Feb 22 01:25:25 UTC 2024\n"
    )

    assert read_driver_version_file(str(proprietary)) == "535.104.05"
    assert read_driver_version_file(str(open_module)) == "550.54.14"
    assert read_driver_version_file(str(tmp_path / "absent")) is None
