"""The fields of one process row, against what the kernel and the system say."""

from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path

from gpuadmin.probe import procfs
from gpuadmin.probe.owners import owner_from_cgroup
from gpuadmin.probe.processes import PAGE_SIZE_BYTES
from tests.probe.conftest import Device
from tests.probe.helpers import Processes, rows_by_pid, snapshot


def test_a_row_matches_the_kernel(processes: Processes, device: Device) -> None:
    holder = processes.start("holder", device.path)
    stat = procfs.read_stat(holder.pid)
    assert stat is not None
    uptime_seconds = float(Path("/proc/uptime").read_text().split()[0])

    row = rows_by_pid(snapshot(device.glob))[holder.pid]

    assert row["ppid"] == os.getpid()
    assert row["start_time_ticks"] == stat.start_time_ticks
    assert row["uid"] == os.getuid()
    assert row["user"] == pwd.getpwuid(os.getuid()).pw_name
    assert row["name"] == stat.comm == Path(sys.executable).name[:15]  # the kernel keeps 15 bytes
    assert row["pgid"] == os.getpgid(holder.pid)
    assert row["sid"] == os.getsid(holder.pid)
    assert row["rss_bytes"] > 0
    assert row["rss_bytes"] % PAGE_SIZE_BYTES == 0
    assert row["kernel_thread"] is False
    assert row["orphaned"] is False
    started_seconds = stat.start_time_ticks / procfs.CLOCK_TICKS_PER_SECOND
    assert 0 <= row["elapsed_seconds"] <= uptime_seconds - started_seconds + 60
    with open(f"/proc/{holder.pid}/cgroup") as f:
        owner = owner_from_cgroup(f.read())
    assert row["owner"] == (owner.as_document() if owner else None)
    assert row["container_id"] == (owner.container_id if owner else None)


def test_kernel_threads_are_flagged(device: Device) -> None:
    document = snapshot(device.glob, include_all=True)
    kernel_threads = [r for r in document["processes"] if r["kernel_thread"]]
    stats = [procfs.read_stat(int(p)) for p in os.listdir("/proc") if p.isdigit()]
    visible = [s for s in stats if s is not None and s.kernel_thread]

    if visible:  # none are visible inside a container's PID namespace
        assert kernel_threads
    for row in kernel_threads:
        assert row["cmdline"] == []
        assert row["orphaned"] is False
