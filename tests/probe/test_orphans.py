"""Workers whose launcher died are orphans, whoever adopts them.

A launcher in its own session forks 3 workers that hold the "device" file.
While it lives they are its children; once it is SIGKILLed they are adopted
by PID 1, or by a child subreaper in another session, and their process-group
and session leader is gone: the snapshot marks them orphaned.
"""

from __future__ import annotations

import os
import signal

import pytest

from gpuadmin.probe.procfs import StatFields
from gpuadmin.probe.snapshot import is_orphaned
from tests.probe.helpers import Device, Processes, Started, rows_by_pid, snapshot, state_of, wait_until


def start_launcher(processes: Processes, device: Device, adopter: str) -> tuple[Started, int]:
    """(the process the test started, the launcher's pid)."""
    if adopter == "subreaper":
        reaper = processes.start("reaper", device.path, "3")
        return reaper, reaper.report["launcher"]
    # start_new_session: the launcher leads its own session and process group, like `setsid torchrun`.
    launcher = processes.start("launcher", device.path, "3", new_session=True)
    return launcher, launcher.pid


def kill_launcher(started: Started, launcher_pid: int) -> None:
    if started.pid == launcher_pid:
        started.process.kill()
        started.process.wait(timeout=10)
    else:
        os.kill(launcher_pid, signal.SIGKILL)  # the reaper (its parent) reaps it
    wait_until(lambda: state_of(launcher_pid) in (None, "Z"), "the launcher to die")


@pytest.mark.parametrize("adopter", ["subreaper", "init"])
def test_workers_of_a_dead_launcher_are_orphaned_device_holders(
    processes: Processes, device: Device, adopter: str
) -> None:
    started, launcher_pid = start_launcher(processes, device, adopter)
    workers = started.children

    before = rows_by_pid(snapshot(device.glob))
    for pid in workers:
        assert before[pid]["device_files"] == [device.path]
        assert before[pid]["ppid"] == launcher_pid
        assert before[pid]["orphaned"] is False
    assert "ancestor" in before[launcher_pid]["reasons"]

    kill_launcher(started, launcher_pid)
    after = rows_by_pid(snapshot(device.glob))

    for pid in workers:
        row = after[pid]
        assert row["ppid"] != launcher_pid
        if adopter == "subreaper":
            assert row["ppid"] == started.pid
        assert row["pgid"] == row["sid"] == launcher_pid  # a leader that no longer exists
        assert row["device_files"] == [device.path]
        assert "device" in row["reasons"]
        assert row["orphaned"] is True
    assert launcher_pid not in after or after[launcher_pid]["state"] == "Z"


# --- the rule itself, on hand-made process tables ---------------------------------


def stat(pid: int, ppid: int, *, pgid: int | None = None, sid: int | None = None, state: str = "S",
         kernel_thread: bool = False) -> StatFields:
    return StatFields(pid=pid, comm="x", state=state, ppid=ppid, pgid=pid if pgid is None else pgid,
                      sid=pid if sid is None else sid, flags=0x00200000 if kernel_thread else 0,
                      num_threads=1, start_time_ticks=pid, rss_pages=0)


def table(*stats: StatFields) -> dict[int, StatFields]:
    return {s.pid: s for s in stats}


INIT = stat(1, 0)
SHELL = stat(50, 1)  # a login shell: leads session 50


def test_a_daemon_reparented_to_init_that_leads_its_own_session_is_not_orphaned() -> None:
    daemon = stat(300, 1)
    assert not is_orphaned(daemon, table(INIT, daemon))


def test_a_worker_whose_session_leader_is_gone_is_orphaned() -> None:
    worker = stat(201, 1, pgid=200, sid=200)
    assert is_orphaned(worker, table(INIT, worker))


def test_a_worker_whose_leader_is_a_zombie_is_orphaned() -> None:
    leader = stat(200, 50, state="Z")
    worker = stat(201, 1, pgid=200, sid=200)
    assert is_orphaned(worker, table(INIT, SHELL, leader, worker))


def test_a_leader_pid_reused_by_another_process_counts_as_gone() -> None:
    stranger = stat(200, 1, pgid=900, sid=900)  # PID 200 again, leading nothing
    worker = stat(201, 1, pgid=200, sid=200)
    assert is_orphaned(worker, table(INIT, stranger, worker))


def test_adopted_by_a_subreaper_in_another_session_is_reparented() -> None:
    subreaper = stat(60, 50, pgid=60, sid=50)
    worker = stat(201, 60, pgid=200, sid=200)
    assert is_orphaned(worker, table(INIT, SHELL, subreaper, worker))


def test_a_child_of_a_live_launcher_is_not_orphaned() -> None:
    launcher = stat(200, 50)
    worker = stat(201, 200, pgid=200, sid=200)
    assert not is_orphaned(worker, table(INIT, SHELL, launcher, worker))


def test_a_child_in_its_parents_session_is_not_reparented_even_with_its_group_leader_gone() -> None:
    # `a | b` in a shell where a (the group leader) already exited: b's parent is still the shell.
    pipeline_tail = stat(402, 50, pgid=401, sid=50)
    assert not is_orphaned(pipeline_tail, table(INIT, SHELL, pipeline_tail))


def test_pid_1_kernel_threads_and_leaders_outside_the_namespace_are_never_orphans() -> None:
    kthread = stat(7, 2, pgid=0, sid=0, kernel_thread=True)
    in_container = stat(500, 1, pgid=0, sid=0)  # leaders in the parent PID namespace show as 0
    everything = table(INIT, kthread, in_container)
    assert not is_orphaned(INIT, everything)
    assert not is_orphaned(kthread, everything)
    assert not is_orphaned(in_container, everything)
