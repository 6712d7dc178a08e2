"""Which processes a snapshot describes in full: holders, zombies and D-state
processes, their ancestors up to PID 1 and their descendants; the rest are counted."""

from __future__ import annotations

import os

from gpuadmin.probe import procfs
from gpuadmin.probe.devices import DeviceScan
from gpuadmin.probe.gpus import GpuProcess
from gpuadmin.probe.procfs import StatFields
from gpuadmin.probe.snapshot import processes_that_matter
from tests.probe.helpers import Device, Processes, rows_by_pid, snapshot


def ancestry(pid: int) -> list[int]:
    chain = []
    stat = procfs.read_stat(pid)
    while stat is not None and stat.ppid > 0:
        chain.append(stat.ppid)
        stat = procfs.read_stat(stat.ppid)
    return chain


def test_a_holder_brings_its_ancestors_to_pid_1_and_its_descendants(
    processes: Processes, device: Device
) -> None:
    holder = processes.start("holder-with-child", device.path)
    (child,) = holder.children
    sibling = processes.start("sleeper")

    rows = rows_by_pid(snapshot(device.glob))

    assert rows[holder.pid]["reasons"] == ["device"]
    assert rows[child]["reasons"] == ["descendant"]
    assert rows[child]["device_files"] == []  # it closed its copy of the file
    chain = ancestry(holder.pid)
    assert chain[0] == os.getpid()
    for pid in chain:
        assert "ancestor" in rows[pid]["reasons"], pid
    assert sibling.pid not in rows  # a child of an ancestor is not a descendant of the holder


def test_include_all_marks_the_rest_as_all(processes: Processes, device: Device) -> None:
    holder = processes.start("holder", device.path)
    bystander = processes.start("sleeper")

    document = snapshot(device.glob, include_all=True)
    rows = rows_by_pid(document)

    assert document["scope"] == "all"
    assert rows[holder.pid]["reasons"] == ["device"]
    assert rows[bystander.pid]["reasons"] == ["all"]
    assert rows[os.getpid()]["reasons"] == ["ancestor"]
    assert document["process_counts"]["omitted"] == 0


# --- on a hand-made table: states a test cannot easily put a real process in ------------


def stat(pid: int, ppid: int, state: str = "S") -> StatFields:
    return StatFields(pid=pid, comm=f"p{pid}", state=state, ppid=ppid, pgid=pid, sid=pid, flags=0,
                      num_threads=1, start_time_ticks=pid, rss_pages=0)


TABLE = {s.pid: s for s in [
    stat(1, 0),
    stat(10, 1),            # sshd
    stat(20, 10),           # a shell
    stat(30, 20, "D"),      # stuck in the kernel (NFS, a hung driver call)
    stat(31, 30),           # its child
    stat(32, 31),           # and grandchild
    stat(40, 20),           # a sibling of the stuck one: not included
    stat(50, 1),            # a trainer holding GPU memory
    stat(51, 50, "Z"),      # its dead DataLoader worker
    stat(60, 1),            # unrelated
]}


def test_reasons_on_a_table() -> None:
    reasons = processes_that_matter(TABLE, DeviceScan(holders={60: ["/dev/nvidia0"]}),
                                    (GpuProcess(50, "GPU-0", 1), GpuProcess(99, "GPU-0", 1)))

    assert reasons == {
        1: ["ancestor"],
        10: ["ancestor"],
        20: ["ancestor"],
        30: ["uninterruptible"],
        31: ["descendant"],
        32: ["descendant"],
        50: ["gpu", "ancestor"],
        51: ["zombie", "descendant"],
        60: ["device"],
    }  # 40 is left out, and PID 99 (not in /proc) is no row
