"""A parent that never waits leaves real zombies: the snapshot shows them under it. A process
whose main thread exited while others run looks like one in /proc, and is none."""

from __future__ import annotations

import os
import sys

from gpuadmin.probe import procfs
from tests.probe.helpers import WORKLOADS, Device, Processes, rows_by_pid, snapshot, state_of, wait_until


def test_five_zombies_appear_under_their_parent(processes: Processes, device: Device) -> None:
    parent = processes.start("zombie-parent", "5")
    wait_until(lambda: all(state_of(pid) == "Z" for pid in parent.children), "5 children to be zombies")

    document = snapshot(device.glob)
    rows = rows_by_pid(document)

    zombies = [rows[pid] for pid in parent.children]
    assert [z["state"] for z in zombies] == ["Z"] * 5
    assert {z["ppid"] for z in zombies} == {parent.pid}
    assert all(z["reasons"] == ["zombie"] for z in zombies)
    # A zombie has no command line and no memory; only its parent can reap it.
    assert all(z["cmdline"] == [] and z["gpu_memory_bytes"] == {} for z in zombies)
    assert rows[parent.pid]["reasons"] == ["ancestor"]
    assert rows[parent.pid]["state"] != "Z"


def test_zombie_counts_match_the_rows(processes: Processes, device: Device) -> None:
    parent = processes.start("zombie-parent", "5")
    wait_until(lambda: all(state_of(pid) == "Z" for pid in parent.children), "5 children to be zombies")

    document = snapshot(device.glob)

    counts = document["process_counts"]
    zombie_rows = [r for r in document["processes"] if r["state"] == "Z"]
    assert counts["zombies"] == len(zombie_rows) >= 5
    assert counts["omitted"] == counts["total"] - len(document["processes"])
    assert counts["uninterruptible"] == sum(1 for r in document["processes"] if r["state"] == "D")


def test_zombies_are_gone_once_the_parent_is(processes: Processes, device: Device) -> None:
    parent = processes.start("zombie-parent", "5")
    wait_until(lambda: all(state_of(pid) == "Z" for pid in parent.children), "5 children to be zombies")
    parent.process.kill()
    parent.process.wait(timeout=10)
    # Init (or a subreaper) adopts and reaps them: the remedy is always about the parent.
    wait_until(lambda: all(state_of(pid) is None for pid in parent.children), "zombies reaped by init")

    rows = rows_by_pid(snapshot(device.glob))

    assert not set(parent.children) & set(rows)
    assert parent.pid not in rows


def test_a_process_whose_leader_exited_is_no_zombie(processes: Processes, device: Device) -> None:
    # Its main thread exited (pthread_exit): /proc/<pid> shows "Z", no command line and no
    # open file, while another thread runs on with them.
    holder = processes.start("leader-exited", device.path)
    stat = procfs.read_stat(holder.pid)
    assert stat is not None and stat.state == "Z" and stat.num_threads > 1

    document = snapshot(device.glob)
    rows = rows_by_pid(document)

    row = rows[holder.pid]
    assert row["reasons"] == ["device"]
    assert row["device_files"] == [device.path]
    # Its running thread's state: a "Z" would make central refuse to kill it as a zombie.
    assert row["state"] in {"S", "R"}
    assert row["leader_exited"] is True  # central explains its memory: held until the last thread ends
    assert row["cmdline"] == [sys.executable, WORKLOADS, "leader-exited", device.path]
    assert row["exe"] == os.path.realpath(sys.executable)
    zombie_rows = [r for r in document["processes"] if "zombie" in r["reasons"]]
    assert document["process_counts"]["zombies"] == len(zombie_rows)
    assert holder.pid not in {r["pid"] for r in zombie_rows}


def test_a_process_whose_leader_exited_is_a_zombie_once_its_last_thread_has(
    processes: Processes, device: Device
) -> None:
    holder = processes.start("leader-exited", device.path)
    holder.process.kill()  # not reaped: we are its parent and do not wait yet
    wait_until(lambda: (s := procfs.read_stat(holder.pid)) is not None and s.num_threads <= 1,
               "its threads to exit")

    row = rows_by_pid(snapshot(device.glob))[holder.pid]

    assert row["reasons"] == ["zombie"] and row["state"] == "Z"
    assert "leader_exited" not in row
    assert row["cmdline"] == [] and row["device_files"] == []
    stat = procfs.read_stat(holder.pid)
    assert stat is not None and stat.zombie
