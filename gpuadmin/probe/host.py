"""Facts about the host itself: identity, PID budget, kernel and driver."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime

from gpuadmin.probe.procfs import CLOCK_TICKS_PER_SECOND, read_boot_id, read_pid_max

NVIDIA_DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
_DRIVER_VERSION = re.compile(r"\s(\d+\.\d+(?:\.\d+)*)\s")


def read_pids_in_use() -> int | None:
    """Kernel scheduling entities (threads included: each uses a PID of pid_max),
    the number after the slash in /proc/loadavg."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[3].split(b"/")[1])
    except (OSError, IndexError, ValueError):
        return None


def read_boot_time() -> str | None:
    """When the host booted, from btime in /proc/stat, as UTC ISO 8601."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    booted = datetime.fromtimestamp(int(line.split()[1]), UTC)
                    return booted.strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OSError, ValueError):
        return None
    return None


def read_driver_version_file(path: str = NVIDIA_DRIVER_VERSION_FILE) -> str | None:
    """The NVIDIA kernel module's version ("NVRM version: ... Kernel Module  550.54.14  ..."), if loaded."""
    try:
        with open(path, "rb") as f:
            first_line = f.readline().decode("ascii", "replace")
    except OSError:
        return None
    found = _DRIVER_VERSION.search(first_line)
    return found.group(1) if found else None


def host_facts(name: str, *, pids_fallback: int, driver_version: str | None) -> dict[str, object]:
    pids_in_use = read_pids_in_use()
    driver_version = driver_version or read_driver_version_file()
    return {
        "name": name,
        "boot_id": read_boot_id(),
        "pid_max": read_pid_max(),
        "pids_in_use": pids_in_use if pids_in_use is not None else pids_fallback,
        "kernel": os.uname().release[:256],
        "driver_version": driver_version[:64] if driver_version else None,
        "boot_time": read_boot_time(),
        "clock_ticks_per_second": CLOCK_TICKS_PER_SECOND,
        "agent_pid": os.getpid(),
    }
