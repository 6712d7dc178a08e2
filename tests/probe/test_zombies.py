"""A parent that never waits leaves real zombies: the snapshot shows them under it."""

from __future__ import annotations

from tests.probe.helpers import Device, Processes, rows_by_pid, snapshot, state_of, wait_until


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
