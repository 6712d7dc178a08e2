"""Workers whose launcher died are orphans, whoever adopts them and whoever leads on.

A launcher forks 3 workers that hold the "device" file. While it lives they
are its children; once it is SIGKILLed they are adopted by PID 1, or by a
child subreaper in another session, and the snapshot marks them orphaned: when
the launcher led their group and session, when it led nothing under a batch
script or torchrun's agent that leads on, and when a shell's job ran it. A
daemon started the classic way (fork, setsid, fork) is adopted too, and is
not an orphan. The shapes are written down in docs/snapshot.md, "Orphans".
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


@pytest.mark.parametrize("shape", ["batch", "script"])
def test_workers_of_a_launcher_that_led_nothing_are_orphaned_while_their_leaders_live(
    processes: Processes, device: Device, shape: str
) -> None:
    """batch: the session and group leader lives on (a Slurm batch script, torchrun's agent whose
    rank died); script: a shell leads the session, its job leads the group (no job control)."""
    job = processes.start("job", device.path, "3", shape, new_session=True)
    launcher_pid, workers = job.report["launcher"], job.report["workers"]
    before = rows_by_pid(snapshot(device.glob))
    assert [before[pid]["orphaned"] for pid in workers] == [False] * 3
    assert before[launcher_pid]["pgid"] != launcher_pid  # it leads no group

    os.kill(launcher_pid, signal.SIGKILL)  # its parent reaps it
    wait_until(lambda: state_of(launcher_pid) is None, "the launcher to be reaped")
    after = rows_by_pid(snapshot(device.glob))

    for pid in workers:
        row = after[pid]
        assert row["ppid"] != launcher_pid
        assert row["sid"] == job.pid and state_of(job.pid) not in (None, "Z")  # the session leader lives
        assert state_of(row["pgid"]) not in (None, "Z")  # so does the group's
        assert (row["pgid"] == job.pid) is (shape == "batch")
        assert row["orphaned"] is True


def test_a_daemon_started_with_fork_setsid_fork_is_adopted_but_not_an_orphan(
    processes: Processes, device: Device
) -> None:
    started = processes.start("daemon", device.path)
    daemon = started.report["daemon"]
    rows = rows_by_pid(snapshot(device.glob))
    row = rows[daemon]
    assert row["ppid"] != started.pid  # adopted: its parent, the session leader, exited on purpose
    assert row["pgid"] == row["sid"] != daemon  # leads nothing
    assert state_of(row["sid"]) is None
    assert row["device_files"] == [device.path]
    assert [rows[pid]["orphaned"] for pid in started.children] == [False, False]  # it and its worker


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


def test_a_service_reparented_to_init_that_leads_its_own_session_is_not_orphaned() -> None:
    service = stat(300, 1)
    assert not is_orphaned(service, table(INIT, service))


def test_a_nohup_job_that_leads_its_group_in_a_gone_shells_session_is_not_orphaned() -> None:
    job = stat(300, 1, pgid=300, sid=50)  # the shell (50) exited; job control made 300 a group leader
    assert not is_orphaned(job, table(INIT, job))


def test_the_classic_daemon_alone_in_its_session_with_its_children_is_not_orphaned() -> None:
    daemon = stat(302, 1, pgid=301, sid=301)  # fork, setsid (301), fork: 301 exited on purpose
    child = stat(303, 302, pgid=301, sid=301)
    grandchild = stat(304, 303, pgid=301, sid=301)
    assert not is_orphaned(daemon, table(INIT, daemon, child, grandchild))


def test_workers_whose_session_leader_is_gone_are_orphaned() -> None:
    workers = [stat(201, 1, pgid=200, sid=200), stat(202, 1, pgid=200, sid=200)]
    assert all(is_orphaned(worker, table(INIT, *workers)) for worker in workers)


def test_a_lone_worker_alone_in_a_gone_launchers_session_reads_as_a_daemon() -> None:
    # The one shape /proc cannot tell from a daemon (docs/snapshot.md): central's history can.
    worker = stat(201, 1, pgid=200, sid=200)
    assert not is_orphaned(worker, table(INIT, worker))


def test_a_worker_whose_launcher_is_a_zombie_is_orphaned() -> None:
    leader = stat(200, 50, state="Z")
    worker = stat(201, 1, pgid=200, sid=200)
    assert is_orphaned(worker, table(INIT, SHELL, leader, worker))


def test_workers_whose_group_and_session_leaders_live_are_orphaned_once_reparented() -> None:
    batch_script = stat(200, 1)  # leads session and group 200, as a Slurm batch script or torchrun's agent
    worker = stat(202, 1, pgid=200, sid=200)  # its launcher (201) was killed
    assert is_orphaned(worker, table(INIT, batch_script, worker))
    script = stat(60, 50, pgid=60, sid=50)  # a script run by a shell, a job of its own
    worker = stat(62, 1, pgid=60, sid=50)  # its launcher (61) was killed
    assert is_orphaned(worker, table(INIT, SHELL, script, worker))


def test_adopted_by_a_subreaper_in_another_session_is_reparented() -> None:
    subreaper = stat(60, 50, pgid=60, sid=50)
    workers = [stat(201, 60, pgid=200, sid=200), stat(202, 60, pgid=200, sid=200)]
    assert is_orphaned(workers[0], table(INIT, SHELL, subreaper, *workers))


def test_a_child_of_a_live_launcher_is_not_orphaned() -> None:
    launcher = stat(200, 50)
    worker = stat(201, 200, pgid=200, sid=200)
    assert not is_orphaned(worker, table(INIT, SHELL, launcher, worker))


def test_a_child_in_its_parents_session_is_not_reparented_even_with_its_group_leader_gone() -> None:
    # `a | b` in a shell where a (the group leader) already exited: b's parent is still the shell.
    pipeline_tail = stat(402, 50, pgid=401, sid=50)
    assert not is_orphaned(pipeline_tail, table(INIT, SHELL, pipeline_tail))


def test_a_parent_chain_that_loops_ends() -> None:
    # Read one by one, reused PIDs could in principle chain into a loop: the walk still ends.
    daemon = stat(302, 1, pgid=301, sid=301)
    looped = [stat(303, 304, pgid=301, sid=301), stat(304, 303, pgid=301, sid=301)]
    assert is_orphaned(daemon, table(INIT, daemon, *looped))


def test_pid_1_kernel_threads_and_leaders_outside_the_namespace_are_never_orphans() -> None:
    kthread = stat(7, 2, pgid=0, sid=0, kernel_thread=True)
    in_container = stat(500, 1, pgid=0, sid=0)  # leaders in the parent PID namespace show as 0
    everything = table(INIT, kthread, in_container)
    assert not is_orphaned(INIT, everything)
    assert not is_orphaned(kthread, everything)
    assert not is_orphaned(in_container, everything)
