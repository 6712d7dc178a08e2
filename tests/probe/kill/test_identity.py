"""identity.observe's labels, first look and second. The second (identity._look_again):
when the uid or command line differs, /proc is read again, and the target is blamed only
if the PID still holds the same live process.

What the second read can find is arranged with real processes: the look is called with
the first read's fields and a target that the second read then contradicts (a PID
cannot be made to be reused between two reads on demand). The label matters: before a
signal, the executor reports a REUSED PID whose pidfd says "exited" as the target's
exit, and anything REFUSED as a refusal (executor.verified_alive).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from gpuadmin.probe import procfs
from gpuadmin.probe.kill.identity import Seen, _look_again, describe_parent, observe, protected_pids
from gpuadmin.probe.kill.protected import ProtectedExecutables
from gpuadmin.wire.kill_order import Target
from gpuadmin.wire.kill_protocol import Refusal
from tests.probe.kill.helpers import Processes, target_for, wait_until

MISMATCH = "identity changed: uid is 0, the target had 4242"


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A child of this process: it stays a zombie after it dies until the test reaps it."""
    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield popen
    finally:
        popen.kill()
        popen.wait(timeout=30)


def first_read(pid: int) -> procfs.StatFields:
    stat = procfs.read_stat(pid)
    assert stat is not None
    return stat


def test_a_pid_reused_between_the_two_reads_is_seen_as_reused_not_as_a_changed_target(
    processes: Processes,
) -> None:
    newcomer = processes.start("trainer.py")
    seen_first = first_read(newcomer.pid)
    # The target had this PID with an earlier start time; by the second read the PID
    # belongs to a process that started later.
    target = Target(**{**target_for(newcomer.pid), "start_time_ticks": seen_first.start_time_ticks - 1})

    seen = _look_again(target, seen_first, MISMATCH)

    assert seen.seen is Seen.REUSED
    assert seen.refusal is Refusal.IDENTITY_CHANGED
    assert seen.detail == "identity changed: PID reused"
    assert seen.stat is not None and seen.stat.start_time_ticks == newcomer.start_time_ticks
    assert newcomer.alive()


def test_a_target_that_exited_and_was_reaped_between_the_reads_is_gone(
    child: subprocess.Popen[bytes],
) -> None:
    target = Target(**target_for(child.pid))
    seen_first = first_read(child.pid)
    child.kill()
    child.wait(timeout=30)

    seen = _look_again(target, seen_first, MISMATCH)

    assert seen.seen is Seen.GONE
    assert seen.refusal is None


def test_a_target_that_exited_between_the_reads_is_a_zombie_not_a_changed_target(
    child: subprocess.Popen[bytes],
) -> None:
    target = Target(**target_for(child.pid))
    seen_first = first_read(child.pid)
    child.kill()  # not reaped: a zombie, with an empty command line
    wait_until(lambda: first_read(child.pid).state == "Z", what="the child to become a zombie")

    seen = _look_again(target, seen_first, MISMATCH)

    assert seen.seen is Seen.ZOMBIE
    assert seen.refusal is None
    assert seen.stat is not None and seen.stat.start_time_ticks == target.start_time_ticks


@pytest.mark.parametrize(
    ("mismatch", "detail"),
    [(MISMATCH, MISMATCH), (None, "identity changed: /proc unreadable")],
    ids=["claim-differs", "vanished-mid-read"],
)
def test_the_same_live_process_is_refused_with_what_differed(
    processes: Processes, mismatch: str | None, detail: str
) -> None:
    trainer = processes.start("trainer.py")
    target = Target(**target_for(trainer.pid))
    seen_first = first_read(trainer.pid)

    seen = _look_again(target, seen_first, mismatch)

    assert seen.seen is Seen.REFUSED
    assert seen.refusal is Refusal.IDENTITY_CHANGED
    assert seen.detail == detail
    assert seen.stat == seen_first


# The first look (observe): the label it gives decides, before a signal, whether the executor
# reports the target's exit (a REUSED PID whose pidfd says it exited) or a refusal.


def test_a_pid_that_now_has_another_start_time_is_seen_as_reused(processes: Processes) -> None:
    newcomer = processes.start("trainer.py")
    target = Target(**{**target_for(newcomer.pid), "start_time_ticks": newcomer.start_time_ticks - 1})
    boot_id = procfs.read_boot_id()

    seen = observe(target, order_boot_id=boot_id, host_boot_id=boot_id)

    assert seen.seen is Seen.REUSED
    assert seen.refusal is Refusal.IDENTITY_CHANGED
    assert seen.stat is not None and seen.stat.start_time_ticks == newcomer.start_time_ticks
    assert seen.detail == (
        f"identity changed: PID {newcomer.pid} now has start time {newcomer.start_time_ticks}, "
        f"the target had {target.start_time_ticks} (the PID was reused by another process)"
    )


def test_a_kernel_thread_is_seen_as_refused_and_named() -> None:
    kernel_threads = [
        pid
        for pid in (int(entry) for entry in os.listdir("/proc") if entry.isdigit())
        if (stat := procfs.read_stat(pid)) is not None and stat.kernel_thread and pid > 2
    ]
    if not kernel_threads:
        pytest.skip("no kernel thread visible (a PID namespace hides them)")
    target = Target(**target_for(kernel_threads[0]))
    boot_id = procfs.read_boot_id()

    seen = observe(target, order_boot_id=boot_id, host_boot_id=boot_id)

    assert (seen.seen, seen.refusal) == (Seen.REFUSED, Refusal.KERNEL_THREAD)
    assert seen.stat is not None and seen.stat.pid == target.pid
    assert seen.detail == f"PID {target.pid} ({seen.stat.comm}) is a kernel thread"


def test_an_order_for_another_boot_is_refused_before_reading_proc() -> None:
    target = Target(pid=1, start_time_ticks=1, uid=0, user="root", name="init", cmdline_sha256="0" * 64)

    seen = observe(target, order_boot_id="boot-a", host_boot_id="boot-b")

    assert (seen.seen, seen.refusal, seen.stat) == (Seen.REFUSED, Refusal.IDENTITY_CHANGED, None)
    assert seen.detail == (
        "identity changed: the order is for boot boot-a, this host runs boot boot-b "
        "(rebooted since, or another host)"
    )


def test_the_target_itself_is_alive_and_its_fields_come_back(processes: Processes) -> None:
    trainer = processes.start("trainer.py")
    boot_id = procfs.read_boot_id()

    seen = observe(Target(**target_for(trainer.pid)), order_boot_id=boot_id, host_boot_id=boot_id)

    assert (seen.seen, seen.refusal) == (Seen.ALIVE, None)
    assert seen.stat is not None and seen.stat.start_time_ticks == trainer.start_time_ticks


def test_a_protected_executable_is_refused_with_the_process_it_read(processes: Processes) -> None:
    trainer = processes.start("trainer.py")
    boot_id = procfs.read_boot_id()
    executable = procfs.read_executable(trainer.pid)
    protected = ProtectedExecutables(patterns=(re.escape(executable) + "$",))

    seen = observe(Target(**target_for(trainer.pid)), order_boot_id=boot_id, host_boot_id=boot_id,
                   protected_executables=protected)

    assert (seen.seen, seen.refusal) == (Seen.REFUSED, Refusal.PROTECTED_EXECUTABLE)
    assert seen.detail.startswith(f"its executable {executable} is protected on this host")
    assert seen.stat is not None and seen.stat.start_time_ticks == trainer.start_time_ticks


def test_a_self_service_order_refuses_a_process_of_another_uid_naming_both(processes: Processes) -> None:
    trainer = processes.start("trainer.py")
    boot_id = procfs.read_boot_id()
    others = frozenset({os.getuid() + 1000, os.getuid() + 1})

    seen = observe(Target(**target_for(trainer.pid)), order_boot_id=boot_id, host_boot_id=boot_id,
                   allowed_uids=others)

    assert (seen.seen, seen.refusal) == (Seen.REFUSED, Refusal.NOT_OWN_PROCESS)
    assert seen.detail == (f"a self-service order: PID {trainer.pid} runs as uid {os.getuid()}, not one of "
                           f"the uids it allows ({os.getuid() + 1}, {os.getuid() + 1000})")
    assert seen.stat is not None and seen.stat.start_time_ticks == trainer.start_time_ticks
    mine = observe(Target(**target_for(trainer.pid)), order_boot_id=boot_id, host_boot_id=boot_id,
                   allowed_uids=others | {os.getuid()})
    assert (mine.seen, mine.refusal) == (Seen.ALIVE, None)


def test_a_changed_claim_on_the_same_live_process_is_refused_with_the_first_read(
    processes: Processes,
) -> None:
    trainer = processes.start("trainer.py")
    boot_id = procfs.read_boot_id()
    target = Target(**{**target_for(trainer.pid), "uid": 4242})

    seen = observe(target, order_boot_id=boot_id, host_boot_id=boot_id)

    assert (seen.seen, seen.refusal) == (Seen.REFUSED, Refusal.IDENTITY_CHANGED)
    assert seen.detail == f"identity changed: uid is {os.getuid()}, the target had 4242"
    assert seen.stat is not None and seen.stat.pid == trainer.pid


def test_a_pid_with_no_process_is_gone(child: subprocess.Popen[bytes]) -> None:
    target = Target(**target_for(child.pid))
    child.kill()
    child.wait(timeout=30)
    boot_id = procfs.read_boot_id()

    seen = observe(target, order_boot_id=boot_id, host_boot_id=boot_id)

    assert (seen.seen, seen.refusal, seen.stat) == (Seen.GONE, None, None)
    # Its parent, named in a zombie's refusal, is just a number once it has gone too.
    assert describe_parent(child.pid) == str(child.pid)


def test_a_thread_id_is_refused_as_not_a_process() -> None:
    started = threading.Event()
    stop = threading.Event()
    thread = threading.Thread(target=lambda: (started.set(), stop.wait(30)))
    thread.start()
    try:
        started.wait(30)
        assert thread.native_id is not None
        target = Target(**target_for(thread.native_id))
        boot_id = procfs.read_boot_id()

        seen = observe(target, order_boot_id=boot_id, host_boot_id=boot_id)
    finally:
        stop.set()
        thread.join(30)

    assert (seen.seen, seen.refusal) == (Seen.REFUSED, Refusal.NOT_A_PROCESS)
    assert seen.stat is not None and seen.stat.pid == thread.native_id
    assert seen.detail.startswith(f"{thread.native_id} is a thread of process {os.getpid()}, not a process")


def test_protected_pids_are_init_the_agent_and_its_ancestors_named() -> None:
    protected = protected_pids()

    assert protected[1] == (
        Refusal.PID_1, "PID 1 is init (in a container, the whole container); never signalled"
    )
    assert protected[os.getpid()] == (Refusal.AGENT, f"PID {os.getpid()} is the agent itself")
    parent = first_read(os.getppid())
    if os.getppid() != 1:
        assert protected[os.getppid()] == (
            Refusal.AGENT_ANCESTOR,
            f"PID {os.getppid()} ({parent.comm}) is an ancestor of the agent; "
            "killing it would take the agent down",
        )
    assert 0 not in protected
    assert all(pid > 0 for pid in protected)


# A process whose main thread exited (pthread_exit) while another runs on: /proc shows its
# leader "Z" and an empty command line at /proc/<pid>/cmdline, yet it is alive.


def test_a_process_whose_leader_exited_is_alive_and_keeps_its_command_line(processes: Processes) -> None:
    program = processes.start("leader_exits.py")
    boot_id = procfs.read_boot_id()
    target = Target(**{**target_for(program.pid), "cmdline_sha256": program.started_cmdline_sha256()})

    seen = observe(target, order_boot_id=boot_id, host_boot_id=boot_id)

    assert (seen.seen, seen.refusal) == (Seen.ALIVE, None)
    assert seen.stat is not None and seen.stat.state == "Z" and seen.stat.num_threads > 1
    assert not seen.stat.zombie
    # Its command line is read from its running thread: what it was started with.
    assert target_for(program.pid)["cmdline_sha256"] == program.started_cmdline_sha256()


def test_a_process_whose_leader_exited_is_still_held_to_its_command_line(processes: Processes) -> None:
    program = processes.start("leader_exits.py")
    boot_id = procfs.read_boot_id()
    target = Target(**{**target_for(program.pid), "cmdline_sha256": procfs.cmdline_sha256(b"other\0")})

    seen = observe(target, order_boot_id=boot_id, host_boot_id=boot_id)

    assert (seen.seen, seen.refusal) == (Seen.REFUSED, Refusal.IDENTITY_CHANGED)
    assert seen.detail == "identity changed: the command line differs from the one approved (digest mismatch)"


def test_a_process_whose_leader_exited_is_a_zombie_once_its_last_thread_has(processes: Processes) -> None:
    program = processes.start("leader_exits.py")
    target = Target(**target_for(program.pid))
    os.kill(program.pid, signal.SIGKILL)  # not reaped: we are its parent and do not wait yet
    wait_until(lambda: first_read(program.pid).num_threads <= 1, what="its threads to exit")
    boot_id = procfs.read_boot_id()

    seen = observe(target, order_boot_id=boot_id, host_boot_id=boot_id)

    assert (seen.seen, seen.refusal) == (Seen.ZOMBIE, None)
    assert seen.stat is not None and seen.stat.zombie and not seen.stat.leader_exited
