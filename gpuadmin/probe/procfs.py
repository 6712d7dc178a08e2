"""Direct /proc readers shared by the snapshot and the kill executor.

Reading /proc/<pid>/stat ourselves is several times faster than building a
psutil.Process per PID, and it gives the start time in clock ticks exactly as
the kernel keeps it (field 22), which is what a kill target is identified by.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

# Plain open() throughout, not pathlib: importing pathlib costs the short-lived
# probe CLI a few milliseconds of start-up, and this was the only module on its path using it.
PF_KTHREAD = 0x00200000  # include/linux/sched.h: "I am a kernel thread"
CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
ZOMBIE_STATE = "Z"  # of one thread; whether the process is a zombie is StatFields.zombie
_DELETED_SUFFIX = " (deleted)"


@dataclass(frozen=True, slots=True)
class StatFields:
    """The fields of /proc/<pid>/stat the product uses."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgid: int
    sid: int
    flags: int
    num_threads: int
    start_time_ticks: int
    rss_pages: int

    @property
    def kernel_thread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)

    @property
    def zombie(self) -> bool:
        """The whole process has exited and waits for its parent to reap it.

        State "Z" alone does not say so: it is the state of the thread-group
        leader, which shows "Z" as soon as it exits (pthread_exit) while other
        threads of the process still run, keep its memory (GPU memory too) and
        take its signals (leader_exited). Only a process down to its leader
        alone is a zombie (0 threads while it is being reaped).
        """
        return self.state == ZOMBIE_STATE and self.num_threads <= 1

    @property
    def leader_exited(self) -> bool:
        """Its leader has exited, but other threads still run: alive, though /proc/<pid> looks empty."""
        return self.state == ZOMBIE_STATE and self.num_threads > 1


def parse_stat(text: str) -> StatFields:
    """Parse one /proc/<pid>/stat line.

    comm sits between the first '(' and the *last* ')': a process may name
    itself ") R 1 (" to confuse naive parsers, and users control that name.
    """
    open_paren = text.index("(")
    close_paren = text.rindex(")")
    pid = int(text[:open_paren])
    comm = text[open_paren + 1 : close_paren]
    rest = text[close_paren + 2 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return StatFields(
        pid=pid,
        comm=comm,
        state=rest[0],
        ppid=int(rest[1]),
        pgid=int(rest[2]),
        sid=int(rest[3]),
        flags=int(rest[6]),
        num_threads=int(rest[17]),
        start_time_ticks=int(rest[19]),
        rss_pages=int(rest[21]),
    )


def read_stat(pid: int) -> StatFields | None:
    """The stat fields of a live PID, or None when it is gone."""
    return _read_stat_in(f"/proc/{pid}")


def _read_stat_in(directory: str) -> StatFields | None:
    try:
        with open(f"{directory}/stat", encoding="utf-8", errors="replace") as f:
            return parse_stat(f.read())
    except (FileNotFoundError, ProcessLookupError):
        return None


def other_thread_dirs(pid: int) -> list[str]:
    """/proc/<pid>/task/<tid> of each thread of process ``pid`` but its leader.

    Once the leader has exited while other threads run, the kernel has dropped
    the leader's hold on the process's memory and open files: /proc/<pid>/cmdline
    reads empty, /proc/<pid>/exe and /proc/<pid>/fd show nothing, though the
    process still has them; its other threads' entries show them. The kernel
    lists a thread under /proc/<pid>/task only while it belongs to ``pid``, so
    nothing read there is another process's.
    """
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return []
    return [f"/proc/{pid}/task/{tid}" for tid in tids if tid != str(pid)]


def process_state(stat: StatFields) -> str:
    """The state letter of the process: its leader's, or once the leader has exited, a running thread's.

    A leader that exited shows "Z" for a process that still runs (StatFields.leader_exited);
    what the process is doing (running, sleeping, stuck in D) is what its threads do.
    """
    if not stat.leader_exited:
        return stat.state
    for directory in other_thread_dirs(stat.pid):
        thread = _read_stat_in(directory)
        if thread is not None and thread.state != ZOMBIE_STATE:
            return thread.state
    return stat.state  # its last threads exited meanwhile: a zombie now


KERNEL_STACK_FRAMES_MAX = 16


def wait_channel(stat: StatFields) -> dict[str, object]:
    """What a process in D state waits on: ``wchan``, the kernel function it sleeps in
    (/proc/<pid>/wchan: "0" or empty when the kernel hides it from this reader), and
    ``kernel_stack``, its innermost frames (/proc/<pid>/stack: root only). Each only when read.

    Read from a running thread when the leader has exited: the leader's own entries say nothing.
    """
    directories = [f"/proc/{stat.pid}"]
    if stat.leader_exited:
        directories = [d for d in other_thread_dirs(stat.pid)
                       if (t := _read_stat_in(d)) is not None and t.state != ZOMBIE_STATE][:1]
    found: dict[str, object] = {}
    for directory in directories:
        try:
            with open(f"{directory}/wchan", "rb") as f:
                wchan = f.read(256).decode("ascii", "replace").strip()
        except OSError:
            wchan = ""
        if wchan and wchan != "0":
            found["wchan"] = wchan[:128]
        try:
            with open(f"{directory}/stack", "rb") as f:
                lines = f.read(16384).decode("ascii", "replace").splitlines()
        except OSError:
            lines = []
        frames = [_frame(line) for line in lines[:KERNEL_STACK_FRAMES_MAX]]
        if any(frames):
            found["kernel_stack"] = [frame for frame in frames if frame]
    return found


def _frame(line: str) -> str:
    """``[<0>] nfs_wait_bit_killable+0x1e/0x90 [nfs]`` -> ``nfs_wait_bit_killable [nfs]``."""
    text = line.split("] ", 1)[-1].strip()
    function, _, rest = text.partition("+0x")
    module = rest[rest.find(" ["):].strip() if " [" in rest else ""
    return f"{function} {module}".strip()[:128]


def read_cmdline_bytes(pid: int) -> bytes | None:
    """The raw NUL-separated command line; b"" for kernel threads and zombies; None when gone.

    A process whose leader has exited still runs its command line: it is read
    from one of its other threads (other_thread_dirs), so that its digest stays
    the one a kill target was approved with.
    """
    raw = _read_cmdline_in(f"/proc/{pid}")
    if raw == b"":
        for directory in other_thread_dirs(pid):
            if thread_raw := _read_cmdline_in(directory):
                return thread_raw
    return raw


def _read_cmdline_in(directory: str) -> bytes | None:
    try:
        with open(f"{directory}/cmdline", "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None


def read_executable(pid: int) -> str:
    """The path the kernel executes for ``pid``, even once its leader has exited; OSError when unreadable.

    FileNotFoundError for kernel threads, zombies and PIDs that are gone.
    """
    try:
        path = os.readlink(f"/proc/{pid}/exe")
    except FileNotFoundError:
        found = _executable_of_other_threads(pid)
        if found is None:
            raise
        path = found
    return path.removesuffix(_DELETED_SUFFIX)


def _executable_of_other_threads(pid: int) -> str | None:
    for directory in other_thread_dirs(pid):
        try:
            return os.readlink(f"{directory}/exe")
        except FileNotFoundError:
            continue  # that thread exited meanwhile
    return None


def cmdline_sha256(raw: bytes) -> str:
    """Digest of the full raw command line: the identity a kill target carries,
    computed before any truncation for display."""
    return hashlib.sha256(raw).hexdigest()


def _status_number(pid: int, label: str) -> int | None:
    """The first number on the ``label`` line (e.g. "Uid:") of /proc/<pid>/status; None when gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(label):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def read_uid(pid: int) -> int | None:
    """The real uid, from the Uid: line of /proc/<pid>/status."""
    return _status_number(pid, "Uid:")


def read_boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()


def read_pid_max() -> int:
    with open("/proc/sys/kernel/pid_max", encoding="ascii") as f:
        return int(f.read())


def read_tgid(pid: int) -> int | None:
    """The thread group (process) id that /proc/<pid> belongs to, from the Tgid: line.

    /proc/<tid> answers for any thread id too, though it is hidden from the
    listing; a thread id differs from its Tgid, and kill() on it would hit the
    whole process it belongs to.
    """
    return _status_number(pid, "Tgid:")
