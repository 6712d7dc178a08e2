"""The fields of one process row, against what the kernel and the system say."""

from __future__ import annotations

import os
import pwd
import re
import sys
from pathlib import Path

import pytest

from gpuadmin.probe import procfs
from gpuadmin.probe.processes import PAGE_SIZE_BYTES, container_id_from_cgroup
from tests.probe.conftest import Device
from tests.probe.helpers import Processes, rows_by_pid, snapshot

ID = "4f1c0ab2e3d5c6b7a8f9e0d1c2b3a4f5e6d7c8b9a0f1e2d3c4b5a6f7e8d9c0b1"


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
        cgroup = f.read()
    found = re.findall(r"[0-9a-f]{64}", cgroup)
    assert row["container_id"] == (found[-1] if found else None)


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


@pytest.mark.parametrize(("cgroup", "expected"), [
    (f"12:pids:/docker/{ID}\n0::/docker/{ID}\n", ID),
    (f"0::/system.slice/docker-{ID}.scope\n", ID),
    (f"0::/kubepods.slice/kubepods-burstable-pod1f2e_3d4c.slice/cri-containerd-{ID}.scope\n", ID),
    (f"0::/kubepods/besteffort/pod0c9c8b7a-6f5e-4d3c-2b1a-0f9e8d7c6b5a/{ID}\n", ID),
    (f"0::/machine.slice/libpod-{ID}.scope/container\n", ID),
    (f"0::/kubepods.slice/crio-{ID}.scope\n", ID),
    ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
    ("0::/\n", None),
    (f"0::/docker/{ID}0\n", None),  # 65 hex digits: not an id
])
def test_container_id_from_the_cgroup(cgroup: str, expected: str | None) -> None:
    assert container_id_from_cgroup(cgroup) == expected
