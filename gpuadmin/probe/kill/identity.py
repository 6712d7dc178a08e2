"""Is the process behind a PID still the target of the order, and may it be signalled?

These checks read /proc, which names processes by PID number only. They are
made race-free by the caller: it opens a pidfd *first* and reads /proc while
holding it. A pidfd refers to one process for good; a signal sent through it
reaches that process or fails with ESRCH, never a newcomer that got the same
PID number. If /proc, read after the open, shows the target's start time,
then the process the pidfd refers to is the target (docs/kill-order.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum

from gpuadmin.probe import procfs
from gpuadmin.probe.kill.protected import ProtectedExecutables
from gpuadmin.wire.kill_order import Target
from gpuadmin.wire.kill_protocol import Refusal


class Seen(StrEnum):
    """What /proc says about a target right now."""

    ALIVE = "alive"  # the same process, alive: may be signalled
    GONE = "gone"  # no process with this PID
    ZOMBIE = "zombie"  # the same process, exited, waiting for its parent to reap it (StatFields.zombie)
    REUSED = "reused"  # the PID belongs to a process with another start time
    REFUSED = "refused"  # see refusal


@dataclass(frozen=True, slots=True)
class Observation:
    seen: Seen
    stat: procfs.StatFields | None = None
    refusal: Refusal | None = None
    detail: str = ""


def protected_pids() -> dict[int, tuple[Refusal, str]]:
    """PID 1, the agent process and all its ancestors, each with the reason it is protected.

    Computed once per order: an agent's ancestors can only die (their PIDs then
    stay here, which refuses more, never less), and a new one cannot appear.
    """
    protected: dict[int, tuple[Refusal, str]] = {
        1: (Refusal.PID_1, "PID 1 is init (in a container, the whole container); never signalled"),
    }
    own_pid = os.getpid()
    protected[own_pid] = (Refusal.AGENT, f"PID {own_pid} is the agent itself")
    pid = own_pid
    for _depth in range(4096):  # a ppid chain always ends at 0; the bound only guards a bad read
        stat = procfs.read_stat(pid)
        if stat is None or stat.ppid <= 0:
            break
        pid = stat.ppid
        if pid not in protected:
            parent = procfs.read_stat(pid)
            name = parent.comm if parent else "?"
            protected[pid] = (
                Refusal.AGENT_ANCESTOR,
                f"PID {pid} ({name}) is an ancestor of the agent; killing it would take the agent down",
            )
    return protected


def _is_kernel_thread(stat: procfs.StatFields) -> bool:
    if stat.kernel_thread:
        return True
    # Belt and braces for PF_KTHREAD: a child of kthreadd is a kernel thread.
    # Only when PID 2 really is kthreadd: inside a container PID 2 is a user process.
    if stat.ppid == 2:
        kthreadd = procfs.read_stat(2)
        return kthreadd is not None and kthreadd.kernel_thread
    return False


def describe_parent(ppid: int) -> str:
    parent = procfs.read_stat(ppid)
    return f"{ppid} ({parent.comm})" if parent else str(ppid)


def _not_this_process(target: Target, stat: procfs.StatFields) -> Observation | None:
    """A refusal when the PID is not (or no longer) the target process at all."""
    if _is_kernel_thread(stat):
        return Observation(
            Seen.REFUSED, stat, Refusal.KERNEL_THREAD, f"PID {target.pid} ({stat.comm}) is a kernel thread"
        )
    if stat.start_time_ticks != target.start_time_ticks:
        return Observation(
            Seen.REUSED,
            stat,
            Refusal.IDENTITY_CHANGED,
            f"identity changed: PID {target.pid} now has start time {stat.start_time_ticks}, the target had "
            f"{target.start_time_ticks} (the PID was reused by another process)",
        )
    tgid = procfs.read_tgid(target.pid)
    if tgid is not None and tgid != target.pid:
        return Observation(
            Seen.REFUSED,
            stat,
            Refusal.NOT_A_PROCESS,
            f"{target.pid} is a thread of process {tgid}, not a process; a signal would hit all of {tgid}",
        )
    return None


def _claim_mismatch(target: Target) -> str | None:
    """What differs in uid or command line: "" when nothing, None when the process vanished mid-read."""
    uid = procfs.read_uid(target.pid)
    raw_cmdline = procfs.read_cmdline_bytes(target.pid)
    if uid is None or raw_cmdline is None:
        return None  # vanished between the reads
    if uid != target.uid:
        return f"identity changed: uid is {uid}, the target had {target.uid}"
    if procfs.cmdline_sha256(raw_cmdline) != target.cmdline_sha256:
        return "identity changed: the command line differs from the one approved (digest mismatch)"
    return ""


def observe(target: Target, *, order_boot_id: str, host_boot_id: str,  # noqa: PLR0911 - one check each
            protected_executables: ProtectedExecutables | None = None,
            allowed_uids: frozenset[int] | None = None) -> Observation:
    """Compare the target with what /proc shows for its PID now.

    The order of the checks matters: whether the PID is this process at all
    (boot, start time, process-not-thread) comes before what state it is in
    (zombie), which comes before the agent's protected executables (its executable, read
    while the pidfd is held) and what it claims to be (uid, command line) —
    a zombie has no command line left to compare.

    A process whose leader has exited (pthread_exit) while its other threads
    run is no zombie: it is alive and holds its memory. Its command line is
    read from one of those threads (procfs.read_cmdline_bytes) and compared
    like any other, rather than skipped or taken as matching when empty: the
    digest still tells an exec'd program from the approved one, and ignoring
    it would let a process dodge that check by exiting its main thread.

    ``allowed_uids`` (a self-service order's): the uid /proc shows must be one of them, whatever
    the order's target says; no second admin approved this order, so this is what keeps it to
    the person's own processes even were central tricked into signing it.
    """
    if order_boot_id != host_boot_id:
        return Observation(
            Seen.REFUSED,
            refusal=Refusal.IDENTITY_CHANGED,
            detail=f"identity changed: the order is for boot {order_boot_id}, this host runs boot "
            f"{host_boot_id} (rebooted since, or another host)",
        )
    stat = procfs.read_stat(target.pid)
    if stat is None:
        return Observation(Seen.GONE)
    if (refused := _not_this_process(target, stat)) is not None:
        return refused
    if stat.zombie:
        return Observation(Seen.ZOMBIE, stat)
    if protected_executables is not None and (refused_as := protected_executables.refusal(target.pid)):
        return Observation(Seen.REFUSED, stat, refused_as[0], refused_as[1])
    if allowed_uids is not None:
        uid = procfs.read_uid(target.pid)
        if uid is None:
            return _look_again(target, stat, None)
        if uid not in allowed_uids:
            return Observation(
                Seen.REFUSED, stat, Refusal.NOT_OWN_PROCESS,
                f"a self-service order: PID {target.pid} runs as uid {uid}, not one of the uids it allows "
                f"({', '.join(str(u) for u in sorted(allowed_uids))})",
            )
    mismatch = _claim_mismatch(target)
    if mismatch == "":
        return Observation(Seen.ALIVE, stat)
    return _look_again(target, stat, mismatch)


def _look_again(target: Target, stat: procfs.StatFields, mismatch: str | None) -> Observation:
    """Blame a mismatch on the process only if it is still the same, live one.

    It may have exited between the reads (a zombie's command line is empty),
    or even been reaped and its PID reused.
    """
    again = procfs.read_stat(target.pid)
    if again is None:
        return Observation(Seen.GONE)
    if again.start_time_ticks != target.start_time_ticks:
        return Observation(Seen.REUSED, again, Refusal.IDENTITY_CHANGED, "identity changed: PID reused")
    if again.zombie:
        return Observation(Seen.ZOMBIE, again)
    return Observation(
        Seen.REFUSED, stat, Refusal.IDENTITY_CHANGED, mismatch or "identity changed: /proc unreadable"
    )
